// One point of the numeric microbenchmark (the paper's Fig. 2-6 measurements, forward and backward):
// seeded inputs, flash and baseline in the point's format and policy, each against the fp64 golden
// result and against each other. The microbench job (jobs/) sweeps points over MPI ranks and writes
// the rows; this library only computes them, deterministically from the point alone.
//
// B batch, H heads, N sequence (seq_len), d head dim (head_dim); tensors are [B, H, N, d].
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/fa2_launch.hpp"
#include "kernels/format.hpp"

namespace fastudy {

// Which pass of attention a point measures: the forward (O) or the backward (dQ, dK, dV).
enum class Pass : std::uint8_t { forward, backward };
inline constexpr Pass kAllPasses[] = {Pass::forward, Pass::backward};
std::string_view to_string(Pass p);  // "forward", "backward"
std::optional<Pass> parse_pass(std::string_view name);

// Where a point's Q, K, V come from: drawn by generate_values (normal, uniform, outliers), normal with
// an attention sink (sink, see microbench_inputs), k keys sharing each row's largest logit (repeated_max,
// see microbench_inputs), captured from a layer of the study's own model (captured), or read from a file
// a user's framework wrote (file: Q, K, V and dO). For captured and file the caller passes them; see
// prepare_microbench_point.
enum class InputDistribution : std::uint8_t { normal, uniform, outliers, sink, repeated_max, captured, file };
inline constexpr InputDistribution kAllInputDistributions[] = {
    InputDistribution::normal,       InputDistribution::uniform,  InputDistribution::outliers, InputDistribution::sink,
    InputDistribution::repeated_max, InputDistribution::captured, InputDistribution::file};
// "normal", "uniform", "outliers", "sink", "repeated_max", "captured", "file"
std::string_view to_string(InputDistribution d);
std::optional<InputDistribution> parse_input_distribution(std::string_view name);

struct MicrobenchPoint {
  Pass pass = Pass::forward;
  Format format = Format::fp32;
  std::string policy = "fa2";  // a reading (a row of kReadings) or a custom policy's name
  // The rounding mode every step of the policy uses; unset: the policy's own (nearest for a reading).
  std::optional<Rounding> rounding;
  int seq_len = 256, head_dim = 64, block_q = 32, block_kv = 32;
  // Where block_q/block_kv came from: 0 and "" when given directly, else the SRAM size M (elements)
  // and the rule of paper_tiles() they were derived with (recorded in the CSV only).
  int sram = 0;
  std::string tile_rule;
  LoopOrder loop_order = LoopOrder::q_outer;
  // Launch::pytorch: the fa2 reading runs PyTorch's FlashAttention-2 launch for a GPU of sm_count SMs
  // (kernels/fa2_launch.hpp; block_q and block_kv then record the launch's tiles for the point's pass).
  Launch launch = Launch::blocks;
  int sm_count = kHopperSmCount;
  bool causal = false;
  int trial = 0;
  int batch = 1, heads = 2;
  InputDistribution distribution = InputDistribution::normal;
  double outlier_fraction = 0.001, outlier_scale = 10.0;  // FA3's recipe (see generate_values)
  double sink_logit = 10.0;  // sink: the scaled logit of key 0 for every query (see microbench_inputs);
                             // repeated_max: the logit the repeated keys share
  int repeated_keys = 4;     // repeated_max: how many keys share each row's largest logit
  std::uint64_t seed = 7;
};

// The paper's tile rules (Fig. 6; FlashAttention-1, Algorithm 1) for an SRAM of M elements and head
// dim d, before clipping to seq_len:
//   paper    B_c = ceil(M / 4d) (block_kv), B_r = min(ceil(M / 4d), d) (block_q)
//   swapped  the two rules exchanged: B_r = ceil(M / 4d), B_c = min(ceil(M / 4d), d) (Fig. 6a,
//            "swapping the order of the block dimensions": more KV tiles when ceil(M / 4d) > d)
//   square   B_r = B_c = ceil(M / 4d) (Fig. 6b: the paper's B_c for both, so the number of KV tiles
//            and of rescales is the paper rule's)
// Returns {block_q, block_kv}; throws Error for an unknown rule or M, d < 1.
std::pair<int, int> paper_tiles(int sram, int head_dim, const std::string& rule);
// "paper, swapped, square"
std::string tile_rule_names();

// One result row. algorithm: "flash" (flash vs the fp64 golden), "baseline" (baseline vs golden) or
// "flash_vs_baseline" (flash vs baseline, same format). The differences d = result - reference are
// taken over every element of O (forward) or of dQ, dK, dV concatenated (backward):
//   max_abs = max |d|, mean_abs = mean |d|, std_abs = standard deviation of |d| (population),
//   rel_l2 = ||d||_2 / ||reference||_2 (the reference: golden, or baseline for flash_vs_baseline),
//   rmse = sqrt(mean d^2) (FA3's measure), mean_signed = mean d (the bias; 0 for unbiased errors),
//   max_ulp = max |d| / (u_format * max |reference|): the largest error in units of the point's
//            format's unit roundoff (format.hpp) times the output's magnitude; about 1 means one
//            rounding of the largest output value (0 when the reference is all zeros).
// repeated_max_rows is the point's, the same on its three rows: the fraction of query rows (over
// B*H*N, causal keys only) whose maximum score is attained by two or more keys, the scores taken as
// the format stores them: S = (q . k) * scale in fp64 on the rounded inputs, then rounded to the
// baseline policy's s format (the S a framework stores) once in its rounding mode (stochastic: random bits from a hash of the point's
// rounding seed and the score's index; an ideal accumulator, so the kernels' own S may differ by
// their accumulation error).
// rescales_per_row and tiles_kv are the flash kernel's (AttentionStats) on flash rows, 0 and 1 on
// baseline rows.
//
// Rows of other algorithms on the same inputs (the microbench job adds them, see docs/microbench.md "Real kernels"):
// "cuda_flash" / "cuda_baseline" (our CUDA kernels, kernels/cuda/microbench_cuda.hpp) and "sdpa_flash",
// "sdpa_efficient", "sdpa_cudnn", "sdpa_math" (LibTorch's scaled_dot_product_attention, policy "native").
// Rows of LibTorch's own ops on the CPU (src/train/microbench_torch.hpp): "torch_baseline",
// "torch_baseline_before", "torch_flash" (kRealCode below), on the point's own inputs and policy.
// The agreement columns compare a row of real code with the reading that claims to model it, on the same
// inputs, element by element in the point's format ("-", 0, 0 on every other row; set_agreement):
//   vs_reading     the reading and kind compared with ("eager flash": the policy's flash kernel);
//   bit_identical  the fraction of output elements whose bits equal the reading's;
//   max_ulp_vs     the largest difference in units in the last place of the format (ulp_distance).
// The check columns hold the CUDA rows' comparison with our CPU kernel of the same kind (check "-" and
// vs_cpu = check_bound = 0 on every other row):
//   check        "bit-identical" (the host twin promises equality and it holds), "DIFFERS" (promised,
//                not equal), "within bound" (no promise; vs_cpu <= check_bound), "EXCEEDS BOUND";
//   vs_cpu       max |CUDA - CPU| (forward) or the rel_l2 of CUDA against CPU (backward);
//   check_bound  the bound vs_cpu is held to where bit identity is not promised (0 where it is).
struct MicrobenchRow {
  std::string algorithm;
  MicrobenchPoint point;
  Rounding rounding = Rounding::nearest;  // the mode the policy ran with
  double max_abs = 0, mean_abs = 0, std_abs = 0, rel_l2 = 0;
  double rmse = 0, mean_signed = 0, max_ulp = 0;
  double repeated_max_rows = 0;
  double rescales_per_row = 0;
  std::int64_t tiles_kv = 0;
  std::string check = "-";
  double vs_cpu = 0, check_bound = 0;
  std::string vs_reading = "-";
  double bit_identical = 0, max_ulp_vs = 0;
  // The "file" row (a user's outputs read with the inputs, distribution = "file"): per output tensor the
  // fraction of elements bit-identical with the reading's and the largest difference in ulps (O, dQ, dK,
  // dV in the point's format, lse in fp32); NaN where the tensor is not compared (not in the file, or not
  // an output of the point's pass: o and lse on forward points, dq, dk and dv on backward ones).
  struct TensorAgreement {
    double bit_identical = std::numeric_limits<double>::quiet_NaN();
    double max_ulp = std::numeric_limits<double>::quiet_NaN();
  };
  TensorAgreement o, lse, dq, dk, dv;
};

// Real code a microbenchmark row can run beside the emulated readings (docs/microbench.md "Real kernels"), one
// entry each: the row's algorithm; where it runs ("cpu": LibTorch's ops, jobs/microbench_torch;
// "cuda": LibTorch's SDPA, jobs/microbench_sdpa); the kind of attention it computes, so the reading's
// kernel of that kind is what it is compared with; the reading that claims to model it ("" when none
// does: then it is compared with no reading); and what it runs. A new framework algorithm is one row
// here and its code in the jobs layer; the report and `fastudy --help` list them from the rows.
struct RealCode {
  std::string_view algorithm;
  std::string_view device;
  AttentionKind kind;
  std::string_view reading;
  std::string_view code;
  // Where the code applies the softmax scale (ScalePlacement): the reading's framework kinds (baseline,
  // framework flash loops) are run with the same placement when they are compared with this code.
  ScalePlacement scale = ScalePlacement::fused;
};
inline constexpr RealCode kRealCode[] = {
    {"torch_baseline", "cpu", AttentionKind::baseline, "eager",
     "softmax((Q K^T) * scale) V as PyTorch users write it (nanoGPT): torch::matmul, a multiply by the scale as "
     "a Python float, torch::softmax, torch::matmul, on the format's tensors on the CPU; backward by autograd",
     ScalePlacement::after},
    {"torch_baseline_before", "cpu", AttentionKind::baseline, "eager",
     "softmax((Q * scale) K^T) V: the scale applied to Q before torch::matmul (the order of the FlashAttention "
     "tests' attention_ref, which divides q by sqrt(d)); otherwise as torch_baseline",
     ScalePlacement::before},
    {"torch_flash", "cpu", AttentionKind::flash, "eager",
     "FlashAttention-2 (q_outer) as a loop of LibTorch ops on the format's tensors on the CPU: per Q block and "
     "KV tile S = (Q_i K_j^T) * scale, running max, exp, rescale alpha, running sum and O, final division; "
     "backward: FA-2's Algorithm 2 as ops (KV tiles outer, P from the saved lse)",
     ScalePlacement::after},
    {"sdpa_flash", "cuda", AttentionKind::flash, "fa2",
     "LibTorch's scaled_dot_product_attention, flash backend (the FlashAttention-2 CUDA kernel); autograd"},
    {"sdpa_efficient", "cuda", AttentionKind::flash, "",
     "LibTorch's scaled_dot_product_attention, memory-efficient backend (xFormers' CUDA kernel); autograd"},
    {"sdpa_cudnn", "cuda", AttentionKind::flash, "",
     "LibTorch's scaled_dot_product_attention, cuDNN backend (cuDNN's fused attention); autograd"},
    {"sdpa_math", "cuda", AttentionKind::baseline, "",
     "LibTorch's scaled_dot_product_attention, math backend (composite LibTorch ops on the GPU); autograd"},
};
// The entry of `algorithm`, or null.
const RealCode* find_real_code(std::string_view algorithm);
// The names of the entries on `device` ("cpu" or "cuda"), comma separated.
std::string real_code_names(std::string_view device);

// Sets row's agreement columns (see MicrobenchRow): `values` (the real code's output) against `reading`
// (the reading's output on the same inputs, element by element), in the point's format; `reading_name`
// names it ("eager flash"). Throws Error when the sizes differ.
void set_agreement(MicrobenchRow& row, const std::vector<double>& values, const std::vector<double>& reading,
                   const std::string& reading_name);

// Whether a real kernel's error reproduces an emulated reading's, by FlashAttention's rule (its tests:
// "FlashAttention's numerical error is at most twice the numerical error of a Pytorch implementation",
// max|out - out_ref| <= 2 max|out_pt - out_ref|, out_ref the upcast reference) applied in both
// directions: the real kernel's error at most twice the reading's (the rule, the reading as the
// reference implementation) and the reading's at most twice the real kernel's (a reading that
// overstates the error by more than 2x does not reproduce it either). Errors against the same fp64
// golden value, same metric. Two zero errors agree; one zero and one not do not.
enum class Within2x { within, real_larger, reading_larger };
Within2x within_2x(double real_error, double reading_error);
// "within 2x", "real > 2x reading", "reading > 2x real".
std::string_view to_string(Within2x v);

// The stochastic-rounding seed of a point: a hash of microbench_seed(point), so it depends on the
// point alone (never on the MPI rank that computes it; a point runs whole on one rank, head_offset 0).
std::uint64_t microbench_rounding_seed(const MicrobenchPoint& point);

// The fraction of query rows whose maximum score is attained by >= 2 keys (see MicrobenchRow), on
// inputs as the kernels hold them.
double repeated_max_fraction(const AttentionShape& shape, const PrecisionPolicy& policy, std::uint64_t rounding_seed,
                             const double* q, const double* k);

// The seed of a point's inputs: a hash of (seed, trial, seq_len, head_dim, distribution) only, so
// every format, policy, block size, loop order and MPI rank sees the same inputs.
std::uint64_t microbench_seed(const MicrobenchPoint& point);

// n values from rng, with transforms of our own (not std::*_distribution, whose output differs
// between standard libraries): normal N(0, 1) by Box-Muller on 53-bit uniforms; uniform on
// [-sqrt 3, sqrt 3) (unit variance, like normal); outliers: FA3's recipe N(0, 1) + N(0, s^2) *
// Bernoulli(p), s = outlier_scale, p = outlier_fraction (FA3's defaults p = 0.001, s = 10, i.e.
// N(0, 100)): mean 0, variance 1 + p s^2. sink generates normal values (the sink is made by
// microbench_inputs). captured and file values are not drawn (Error).
void generate_values(std::mt19937_64& rng, InputDistribution distribution, double outlier_fraction,
                     double outlier_scale, double* out, std::size_t n);

// The point's unrounded fp64 inputs, in generation order Q, K, V, dO (dO is what the backward pass
// propagates), each [B, H, N, d]. distribution "sink" (attention sinks: one key that every query
// attends to strongly) generates normal values, then in every head sets component 0 of every query
// to 1, component 0 of every key but key 0 to 0, and key 0 to sink_logit * sqrt(d) * e_0: with the
// default scale 1/sqrt(d) key 0's logit is exactly sink_logit for every query, while the others keep
// the normal logits of d - 1 components (mean 0, variance (d - 1) / d). distribution "repeated_max"
// (Qiu & Yao, arXiv 2510.04212: repeated row maxima with mostly negative values bias bf16 attention)
// is "sink" with keys 0 to repeated_keys - 1 (clipped to N) all equal to the sink key, so that they
// share each row's largest logit, sink_logit (exactly, in every format: the same products), and V drawn
// as N(-1, 1) (84% of the values negative).
struct MicrobenchInputs {
  std::vector<double> q, k, v, dout;
};
MicrobenchInputs microbench_inputs(const MicrobenchPoint& point);
// The attention shape of a point (B, H, N, d, causal).
AttentionShape microbench_shape(const MicrobenchPoint& point);

// The relative cost of run_microbench_point(point), for balancing points over ranks: every part
// (the fp64 golden value, baseline, flash) is O(B H N^2 d); the backward pass adds the reference
// backward and both kinds' backward to the forward runs (about 4x the forward's work on this CPU).
double microbench_cost(const MicrobenchPoint& point);

// Runs one point: the three rows above. The policies are make_reading(point.policy, point.format)
// (one per kind) unless `policies` gives a resolved custom one's. Inputs are rounded to the flash
// policy's input formats of q, k, v (and its grad for dO; both kinds share them: input_format, so
// unrounded where the kernel quantizes them itself) first, and the golden fp64 reference runs on
// those values. Kernels run on float buffers when every step of both policies is fp32 or narrower,
// on double buffers otherwise.
// `threads` is passed to the kernels (AttentionParams::threads). A point of distribution "captured"
// takes its Q, K, V from `captured` (each B*H*N*d values: see capture_attention_inputs in src/train)
// and a normal dO from its seed; one of distribution "file" takes Q, K, V and, when it holds one, dO
// from `captured` (jobs/microbench/file.hpp reads them), otherwise a normal dO from its seed.
//
// `keep`, when given, receives the point's prepared inputs, golden value and CPU kernel results, for
// algorithms run on the same inputs and checked against them (MicrobenchRun).
struct MicrobenchRun;
std::vector<MicrobenchRow> run_microbench_point(const MicrobenchPoint& point,
                                                const std::optional<ReadingPolicies>& policies = std::nullopt,
                                                int threads = 1, const MicrobenchInputs* captured = nullptr,
                                                MicrobenchRun* keep = nullptr);

// One kernel's outputs: O and lse of the forward pass, and `values` (O, or dQ|dK|dV on a backward
// point) as the row compares them.
struct MicrobenchKernelOutput {
  std::vector<double> o, lse, values;
  AttentionStats stats;
};

// A point prepared for its algorithms: the policies it runs (the point's rounding applied; `policy`
// is the flash kind's, `baseline_policy` the baseline's), the inputs rounded to the flash policy's
// input formats of q, k, v and grad (as every kernel holds them), the fp64 golden value
// on them (O, or dQ|dK|dV), the repeated-max fraction, and the CPU kernels' outputs where they ran.
struct MicrobenchRun {
  MicrobenchPoint point;
  PrecisionPolicy policy, baseline_policy;
  const PrecisionPolicy& policy_of(AttentionKind kind) const {
    return kind == AttentionKind::flash ? policy : baseline_policy;
  }
  AttentionShape shape;
  AttentionParams params;  // the CPU kernels' (tiles, loop order, seed); `attention` set per kind
  bool float_buffers = true;  // the CPU kernels ran on float (every step fp32 or narrower)
  std::vector<double> q, k, v, dout, golden;
  double repeated_max_rows = 0;
  MicrobenchKernelOutput flash, baseline;  // empty until the CPU kernels ran
};

// Sets row's check columns (see MicrobenchRow) from `values` against our CPU kernel's `cpu`: with
// `promised`, "bit-identical" or "DIFFERS" (check_bound 0); otherwise "within bound" or "EXCEEDS
// BOUND" against `bound`. vs_cpu is max |d| (forward points) or rel_l2 (backward points).
void set_cpu_check(MicrobenchRow& row, const std::vector<double>& values, const std::vector<double>& cpu, bool promised,
                   double bound);

// The inputs and golden value of a point (no kernel runs): what run_microbench_point starts from.
MicrobenchRun prepare_microbench_point(const MicrobenchPoint& point, const std::optional<ReadingPolicies>& policies,
                                       int threads, const MicrobenchInputs* captured);

// The output (O, or dQ|dK|dV on a backward point) of `reading`'s CPU kernel of `kind` on run's inputs,
// with tiles block_q x block_kv and `order`: what a real kernel of that kind is compared with, on a point
// prepared for another policy (the inputs must be exact in the reading's q, k, v and grad formats: as for
// every reading at run's format). Throws Error for an unknown reading.
std::vector<double> reading_values(const MicrobenchRun& run, std::string_view reading, AttentionKind kind,
                                   int block_q, int block_kv, LoopOrder order);
// The same for a policy: `policy`'s kernel of `kind` on run's inputs with the point's own tiles and loop
// order (a reading's baseline with another scale placement, beside the real code that places it so).
std::vector<double> policy_values(const MicrobenchRun& run, const PrecisionPolicy& policy, AttentionKind kind);

// A row of `algorithm` from its values against `reference` (the golden value, or another kernel's),
// with the point's metrics (max_ulp in the point's format, repeated_max_rows) and `stats`.
MicrobenchRow microbench_row(const MicrobenchRun& run, const std::string& algorithm, const std::vector<double>& values,
                             const std::vector<double>& reference, const AttentionStats& stats);

}  // namespace fastudy
