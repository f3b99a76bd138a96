// Attention kernels on the CPU in any number format: the fp64 reference (golden), baseline
// (S = QK^T*scale materialised, softmax, P.V) and flash (tiled online softmax, FA-1 and FA-2 loop
// orders), forward and backward. This header is the kernel interface used by the microbenchmark, the
// trainer and the tests; it stays free of LibTorch.
//
// Shapes: B batch, H heads, N sequence, d head dim. Every tensor is contiguous row-major [B, H, N, d];
// lse (log-sum-exp of each softmax row, natural log, scaled scores) is [B, H, N].
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <optional>

#include "kernels/format.hpp"

namespace fastudy {

enum class AttentionKind : std::uint8_t { baseline, flash };
std::string_view to_string(AttentionKind k);
std::optional<AttentionKind> parse_attention_kind(std::string_view name);

// How the flash kind is built: a property of the reading, chosen in the one dispatch place
// (kernels/detail/dispatch.hpp), never a set of independent switches.
//   framework  FlashAttention written as a loop of framework ops (FA-1 kv_outer, FA-2 q_outer; the op
//              decomposition in kernels/detail/attention_impl.hpp): S = s(Q K^T * scale) per tile,
//              exp of S - m, the tile's P rounded before its row sum, KV tiles first to last.
//   fa2        the FlashAttention-2 CUDA kernel (Dao-AILab/flash-attention csrc/flash_attn/src,
//              flash_fwd_kernel.h, flash_bwd_kernel.h, softmax.h): S an fp32 register tile never
//              rounded, the scale folded into exp2 (exp2f(S * scale_log2 - m * scale_log2), one FMA),
//              the row sum of the unrounded P kept per MMA lane and all-reduced over the quad at the
//              end, P rounded only as the A operand of P.V, KV blocks visited last to first, O
//              multiplied by 1/l, lse = m * scale + log(l). Backward: P recomputed the same way, dS
//              from the unrounded P, row blocks last to first, dQ added tile by tile.
//   fa3        the FlashAttention-3 Hopper kernel (hopper/): fa2's arithmetic where it is the same;
//              its own lse (m * (scale_log2 * ln 2) + log l), a zero row sum giving O = 0, row blocks
//              first to last in the backward, and the FP8 path: Q, K, V quantized with scales
//              (`quantization`, `incoherent`), P = exp2(... + 8) in [0, 256] (Max_offset) rounded to
//              the fp8 format.
enum class FlashKernel : std::uint8_t { framework, fa2, fa3 };
std::string_view to_string(FlashKernel k);
std::optional<FlashKernel> parse_flash_kernel(std::string_view name);

// Where the baseline (framework attention: S materialised) applies the softmax scale 1/sqrt(d):
//   fused   S = s(Q K^T * scale): inside the matmul op, one rounding (torch.baddbmm(alpha=scale),
//           cuBLAS's alpha).
//   after   S = s(s(Q K^T) * scale): the matmul's output rounded, then a multiplication op rounds
//           again, `(q @ k.transpose(-2, -1)) * scale` (nanoGPT, minGPT, most user code).
//   before  S = s(q(Q * scale) K^T): Q scaled and rounded first, `(q * scale) @ k.T` (PyTorch 1.13's
//           SDPA math path _scaled_dot_product_attention_math, flash-attn's tests' attention_ref).
// The backward pass is the autograd of the same ops. The framework flash loops (FlashKernel::framework)
// apply it as this says too (`eager`'s flash: after, as `(q @ k.T) * scale` in a re-implementation);
// fa2/fa3 fold it into exp2, whatever this says.
enum class ScalePlacement : std::uint8_t { fused, after, before };
inline constexpr ScalePlacement kAllScalePlacements[] = {ScalePlacement::fused, ScalePlacement::after,
                                                         ScalePlacement::before};
std::string_view to_string(ScalePlacement s);
std::optional<ScalePlacement> parse_scale_placement(std::string_view name);

// How the framework's ops treat a reduced format (framework kinds only: the baseline and the framework
// flash loops), measured on LibTorch's own ops (src/train/microbench_torch.cpp probes which one it runs):
//   opmath         every op computes in fp32 and rounds its output once: a Python scalar (the softmax
//                  scale) multiplies in fp32 and the softmax backward keeps its row dot sum(dY * Y) in
//                  fp32 (PyTorch's CUDA kernels, accscalar_t / opmath_t). What the readings model.
//   libtorch1_cpu  LibTorch 1.x's CPU kernels on bf16 tensors: the scalar is first converted to the
//                  tensor's dtype (aten/src/ATen/native/cpu/BinaryOpsKernel.cpp mul_kernel: a wrapped
//                  scalar takes the common dtype; `x * s` == round(x * bf16(s)) on every value tried),
//                  and the softmax backward rounds its row dot to the format before subtracting it
//                  (aten/src/ATen/native/cpu/SoftMaxKernel.cpp _vec_host_softmax_backward_lastdim:
//                  (dY - bf16(sum dY * Y)) * Y on every value tried). Its bf16 matmuls run in
//                  oneDNN's GEMM (fp32 accumulators), which it picks on CPUs with AVX-512 (BW, VL, DQ)
//                  for products of more than 16^3 multiply-adds (batch included); smaller ones take
//                  the cpublas path below even there, which this mode does not model.
//   libtorch1_cpublas  as libtorch1_cpu, on a CPU without those (AVX2): LibTorch 1.x then multiplies
//                  bf16 matrices with its own cpublas GEMM. Where the second operand is a transposed
//                  view (Q K^T, dO V^T: gemm_transa_ in its column-major terms) each output is an fp32
//                  dot product rounded once, as under opmath; every other matmul (P V, dS K, P^T dO,
//                  dS^T Q) is gemm_notrans_ (aten/src/ATen/native/cpu/BlasKernel.cpp), which adds each
//                  product into the bf16 output in order of the summed index: acc = bf16(acc + bf16(a b))
//                  (`c[j * ldc + i] += a[i + l * lda] * val` on a BFloat16 c). Emulated on the CPU only,
//                  in the framework kinds' matmuls that are ops of their own (pv_tile's in-format mode).
enum class FrameworkOps : std::uint8_t { opmath, libtorch1_cpu, libtorch1_cpublas };
std::string_view to_string(FrameworkOps o);

// How Q, K and V enter their formats q, k, v:
//   none   rounded as given (the caller holds them in those formats; the usual case).
//   head   scaled first, one factor per head: x_q = q(x / c) with c = amax / largest_finite(q), amax
//          the head's largest |x| (FlashAttention-3's q_descale, k_descale, v_descale, one per
//          (batch, head)); the kernel multiplies the scores by c_q c_k and O by c_v.
//   block  one factor per block of block_q rows (Q) and block_kv rows (K, V): FlashAttention-3
//          paper §3.3, "block quantization".
// With either, the caller hands the kernels unrounded values; only fp8 formats benefit (elsewhere
// the scale moves values without changing their relative precision).
enum class Quantization : std::uint8_t { none, head, block };
inline constexpr Quantization kAllQuantizations[] = {Quantization::none, Quantization::head, Quantization::block};
std::string_view to_string(Quantization q);
std::optional<Quantization> parse_quantization(std::string_view name);

// Which format each step of attention runs in, and how values are rounded into it.
//
// The steps fall in three classes, which is what tells the readings (presets) apart:
//   storage  q, k, v, s, p, o, grad: tensors as one op hands them to the next (a kernel keeps S and
//            P in registers: its s is fp32, its p the format of the P.V operand).
//   in-op    accum, stats, softmax, division: values that live inside one op (a matmul's accumulator,
//            a fused softmax's row max, exponentials, row sum and normalisation, one flash tile's row
//            max and row sum).
//   state    stats_running, rescale, o_running, exp_arg: what flash carries between KV tiles (running
//            max, running sum, running O, the rescale factors) and the arguments of its exps, each of
//            which a framework-level re-implementation computes as an op of its own.
// A policy is one attention kind's: a reading gives its baseline and its flash kind a policy each
// (make_policy(reading, f, kind)), so each says what that kind materialises. Besides the formats it
// names how the flash kind is built (kernel), where the baseline applies the scale, and how Q, K, V
// are quantized. The op decomposition each kernel follows is written next to the kernels
// (kernels/detail/attention_impl.hpp).
struct PrecisionPolicy {
  std::string name = "pure";  // the reading ("pure", "eager", "fa2", ...) or the custom policy's name
  Format q = Format::fp32;    // storage of Q, K, V (inputs are rounded on entry)
  Format k = Format::fp32;
  Format v = Format::fp32;
  Format s = Format::fp32;         // storage of scores S = QK^T*scale
  Format p = Format::fp32;         // storage of probabilities P before P.V
  Format o = Format::fp32;         // storage of the output O
  Format accum = Format::fp32;     // accumulator of dot products (QK^T and P.V), rounded after every add
  Format stats = Format::fp32;     // row max and row sum inside one op (a fused softmax, one flash tile)
  Format softmax = Format::fp32;   // baseline: S - m and exp(S - m) inside the fused softmax
  Format rescale = Format::fp32;   // flash: the rescale factors alpha = exp(m_old - m_new) (and FA-1's b)
  Format division = Format::fp32;  // the normalisation by the row sum (baseline's softmax, flash's end)
  Format grad = Format::fp32;      // storage of dO, dQ, dK, dV and dS in the backward pass
  Format o_running = Format::fp32;      // flash: the running (unfinished) O kept between KV tiles
  Format stats_running = Format::fp32;  // flash: running max and running sum kept between KV tiles
  Format exp_arg = Format::fp32;        // flash: the arguments S - m and m_old - m_new of its exps
  Rounding rounding = Rounding::nearest;  // how every step above rounds
  FlashKernel kernel = FlashKernel::framework;   // how the flash kind is built (flash only)
  ScalePlacement scale = ScalePlacement::fused;  // where the scale is applied (baseline, framework flash)
  FrameworkOps framework_ops = FrameworkOps::opmath;  // LibTorch 1.x CPU's scalar, softmax backward, GEMM
  Quantization quantization = Quantization::none;  // how Q, K, V enter q, k, v
  bool incoherent = false;  // FA3's incoherent processing: Q and K times a Hadamard matrix with random
                            // signs (H D / sqrt(d), orthogonal: Q K^T is unchanged) before they are
                            // quantized; head_dim must be a power of two
  double max_offset = 0.0;  // Qiu & Yao's fix (arXiv 2510.04212 §4), beta > 1, 0 off: where two or more
                            // scores of a tile (the baseline: of the row) lie within kRepeatedMaxTolerance
                            // of its max m, the tile's max becomes beta m (m > 0) or 0 (m < 0), so that no
                            // P is exactly 1 (see kernels/detail/forward.hpp, offset_tile_max)
};

// The tie test of max_offset: scores (scaled logits) within this much of their tile's max count as
// that max, as in the reference code (github ucker/why-low-precision-training-fails, attention.py:
// `S_tile >= block_max - 1e-3`).
inline constexpr double kRepeatedMaxTolerance = 1e-3;

// The format the caller holds Q, K and V in for a policy: their storage format, or fp32 when the
// kernel quantizes them itself (quantization != none: the quantization is the kernel's error).
Format input_format(const PrecisionPolicy& p, Format storage);

// The steps of a policy, one row each: the key of a custom policy in grid.toml
// ([attention.policies.NAME] step = "format"), the member it sets and what it rounds. The grid parser,
// the resolved study.toml, `fastudy --help` and the tests all read this table; a new step is a new
// member above plus one row here.
using PolicyMember = Format PrecisionPolicy::*;
struct PolicyStep {
  std::string_view name;
  PolicyMember member;
  std::string_view what;
};
inline constexpr PolicyStep kPolicySteps[] = {
    {"q", &PrecisionPolicy::q, "storage of Q (inputs are rounded on entry)"},
    {"k", &PrecisionPolicy::k, "storage of K"},
    {"v", &PrecisionPolicy::v, "storage of V"},
    {"s", &PrecisionPolicy::s, "storage of the scores S = QK^T*scale (fa2/fa3: the unscaled fp32 tile)"},
    {"p", &PrecisionPolicy::p, "storage of the probabilities P before P.V (fa2/fa3: the P.V operand only)"},
    {"o", &PrecisionPolicy::o, "storage of the output O"},
    {"o_running", &PrecisionPolicy::o_running, "flash: the running (unfinished) O kept between KV tiles"},
    {"accum", &PrecisionPolicy::accum, "accumulator of dot products (QK^T and P.V), rounded after every add"},
    {"stats", &PrecisionPolicy::stats, "row max and row sum inside one op (baseline's softmax, one flash tile)"},
    {"stats_running", &PrecisionPolicy::stats_running, "flash: running max and running sum kept between KV tiles"},
    {"softmax", &PrecisionPolicy::softmax, "baseline: S - m and exp(S - m) inside the fused softmax"},
    {"exp_arg", &PrecisionPolicy::exp_arg, "flash: the arguments S - m and m_old - m_new of its exps"},
    {"rescale", &PrecisionPolicy::rescale, "flash: the rescale factors exp(m_old - m_new)"},
    {"division", &PrecisionPolicy::division, "the normalisation by the row sum"},
    {"grad", &PrecisionPolicy::grad, "storage of dO, dQ, dK, dV and dS in the backward pass"},
};
// The step named `name`, or null.
const PolicyStep* find_policy_step(std::string_view name);

// The readings: which implementation of attention in format f each models, per kind. Under every
// reading but pure the baseline kind is the framework baseline as PyTorch users write it:
// `softmax((q @ k.T) * scale) @ v` on tensors of f (S and P stored in f, matmuls and the softmax
// computing in fp32 inside; scale `after`).
//   pure   every step of both kinds in f, every add of every accumulation rounded: a
//          re-implementation that keeps every value, even inside an op, in the format.
//   eager  a framework-level re-implementation run in f (PyTorch eager ops on bf16/fp16 tensors):
//          flash is FA-2/FA-1 written as framework ops, each computing in fp32 inside and rounding its
//          output to f; what flash keeps between tiles (running max, sum and O, the rescale factors,
//          the arguments of its exps) is stored in f.
//   fa2    flash is the FlashAttention-2 CUDA kernel (FlashKernel::fa2): Q, K, V, P (the P.V
//          operand), O and the gradients in f; S, statistics, running state in fp32 registers.
//          What GPU training with flash-attn 2 or PyTorch's SDPA flash backend runs (fp16/bf16; at
//          fp32 or fp64 it is the same algorithm with that storage, which no kernel ships).
//   fa3    flash is the FlashAttention-3 Hopper kernel (FlashKernel::fa3). At fp16/bf16 as fa2 with
//          FA3's differences; at fp8 (e4m3) its FP8 path: Q, K, V quantized per block with incoherent
//          processing, P in fp8 with Max_offset, O in bf16 (FA3's output type for fp8); its baseline
//          is standard attention in FP8 (FA3 §4.3): Q, K, V quantized per head (the paper: per
//          tensor), S and P stored in fp16, O in bf16. The FP8 path has no backward pass.
//   mixed  a documented hypothetical reading, no known kernel: storage in f (S included, rounded
//          after the scale), every in-op value and all of flash's running state in fp32, framework
//          flash structure (KV tiles first to last, exp of S - m, P rounded before its row sum).
// Every reading rounds to nearest; fp64 runs every step in fp64.
//
// A reading is one row of kReadings (kernels/attention_common.cpp, next to the function that makes its
// policies): the help, `fastudy readings` (the report reads its --json listing), the grid parser, the
// CUDA capability check and the tests all read that table. A new reading is a row plus its policy
// function; the kernels run any policy (kernels/detail/dispatch.hpp picks the rounding object from the
// policy's formats, not from its name).
//
// How a reading makes the policy of one attention kind in format f; `name` becomes the policy's name.
using ReadingPolicyFn = PrecisionPolicy (*)(std::string_view name, Format f, AttentionKind kind);
struct Reading {
  std::string_view name;    // the word of grid.toml ([attention] policy, a custom policy's preset)
  std::string_view models;  // what code it models, in one line (`fastudy --help`, `fastudy readings`)
  std::string_view source;  // the source it cites for that code ("" for a reading that models none)
  ReadingPolicyFn policy;   // how to make its policies
  bool cuda;                // whether the CUDA attention kernels run it (at fp32, fp16 and bf16): a
                            // sweep or variant that asks the GPU for another reading is refused at load
  std::string_view report;  // its description in the report (analysis/report/readings.py)
};
// The rows, in the order of the help and `fastudy readings` (ReadingTable: begin/end, C++17 has no span).
struct ReadingTable {
  const Reading* first;
  std::size_t count;
  const Reading* begin() const { return first; }
  const Reading* end() const { return first + count; }
};
extern const ReadingTable kReadings;
// The reading named `name`, or null.
const Reading* find_reading(std::string_view name);

// The policy of `kind` under reading `preset` in format f; throws Error for an unknown reading.
PrecisionPolicy make_policy(std::string_view preset, Format f, AttentionKind kind);
// A reading's policies, one per attention kind.
struct ReadingPolicies {
  PrecisionPolicy flash, baseline;
  const PrecisionPolicy& of(AttentionKind kind) const { return kind == AttentionKind::flash ? flash : baseline; }
};
ReadingPolicies make_reading(std::string_view preset, Format f);
// "pure, eager, fa2, fa3, mixed"
std::string policy_preset_names();
// The readings the CUDA kernels run, for messages: "pure, eager, fa2, fa3 and mixed".
std::string cuda_reading_names();
bool is_policy_preset(std::string_view name);

// kv_outer: FlashAttention-1 (outer loop over K/V blocks, O re-normalised after every tile).
// q_outer: FlashAttention-2 (outer loop over Q blocks, one final normalisation).
enum class LoopOrder : std::uint8_t { kv_outer, q_outer };
std::string_view to_string(LoopOrder o);
std::optional<LoopOrder> parse_loop_order(std::string_view name);

// Where a sweep's tiles come from ([microbench] launch):
//   blocks   the sweep's own `blocks` (or `sram` and `tile_rules`): the paper's tile sweeps;
//   pytorch  the tiles, KV split and order PyTorch's FlashAttention-2 launch picks for the shape on a GPU
//            of sm_count SMs; the fa2 reading then runs that launch step by step (kernels/fa2_launch.hpp,
//            kernels/detail/fa2_pytorch.hpp).
enum class Launch : std::uint8_t { blocks, pytorch };
inline constexpr Launch kAllLaunches[] = {Launch::blocks, Launch::pytorch};
std::string_view to_string(Launch l);
std::optional<Launch> parse_launch(std::string_view name);

struct AttentionShape {
  std::int64_t batch = 1, heads = 1, seq_len = 1, head_dim = 1;
  bool causal = false;
  double scale = 0.0;  // 0 means 1/sqrt(head_dim)
};

struct AttentionParams {
  AttentionKind attention = AttentionKind::flash;
  PrecisionPolicy policy;
  int block_q = 64;   // Br, flash only; clipped to seq_len
  int block_kv = 64;  // Bc, flash only; clipped to seq_len
  LoopOrder order = LoopOrder::q_outer;
  int threads = 0;    // threads over the B*H heads; 0: OpenMP's default (OMP_NUM_THREADS, at::set_num_threads)
  // Stochastic rounding: the random stream of head h (0-based within this call) is keyed by
  // (rounding_seed, head_offset + h), so a caller that splits a batch over ranks passes each rank's
  // global index of its first head and gets the same bits as one rank doing the whole batch.
  std::uint64_t rounding_seed = 0;
  std::int64_t head_offset = 0;
  // Launch::pytorch: the fa2 reading (policy.kernel fa2, preset "fa2", fp16 or bf16) runs PyTorch's
  // FlashAttention-2 launch for a GPU of sm_count SMs (kernels/fa2_launch.hpp) and ignores block_q,
  // block_kv and order; every other kernel runs as the params say.
  Launch launch = Launch::blocks;
  int sm_count = 132;
};

// What a forward call did, for the microbenchmark's columns.
// A rescale is one multiplication of a row's running O by the factor of a new tile: it happens for
// every KV tile after the first that the row sees at least one unmasked key of (FA-1: O re-normalised
// by a*l/l_new; FA-2: O multiplied by alpha), even when the factor is exactly 1. So a row with keys in
// t tiles is rescaled t - 1 times: ceil(N/Bc) - 1 without causal masking, floor(i/Bc) for row i with it.
struct AttentionStats {
  std::int64_t tiles_kv = 0;        // ceil(N / Bc) (1 for baseline)
  double rescales_per_row = 0.0;    // mean number of O rescalings per query row (0 for baseline)
};

// The golden value: fp64, naive loops, no rounding. lse may be null.
void attention_forward_reference(const AttentionShape& shape, const double* q, const double* k, const double* v,
                                 double* o, double* lse);
void attention_backward_reference(const AttentionShape& shape, const double* q, const double* k, const double* v,
                                  const double* dout, double* dq, double* dk, double* dv);

// Baseline or flash (params.attention) with every step rounded as params.policy says. T is the container
// (float or double); values held in it are rounded to the policy's formats. lse is written for the
// backward pass (it may be null when no backward follows).
template <class T>
AttentionStats attention_forward(const AttentionShape& shape, const AttentionParams& params, const T* q, const T* k,
                                 const T* v, T* o, T* lse);
// The flash backward recomputes P from the saved lse, as the real kernels do; baseline recomputes S
// and P from q and k.
template <class T>
void attention_backward(const AttentionShape& shape, const AttentionParams& params, const T* q, const T* k,
                        const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv);

// The instruction set the kernels run with on this CPU: "avx512", "avx2" or "generic".
std::string_view attention_isa_name();

}  // namespace fastudy
