// The microbenchmark's inputs from a user's tensor file (see microbench_file.hpp): the checks, each a
// UsageError naming the file and the tensor, then the values as doubles (exact for every format read).
#include "jobs/microbench/file.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "base/error.hpp"
#include "src/io/tensor_file.hpp"

namespace fastudy {
namespace {

const char* const kHint = "save the tensors q, k, v (and do, the gradient of O, for the backward pass), each of shape "
                          "[B, H, N, d] in fp64, fp32, fp16 or bf16, with safetensors, h5py or torch.save";

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// "[b, h, n, t]" of element i of a tensor of `shape`.
std::string index_text(std::uint64_t i, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> at(shape.size());
  for (std::size_t a = shape.size(); a-- > 0;) {
    at[a] = static_cast<std::int64_t>(i % static_cast<std::uint64_t>(shape[a]));
    i /= static_cast<std::uint64_t>(shape[a]);
  }
  return shape_text(at);
}

}  // namespace

namespace {

// The user's outputs present in the file (kFileOutputs), checked: a floating-point tensor of a format
// fastudy reads, o, dq, dk, dv of q's shape in one format and finite, lse [B, H, N] without NaN.
template <class Bad>
void read_outputs(const io::TensorFile& file, const std::vector<std::int64_t>& q_shape, FileInputs& in, Bad bad) {
  const std::vector<std::int64_t> lse_shape(q_shape.begin(), q_shape.begin() + 3);
  std::string format_tensor;  // the first of o, dq, dk, dv: the one whose format the others must have
  for (const char* name : kFileOutputs) {
    const io::TensorEntry* t = file.find(name);
    if (t == nullptr) continue;
    const std::string n = name;
    const bool is_lse = n == "lse";
    if (!t->format)
      throw bad("tensor '" + n + "' holds " + t->stored_type +
                " values; fastudy reads fp64, fp32, fp16 and bf16 (F64, F32, F16, BF16)");
    const std::vector<std::int64_t>& want = is_lse ? lse_shape : q_shape;
    if (t->shape != want)
      throw bad("tensor '" + n + "' has shape " + shape_text(t->shape) + "; with q of shape " + shape_text(q_shape) +
                " it must be " + shape_text(want) + (is_lse ? " (one log-sum-exp per row)" : " (an output of attention)"));
    if (!is_lse) {
      if (!in.output_format) {
        in.output_format = *t->format;
        format_tensor = n;
      } else if (*t->format != *in.output_format) {
        throw bad("tensor '" + n + "' holds " + t->stored_type + " values and '" + format_tensor + "' " +
                  in.stored_types[format_tensor] + ": the outputs of one kernel share its format");
      }
    }
    std::vector<double> values(t->elements);
    file.read(*t, values.data());
    for (std::uint64_t i = 0; i < values.size(); ++i) {
      const bool nan = std::isnan(values[i]);
      if (nan || (!is_lse && !std::isfinite(values[i])))
        throw bad("tensor '" + n + "' holds " + (nan ? "NaN" : "an infinity") + " at " + index_text(i, t->shape) +
                  "; the microbenchmark compares finite outputs" + (is_lse ? "" : " (an lse may be +-inf)"));
    }
    in.stored_types[n] = t->stored_type;
    (n == "o" ? in.o : n == "lse" ? in.lse : n == "dq" ? in.dq : n == "dk" ? in.dk : in.dv) = std::move(values);
  }
}

// The checks of read_microbench_file; its errors name the file (as the reader's do, "'FILE': ...").
FileInputs read_checked(const std::string& path, bool backward) {
  const io::TensorFile file = io::TensorFile::open(path);
  auto bad = [&](const std::string& what) -> UsageError { return UsageError("'" + path + "': " + what, kHint); };
  FileInputs in;
  in.path = path;
  const std::vector<std::int64_t>* q_shape = nullptr;
  for (const char* name : kFileTensors) {
    const io::TensorEntry* t = file.find(name);
    const bool needed = std::string(name) != "do" || backward;
    if (t == nullptr) {
      if (!needed) continue;
      std::string present;
      for (const auto& e : file.tensors()) present += (present.empty() ? "" : ", ") + e.name;
      throw bad(std::string("no tensor '") + name + "'" +
                (std::string(name) == "do" ? " (the backward pass needs do, the gradient of O)" : "") +
                "; the file holds " + (present.empty() ? "no tensor" : present));
    }
    if (!t->format) {
      throw bad(std::string("tensor '") + name + "' holds " + t->stored_type +
                " values; fastudy reads fp64, fp32, fp16 and bf16 (F64, F32, F16, BF16)");
    }
    if (t->shape.size() != 4) {
      throw bad(std::string("tensor '") + name + "' has shape " + shape_text(t->shape) + " (rank " +
                std::to_string(t->shape.size()) + "); attention's inputs are [B, H, N, d] (rank 4)");
    }
    for (std::int64_t dim : t->shape)
      if (dim < 1) throw bad(std::string("tensor '") + name + "' has shape " + shape_text(t->shape) + ": a dimension is 0");
    if (q_shape == nullptr) {
      q_shape = &t->shape;
    } else if (t->shape != *q_shape) {
      throw bad(std::string("tensor '") + name + "' has shape " + shape_text(t->shape) + ", q has " +
                shape_text(*q_shape) + ": q, k, v and do must have the same shape [B, H, N, d]");
    }
    std::vector<double> values(t->elements);
    file.read(*t, values.data());
    for (std::uint64_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) {
        throw bad(std::string("tensor '") + name + "' holds " + (std::isnan(values[i]) ? "NaN" : "an infinity") +
                  " at " + index_text(i, t->shape) + "; the microbenchmark measures finite inputs");
      }
    }
    in.stored_types[name] = t->stored_type;
    const std::string n = name;
    (n == "q" ? in.values.q : n == "k" ? in.values.k : n == "v" ? in.values.v : in.values.dout) = std::move(values);
  }
  in.batch = (*q_shape)[0];
  in.heads = (*q_shape)[1];
  in.seq_len = (*q_shape)[2];
  in.head_dim = (*q_shape)[3];
  read_outputs(file, *q_shape, in, bad);
  return in;
}

}  // namespace

