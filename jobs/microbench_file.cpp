// The microbenchmark's inputs from a user's tensor file (see microbench_file.hpp): the checks, each a
// UsageError naming the file and the tensor, then the values as doubles (exact for every format read).
#include "jobs/microbench_file.hpp"

#include <cmath>
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
  return in;
}

}  // namespace

FileInputs read_microbench_file(const std::string& path, bool backward, const std::string& key) {
  try {
    return read_checked(path, backward);
  } catch (const Error& e) {  // every refusal (the reader's, HDF5's, the checks') with the key in front
    throw UsageError(key + ": " + e.what(), e.hint().empty() ? kHint : e.hint());
  }
}

}  // namespace fastudy
