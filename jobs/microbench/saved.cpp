// OUT/microbench_outputs.h5 (see microbench_saved.hpp): created collectively, written point by point by
// the rank that computed it, committed and sealed by rank 0.
#include "jobs/microbench/saved.hpp"

#include <cstdio>
#include <filesystem>

#include "base/atomic_file.hpp"
#include "base/checksum.hpp"
#include "base/error.hpp"

namespace fastudy {
namespace {

std::string point_group(std::size_t index) {
  char name[32];
  std::snprintf(name, sizeof name, "points/%06zu", index);
  return name;
}

bool backward(const MicrobenchPoint& p) { return p.pass == Pass::backward; }

// The output tensors of a pass, in the order the rows concatenate them.
std::vector<std::string> output_names(const MicrobenchPoint& p) {
  return backward(p) ? std::vector<std::string>{"dq", "dk", "dv"} : std::vector<std::string>{"o"};
}

std::vector<std::string> input_names(const MicrobenchPoint& p) {
  return backward(p) ? std::vector<std::string>{"q", "k", "v", "do"} : std::vector<std::string>{"q", "k", "v"};
}

std::vector<std::int64_t> dims_of(const MicrobenchPoint& p) {
  return {p.batch, p.heads, p.seq_len, p.head_dim};
}

// A failed write of the file as an Error naming it, its file system's free space and what to do.
[[noreturn]] void write_failed(const std::string& path, const std::string& why) {
  throw Error("cannot write " + path + ": " + why + file_system_note(path),
              "free space on that file system (or choose another --out) and run again");
}

}  // namespace

std::uint64_t saved_outputs_bytes(const std::vector<SavedPoint>& points) {
  constexpr std::uint64_t kGroupMeta = 4096, kDatasetMeta = 1024;
  std::uint64_t bytes = kGroupMeta;
  for (const SavedPoint& sp : points) {
    const MicrobenchPoint& p = sp.point;
    const std::uint64_t n = static_cast<std::uint64_t>(p.batch) * p.heads * p.seq_len * p.head_dim;
    const std::uint64_t datasets = input_names(p).size() + sp.algorithms.size() * output_names(p).size();
    bytes += datasets * (n * sizeof(double) + kDatasetMeta) + (1 + sp.algorithms.size()) * kGroupMeta;
  }
  return bytes;
}

SavedOutputs::~SavedOutputs() {
  if (finished_) return;
  if (file_ && world_.size() > 1) file_->abandon();
  file_.reset();
  std::error_code ec;
  std::filesystem::remove(tmp_, ec);
}

SavedOutputs::SavedOutputs(const std::string& path, const std::vector<SavedPoint>& points, const Provenance& prov,
                           mpi::Comm& world)
    : path_(path), world_(world), points_(points) {
  if (world_.rank() == 0) tmp_ = temporary_path(path_);
  world_.bcast(tmp_);
  file_.emplace(h5::File::create(tmp_, &world_));
  h5::Group root = file_->root();
  root.set_attr("format", std::string("fastudy-microbench-outputs/1"));
  root.set_attr("provenance", prov.header());
  root.set_attr("config_hash", prov.config_hash);
  root.create_group("points");
  for (std::size_t i = 0; i < points_.size(); ++i) {
    const MicrobenchPoint& p = points_[i].point;
    h5::Group g = root.create_group(point_group(i));
    g.set_attr("sweep", points_[i].sweep);
    g.set_attr("pass", std::string(to_string(p.pass)));
    g.set_attr("format", std::string(to_string(p.format)));
    g.set_attr("policy", p.policy);
    g.set_attr("rounding", std::string(p.rounding ? to_string(*p.rounding) : "the policy's own"));
    g.set_attr("distribution", std::string(to_string(p.distribution)));
    g.set_attr("loop_order", std::string(to_string(p.loop_order)));
    for (const auto& [name, value] : {std::pair<const char*, std::int64_t>{"seq_len", p.seq_len},
                                      {"head_dim", p.head_dim}, {"block_q", p.block_q}, {"block_kv", p.block_kv},
                                      {"causal", p.causal ? 1 : 0}, {"trial", p.trial}, {"batch", p.batch},
                                      {"heads", p.heads}})
      g.set_attr(name, value);
    for (const auto& name : input_names(p)) g.create_dataset(name, DType::f64, dims_of(p));
    for (const auto& alg : points_[i].algorithms) {
      h5::Group a = g.create_group(alg);
      for (const auto& name : output_names(p)) a.create_dataset(name, DType::f64, dims_of(p));
    }
  }
}

void SavedOutputs::write(std::size_t index, const SavedValues& values) {
  try {
    write_point(index, values);
  } catch (const h5::H5Error& e) {
    write_failed(path_, e.details());
  }
}

void SavedOutputs::write_point(std::size_t index, const SavedValues& values) {
  const SavedPoint& sp = points_.at(index);
  const MicrobenchPoint& p = sp.point;
  const h5::Transfer independent(*file_, false);
  h5::Group g = file_->root().open_group(point_group(index));
  const std::size_t n = static_cast<std::size_t>(p.batch) * p.heads * p.seq_len * p.head_dim;
  const std::vector<const std::vector<double>*> inputs{&values.q, &values.k, &values.v, &values.dout};
  const std::vector<std::string> in_names = input_names(p);
  for (std::size_t t = 0; t < in_names.size(); ++t) {
    if (inputs[t]->size() != n) {
      throw Error("microbench: the input " + in_names[t] + " of point " + std::to_string(index) + " has " +
                  std::to_string(inputs[t]->size()) + " values, not " + std::to_string(n) + ", so " + path_ +
                  " cannot be written");
    }
    g.open_dataset(in_names[t]).write_rows(inputs[t]->data(), 0, p.batch, independent);
  }
  const std::vector<std::string> out_names = output_names(p);
  for (const auto& alg : sp.algorithms) {
    const auto it = values.outputs.find(alg);
    if (it == values.outputs.end() || it->second.size() != out_names.size() * n) {
      throw Error("microbench: the outputs of " + alg + " at point " + std::to_string(index) + " are missing or of " +
                  "the wrong size, so " + path_ + " cannot be written");
    }
    h5::Group a = g.open_group(alg);
    for (std::size_t t = 0; t < out_names.size(); ++t)
      a.open_dataset(out_names[t]).write_rows(it->second.data() + t * n, 0, p.batch, independent);
  }
}

void SavedOutputs::finish(bool keep) {
  std::string failure;
  try {
    file_->close();
  } catch (const h5::H5Error& e) {
    failure = e.details();
  }
  file_.reset();
  const bool failed = world_.allreduce_max(static_cast<std::int64_t>(!failure.empty())) != 0;
  finished_ = true;
  if (world_.rank() == 0) {
    if (keep && !failed) {
      commit_sealed(tmp_, path_);
    } else {
      std::error_code ec;
      std::filesystem::remove(tmp_, ec);
    }
  }
  if (failed) write_failed(path_, failure.empty() ? "another rank could not close it" : failure);
}

}  // namespace fastudy