FileShape microbench_file_shape(const std::string& path, const std::string& key) {
  try {
    const io::TensorFile file = io::TensorFile::open(path);
    const io::TensorEntry* q = file.find("q");
    if (q == nullptr) throw UsageError("'" + path + "': no tensor 'q'", kHint);
    if (q->shape.size() != 4 || *std::min_element(q->shape.begin(), q->shape.end()) < 1)
      throw UsageError("'" + path + "': tensor 'q' has shape " + shape_text(q->shape) +
                           "; attention's inputs are [B, H, N, d] with no empty dimension",
                       kHint);
    return FileShape{q->shape[0], q->shape[1], q->shape[2], q->shape[3]};
  } catch (const Error& e) {
    throw UsageError(key + ": " + e.what(), e.hint().empty() ? kHint : e.hint());
  }
}

FileInputs read_microbench_file(const std::string& path, bool backward, const std::string& key) {
  try {
    return read_checked(path, backward);
  } catch (const Error& e) {  // every refusal (the reader's, HDF5's, the checks') with the key in front
    throw UsageError(key + ": " + e.what(), e.hint().empty() ? kHint : e.hint());
  }
}

namespace {

// x's place in fp32's order (monotone in x, +0 and -0 the same, inf the step after the largest finite
// value): the fp32 ulp distance of two values is the difference of their places.
std::int64_t fp32_order(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::int64_t magnitude = static_cast<std::int64_t>(u & 0x7FFFFFFFu);
  return (u >> 31) ? -magnitude : magnitude;
}

// values against the reading's, element by element: the fraction bit-identical in `format` (both exact
// in it, so equal doubles with equal signs are equal bits) and the largest distance in its ulps (lse:
// fp32, where +-inf are allowed; elsewhere a non-finite value of the reading is +inf ulps away).
MicrobenchRow::TensorAgreement agreement(const std::vector<double>& values, const std::vector<double>& reading,
                                         Format format, bool lse) {
  MicrobenchRow::TensorAgreement a;
  std::size_t same = 0;
  double worst = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const bool equal = std::memcmp(&values[i], &reading[i], sizeof(double)) == 0;
    same += equal;
    if (equal) continue;
    double ulps;
    if (lse) ulps = static_cast<double>(std::llabs(fp32_order(static_cast<float>(values[i])) -
                                                   fp32_order(static_cast<float>(reading[i]))));
    else if (!std::isfinite(reading[i])) ulps = std::numeric_limits<double>::infinity();
    else ulps = static_cast<double>(ulp_distance(format, values[i], reading[i]));
    worst = std::max(worst, ulps);
  }
  a.bit_identical = values.empty() ? 1.0 : static_cast<double>(same) / static_cast<double>(values.size());
  a.max_ulp = worst;
  return a;
}

}  // namespace

