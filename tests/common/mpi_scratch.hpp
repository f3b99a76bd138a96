// Helpers shared by the MPI tests (tests/runtime, tests/io; main: mpi_main.cpp): a scratch directory
// every rank of the world sees, small TrainStates with known contents, and the environment for a
// helper program started as its own singleton job.
#pragma once

#include <filesystem>
#include <string>
#include <vector>
#include <unistd.h>

extern char** environ;

#include "src/core/train_state.hpp"
#include "src/runtime/mpi.hpp"

namespace fastudy::testing_mpi {

// A fresh directory under the build tree, the same path on every rank of `comm` (collective).
inline std::string scratch_dir(const mpi::Comm& comm, const std::string& name) {
  std::string dir;
  if (comm.is_root()) {
    dir = std::string(FASTUDY_BINARY_DIR) + "/mpi-test-tmp/" + name + "-" + std::to_string(::getpid());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  comm.bcast(dir);
  return dir;
}

inline NamedArray make_array(const std::string& name, std::vector<std::int64_t> shape, DType dtype,
                             std::uint32_t seed) {
  NamedArray a;
  a.name = name;
  a.shape = std::move(shape);
  a.dtype = dtype;
  a.data.resize(static_cast<std::size_t>(a.numel()) * dtype_size(dtype));
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : a.data) {  // xorshift bytes: every bit pattern, NaNs and infinities included
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<std::byte>(x >> 24);
  }
  return a;
}

// A state shaped like a small transformer's: matrices, vectors, a scalar, an empty tensor.
inline TrainState make_state(std::int64_t step, std::uint32_t seed = 1) {
  TrainState s;
  s.step = step;
  s.data_cursor = step * 3;
  s.loss_scale = 32768.0;
  s.good_steps = 17;
  s.params.push_back(make_array("tok_emb.weight", {64, 32}, DType::f32, seed + 1));
  s.params.push_back(make_array("blocks.0.attn.qkv.weight", {96, 32}, DType::f32, seed + 2));
  s.params.push_back(make_array("blocks.0.attn.qkv.bias", {96}, DType::f32, seed + 3));
  s.params.push_back(make_array("blocks.0.ln.gain", {3}, DType::f32, seed + 4));  // fewer rows than 4 ranks
  s.params.push_back(make_array("head.weight", {5, 4, 3}, DType::f64, seed + 5));
  s.params.push_back(make_array("a.scalar", {}, DType::f32, seed + 6));
  s.optimizer.push_back(make_array("tok_emb.weight.exp_avg", {64, 32}, DType::f32, seed + 7));
  s.optimizer.push_back(make_array("empty", {0, 8}, DType::f32, seed + 8));
  s.extra.push_back(make_array("rng.cpu", {5000}, DType::u8, seed + 9));
  s.extra.push_back(make_array("rng.step", {2}, DType::i64, seed + 10));
  for (int i = 0; i < step; ++i) s.loss_history.push_back(4.0 / (1 + i) + 1e-17 * i);
  s.attrs["variant"] = "flash-bf16-s1";
  s.attrs["axis.attention"] = "flash";
  s.attrs["config_hash"] = "0123456789abcdef";
  s.attrs["note"] = "utf-8: \xce\xbc, commas, \"quotes\"";
  return s;
}

// The environment without the variables mpirun sets, so the child starts as its own singleton job.
inline std::vector<std::string> clean_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    if (v.rfind("OMPI_COMM_WORLD", 0) == 0 || v.rfind("OMPI_MCA_orte", 0) == 0 || v.rfind("OMPI_MCA_ess", 0) == 0 ||
        v.rfind("OMPI_MCA_pmix", 0) == 0 || v.rfind("PMIX_", 0) == 0 || v.rfind("OMPI_FILE_LOCATION", 0) == 0 ||
        v.rfind("OMPI_UNIVERSE_SIZE", 0) == 0 || v.rfind("OMPI_APP_CTX", 0) == 0 || v.rfind("OMPI_FIRST_RANKS", 0) == 0 ||
        v.rfind("OMPI_NUM_APP_CTX", 0) == 0 || v.rfind("OMPI_ARGV", 0) == 0 || v.rfind("OMPI_COMMAND", 0) == 0) {
      continue;
    }
    env.push_back(v);
  }
  return env;
}

}  // namespace fastudy::testing_mpi
