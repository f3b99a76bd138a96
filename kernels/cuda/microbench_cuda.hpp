// Our CUDA attention kernels as algorithms of the microbenchmark (kernels/microbench.hpp): on the
// inputs of a point whose CPU kernels ran, "cuda_flash" and "cuda_baseline" rows against the fp64
// golden value, each checked against our CPU kernel of the same kind (MicrobenchRow's check columns).
// Torch-free; host code compiled against the CUDA runtime headers (fastudy_kernels_cuda).
//
// What is promised (kernels/cuda/tile_reference.hpp, tests/gpu): the device kernels equal their host
// twin bit for bit (O, dQ, dK, dV; lse only within an ulp, logf), and the host twin equals the CPU
// kernels bit for bit when those ran on float buffers with an FMA instruction set (attention_isa_name()
// not "generic") and the policy's products are not tensor-core products (on a GPU the fp16/bf16 readings
// with an fp32 accumulator multiply as mma.sync does, the CPU kernels in fp32 FMA chains). So where
// all hold the check is bit identity; elsewhere the CUDA result must lie within twice the check
// harness's bound (kernels/check.hpp: both results are within the bound of the
// golden value, so their difference is within twice it): max |d| <= 2 forward_bound on forward points,
// rel_l2 <= 2 backward_bound on backward points.
//
// Backward points run the device's backward from the CPU forward's O and lse (the device lse may
// differ from the host's in the last bit), so the comparison is of the backward kernels alone.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kernels/microbench.hpp"

namespace fastudy::cuda {

// Whether bit identity with the CPU kernels is promised for this run's kind (see above).
bool cpu_bit_identity_promised(const MicrobenchRun& run, AttentionKind kind);

// The two rows (cuda_flash, cuda_baseline) of a run filled by run_microbench_point(..., keep). The
// policies must be ones the CUDA kernels run (a reading kReadings marks .cuda, of fp32, fp16 or bf16,
// rounding to nearest): UsageError otherwise. Runs on the current CUDA device.
// `values`, when given, receives each row's output under its algorithm's name (OUT/microbench_outputs.h5).
std::vector<MicrobenchRow> microbench_cuda_rows(const MicrobenchRun& run,
                                                std::map<std::string, std::vector<double>>* values = nullptr);

}  // namespace fastudy::cuda
