// LibTorch's own ops on the CPU as microbenchmark rows (the kRealCode entries of device "cpu",
// kernels/microbench.hpp): the framework baseline as PyTorch users write it (torch_baseline: (Q K^T) *
// scale; torch_baseline_before: (Q * scale) K^T) and FlashAttention-2 written as a loop of LibTorch ops
// (torch_flash), on a point's inputs as tensors of the point's format, each against the fp64 golden
// value and beside the reading that claims to model it (columns vs_reading, bit_identical, max_ulp_vs).
// Part of fastudy-main only (LibTorch; fastudy-lite and the kernels library stay free of it).
// docs/microbench.md "Real kernels".
//
// B batch, H heads, N sequence, d head dim; tensors are [B, H, N, d].
#pragma once

#include <string>
#include <vector>

#include "kernels/microbench.hpp"

namespace fastudy {

// Whether LibTorch runs attention in format f on the CPU: fp64, fp32 and bf16. Debian's LibTorch 1.13
// has no fp16 matmul on the CPU ("addmm_impl_cpu_" not implemented for 'Half'), and tf32 and fp8 are no
// CPU tensor types; `why` says so for those.
bool torch_cpu_runs(Format f, std::string* why);

// The outputs of a CPU framework algorithm on a prepared point: O (forward) or dQ|dK|dV (backward) as
// the row compares them, and the tiles it ran (torch_flash: the point's; the baseline: one tile).
struct TorchAttention {
  std::vector<double> values;
  AttentionStats stats;
};

// `algorithm` (torch_baseline, torch_baseline_before or torch_flash) on run's inputs (run.q, run.k,
// run.v and run.dout as tensors of the point's format: exact, as every reading stores Q, K, V and dO in
// it), with the default scale 1/sqrt(d) passed as a double, as a Python float is. torch_flash takes the
// point's block_q and block_kv and needs loop order q_outer; its backward is FlashAttention-2's
// Algorithm 2 written as LibTorch ops (not autograd through the forward's loop), from its own forward's
// O and lse. The baselines' backward is LibTorch's autograd. Throws UsageError for a format LibTorch
// cannot run on the CPU, an algorithm that is not a CPU one, or torch_flash at kv_outer.
TorchAttention torch_attention(const MicrobenchRun& run, const std::string& algorithm);

// Where LibTorch's CPU rows run, for the outputs' notes: "LibTorch 1.13.0 (CPU capability AVX2,
// Intel(R) MKL-DNN v2.6.3) on Intel(R) Xeon(R) Processor" (LibTorch's own build description and the
// CPU's model name; what decides its kernels' summation orders).
std::string torch_cpu_machine();

// Which FrameworkOps LibTorch's CPU kernels run on bf16 tensors (kernels/attention.hpp), probed once on
// LibTorch itself: the softmax scale's scalar, the softmax backward's row dot and the GEMM of P V.
FrameworkOps torch_cpu_ops();

// The row of `algorithm`: torch_attention against the golden value, with its agreement with the
// reading's kernel of the same kind on the same inputs (run.flash or run.baseline: they must have run),
// named "<policy> <kind>". `values` and `reading`, when given, receive the code's output and that
// reading's, as the row compares them (OUT/microbench_outputs.h5).
MicrobenchRow microbench_torch_row(const MicrobenchRun& run, const std::string& algorithm,
                                   std::vector<double>* values = nullptr, std::vector<double>* reading = nullptr);

}  // namespace fastudy
