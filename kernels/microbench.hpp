// One point of the numeric microbenchmark (the paper's Fig. 2-6 measurements, forward and backward):
// seeded inputs, flash and baseline in the point's format and policy, each against the fp64 golden
// result and against each other. The microbench job (jobs/) sweeps points over MPI ranks and writes
// the rows; this library only computes them, deterministically from the point alone.
//
// B batch, H heads, N sequence (seq_len), d head dim (head_dim); tensors are [B, H, N, d].
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/format.hpp"

namespace fastudy {

struct MicrobenchPoint {
  std::string pass = "forward";  // forward | backward
  Format format = Format::fp32;
  std::string policy = "mixed";  // a preset name (pure, mixed) or a custom policy's name
  int seq_len = 256, head_dim = 64, block_q = 32, block_kv = 32;
  LoopOrder loop_order = LoopOrder::q_outer;
  bool causal = false;
  int trial = 0;
  int batch = 1, heads = 2;
  std::string distribution = "normal";  // normal | uniform | outliers
  double outlier_fraction = 0.01, outlier_scale = 20.0;
  std::uint64_t seed = 7;
};

// One result row. algorithm: "flash" (flash vs the fp64 golden), "baseline" (baseline vs golden) or
// "flash_vs_baseline" (flash vs baseline, same format). The differences d are taken over every
// element of O (forward) or of dQ, dK, dV concatenated (backward):
//   max_abs = max |d|, mean_abs = mean |d|, std_abs = standard deviation of |d| (population),
//   rel_l2 = ||d||_2 / ||reference||_2 (the reference: golden, or baseline for flash_vs_baseline).
// rescales_per_row and tiles_kv are the flash kernel's (AttentionStats) on flash rows, 0 and 1 on
// baseline rows.
struct MicrobenchRow {
  std::string algorithm;
  MicrobenchPoint point;
  double max_abs = 0, mean_abs = 0, std_abs = 0, rel_l2 = 0;
  double rescales_per_row = 0;
  std::int64_t tiles_kv = 0;
};

// "normal, uniform, outliers"
std::string distribution_names();

// The seed of a point's inputs: a hash of (seed, trial, seq_len, head_dim, distribution) only, so
// every format, policy, block size, loop order and MPI rank sees the same inputs.
std::uint64_t microbench_seed(const MicrobenchPoint& point);

// n values from rng, with transforms of our own (not std::*_distribution, whose output differs
// between standard libraries): normal N(0, 1) by Box-Muller on 53-bit uniforms; uniform on
// [-sqrt 3, sqrt 3) (unit variance, like normal); outliers: normal, with each value multiplied by
// outlier_scale with probability outlier_fraction.
void generate_values(std::mt19937_64& rng, const std::string& distribution, double outlier_fraction,
                     double outlier_scale, double* out, std::size_t n);

// The point's unrounded fp64 inputs, in generation order Q, K, V, dO (dO is what the backward pass
// propagates), each [B, H, N, d].
struct MicrobenchInputs {
  std::vector<double> q, k, v, dout;
};
MicrobenchInputs microbench_inputs(const MicrobenchPoint& point);
// The attention shape of a point (B, H, N, d, causal).
AttentionShape microbench_shape(const MicrobenchPoint& point);

// Runs one point: the three rows above. The policy is make_policy(point.policy, point.format) unless
// `policy` gives a resolved custom one. Inputs are rounded to the policy's q, k, v (and grad for dO)
// formats first, and the golden fp64 reference runs on those rounded values. Kernels run on float
// buffers when every step of the policy is fp32 or narrower, on double buffers otherwise.
// `threads` is passed to the kernels (AttentionParams::threads).
std::vector<MicrobenchRow> run_microbench_point(const MicrobenchPoint& point,
                                                const std::optional<PrecisionPolicy>& policy = std::nullopt,
                                                int threads = 1);

}  // namespace fastudy