std::optional<MicrobenchRow> microbench_file_row(const MicrobenchRun& run, const FileInputs& in) {
  const bool forward = run.point.pass == Pass::forward;
  const Format stored = forward ? run.policy.o : run.policy.grad;
  const bool any = forward ? (!in.o.empty() || !in.lse.empty()) : (!in.dq.empty() || !in.dk.empty() || !in.dv.empty());
  if (!any || (in.output_format && *in.output_format != stored)) return std::nullopt;
  // The tensors of the metrics in the golden value's order (O; or dQ, dK, dV), those the file holds.
  const std::size_t n = run.q.size();
  std::vector<double> values, golden, reading;
  auto part = [&](const std::vector<double>& file_values, std::size_t offset) {
    if (file_values.empty()) return;
    values.insert(values.end(), file_values.begin(), file_values.end());
    golden.insert(golden.end(), run.golden.begin() + static_cast<std::ptrdiff_t>(offset),
                  run.golden.begin() + static_cast<std::ptrdiff_t>(offset + n));
    reading.insert(reading.end(), run.flash.values.begin() + static_cast<std::ptrdiff_t>(offset),
                   run.flash.values.begin() + static_cast<std::ptrdiff_t>(offset + n));
  };
  if (forward) {
    part(in.o, 0);
  } else {
    part(in.dq, 0);
    part(in.dk, n);
    part(in.dv, 2 * n);
  }
  MicrobenchRow row = microbench_row(run, "file", values, golden, AttentionStats{});
  if (values.empty()) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    row.max_abs = row.mean_abs = row.std_abs = row.rel_l2 = row.rmse = row.mean_signed = row.max_ulp = nan;
  }
  row.tiles_kv = 0;
  row.vs_reading = run.point.policy + " flash";
  const MicrobenchRow::TensorAgreement all = agreement(values, reading, stored, false);
  row.bit_identical = values.empty() ? std::numeric_limits<double>::quiet_NaN() : all.bit_identical;
  row.max_ulp_vs = values.empty() ? std::numeric_limits<double>::quiet_NaN() : all.max_ulp;
  auto compare = [&](const std::vector<double>& file_values, std::size_t offset, MicrobenchRow::TensorAgreement& out) {
    if (file_values.empty()) return;
    const std::vector<double> mine(run.flash.values.begin() + static_cast<std::ptrdiff_t>(offset),
                                   run.flash.values.begin() + static_cast<std::ptrdiff_t>(offset + n));
    out = agreement(file_values, mine, stored, false);
  };
  if (forward) {
    compare(in.o, 0, row.o);
    if (!in.lse.empty()) row.lse = agreement(in.lse, run.flash.lse, Format::fp32, true);
  } else {
    compare(in.dq, 0, row.dq);
    compare(in.dk, n, row.dk);
    compare(in.dv, 2 * n, row.dv);
  }
  return row;
}

}  // namespace fastudy
