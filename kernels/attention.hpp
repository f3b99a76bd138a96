// Attention kernels on the CPU in any number format: the fp64 reference (golden), baseline
// (S = QK^T*scale materialised, softmax, P.V) and flash (tiled online softmax, FA-1 and FA-2 loop
// orders), forward and backward. This header is the kernel interface used by the microbenchmark, the
// trainer and the tests; it stays free of LibTorch.
//
// Shapes: B batch, H heads, N sequence, d head dim. Every tensor is contiguous row-major [B, H, N, d];
// lse (log-sum-exp of each softmax row, natural log, scaled scores) is [B, H, N].
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <optional>

#include "kernels/format.hpp"

namespace fastudy {

// Which format each step of attention runs in, and how values are rounded into it.
//
// The steps fall in three classes, which is what tells the readings (presets) apart:
//   storage  q, k, v, s, p, o, grad: tensors as one op hands them to the next.
//   in-op    accum, stats, softmax, division: values that live inside one op (a matmul's accumulator,
//            a fused softmax's row max, exponentials, row sum and normalisation, one flash tile's row
//            max and row sum).
//   state    stats_running, rescale, o_running, exp_arg: what flash carries between KV tiles (running
//            max, running sum, running O, the rescale factors) and the arguments of its exps, each of
//            which a framework-level re-implementation computes as an op of its own.
// The op decomposition each kernel follows is written next to the kernels
// (kernels/detail/attention_impl.hpp).
struct PrecisionPolicy {
  std::string name = "pure";  // preset name ("pure", "eager", "mixed") or the custom policy's name
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
};

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
    {"s", &PrecisionPolicy::s, "storage of the scores S = QK^T*scale"},
    {"p", &PrecisionPolicy::p, "storage of the probabilities P before P.V"},
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

// The readings: which implementation of attention in format f each preset models.
//   pure   every step in f, every add of every accumulation rounded: a re-implementation that keeps
//          every value, even inside an op, in the format.
//   eager  a framework-level re-implementation run in f (PyTorch eager ops on bf16/fp16 tensors):
//          each op computes in fp32 inside (matmul accumulators, a fused softmax) and rounds its
//          output to f; what flash keeps between tiles (running max, sum and O, the rescale
//          factors, the arguments of its exps) is stored in f.
//   mixed  a GPU kernel (FlashAttention, cuDNN): storage in f, every in-op value and all of flash's
//          running state in fp32 registers; only the final output is rounded.
// Every preset rounds to nearest; fp64 runs every step in fp64.
struct PolicyPreset {
  std::string_view name;
  std::string_view models;
};
inline constexpr PolicyPreset kPolicyPresets[] = {
    {"pure", "every step in the format, every add of every accumulation rounded"},
    {"eager", "framework ops (PyTorch) in the format: fp32 inside each op; op outputs and flash's running state "
              "in the format"},
    {"mixed", "a GPU kernel (FlashAttention): storage in the format; inside ops and running state in fp32"},
};
PrecisionPolicy make_policy(std::string_view preset, Format f);
// "pure, eager, mixed"
std::string policy_preset_names();
bool is_policy_preset(std::string_view name);

enum class AttentionKind : std::uint8_t { baseline, flash };
std::string_view to_string(AttentionKind k);
std::optional<AttentionKind> parse_attention_kind(std::string_view name);

// kv_outer: FlashAttention-1 (outer loop over K/V blocks, O re-normalised after every tile).
// q_outer: FlashAttention-2 (outer loop over Q blocks, one final normalisation).
enum class LoopOrder : std::uint8_t { kv_outer, q_outer };
std::string_view to_string(LoopOrder o);
std::optional<LoopOrder> parse_loop_order(std::string_view name);

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
