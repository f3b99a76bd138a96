// The CPU attention kernels (baseline and flash, forward and backward): the map of kernels/detail/.
// They are written once over a vector width and compiled once per instruction set by
// attention_isa_*.cpp, which define FASTUDY_VEC_BYTES (16, 32 or 64), FASTUDY_ISA_FMA and
// FASTUDY_ISA_F16C, switch the target with `#pragma GCC target`, then include this file. Everything
// in the pieces has internal linkage (an anonymous namespace), so the per-ISA copies never meet at
// link time. Include kernels/detail/attention_deps.hpp before the pragma so the standard library
// stays compiled for the baseline target. The pieces are parts of this one header, not headers of
// their own: nothing else includes them.
//
// B batch, H heads, N sequence, d head dim, Br/Bc the Q/KV block sizes (block_q/block_kv).
//
// The pieces (kernels/detail/), in include order; each includes the ones it uses:
//   vec.hpp            the vector type of the build (vec_t, kLanes), vload/vstore/splat/vmax, madd
//                      (fused where the build has FMA), kNegInf, round_up, FASTUDY_INLINE
//   round_vec.hpp      whole vectors rounded to a format: round_vec (nearest), round_vec_mode (toward
//                      zero, stochastic)
//   random_stream.hpp  RandomStream: the random bits of stochastic rounding, one stream per head
//   rounding.hpp       the rounding objects (StaticRounding, RuntimeRounding: one method per step),
//                      StepId, round_lanes / round_run, the roundings that keep the -inf sentinel
//   exp.hpp            vexp / sexp
//   tiles.hpp          the register-blocked tile kernels score_tile, pv_tile and mask_tile
//   head.hpp           one head's sizes (Head) and forward workspace, load_inputs, store_row
//   forward.hpp        flash_forward_q_outer (FA-2), flash_forward_kv_outer (FA-1), baseline_forward
//   backward.hpp       flash_backward, baseline_backward, their workspace, loads and stores
//   fa2_pytorch.hpp    the fa2 reading under launch = "pytorch": PyTorch's FlashAttention-2 launch and
//                      kernels step by step, with the tensor cores' arithmetic (kernels/mma_model.hpp)
//   dispatch.hpp       dispatch_rounding (the one place where runtime formats become template
//                      parameters) and forward_heads / backward_heads, the ISA table's functions
//
// How to add
//   a reading   a row of kReadings and the function that makes its policies (kernels/attention_common.cpp;
//               .cuda where the CUDA dispatch takes them). When its storage, in-op and state steps are each
//               in one format, a line in dispatch_classes (dispatch.hpp) gives it a StaticRounding; any
//               other policy runs on RuntimeRounding, with the same results, only slower.
//   a step      a PrecisionPolicy member, its kPolicySteps row (kernels/attention.hpp) and its format
//               in each reading (kReadings); in rounding.hpp a StepId value and a method of the same
//               name in StaticRounding (with its class in format_of) and RuntimeRounding (and its
//               format_of case); its class in the uniformity test of dispatch_rounding; then
//               rd.<step>(x) where the kernels round it, a line in the op decomposition below, and the
//               twin in TileRounding (kernels/cuda/tile_math.hpp, tile_dispatch.hpp).
//   a kernel    a function of (rd, Head, Workspace, o, lse) in forward.hpp built from the tiles, the
//               value that names it (AttentionKind or LoopOrder, kernels/attention.hpp), its branch in
//               forward_heads (dispatch.hpp) and its lines in the op decomposition below; a backward
//               likewise in backward.hpp and backward_heads.
//   an ISA      an attention_isa_*.cpp defining the three macros, its branches in madd (vec.hpp) and
//               round_vec (round_vec.hpp) where it has an instruction for them, its entry in
//               attention_isa.hpp and select_isa (kernels/attention.cpp).
//
// Rounding: every step goes through a rounding object R (one per policy shape, chosen once per call
// in dispatch_rounding, the only place where runtime formats become template parameters). R::q(x),
// R::accum(x), ... take a scalar or a vector; an identity rounding compiles to nothing, so the fp32
// policy on float data runs the plain fp32 kernel. The rounding mode (nearest, zero, stochastic) is
// the policy's; stochastic draws its bits from one counter-based stream per head.
//
// The op decomposition. Each line below is one op of a framework-level re-implementation (one PyTorch
// call on tensors of the format): its output is rounded by the step named after it, values inside
// it by the in-op steps (accum, stats, softmax, division). Which of these roundings do anything is
// the reading's choice (kernels/attention.hpp): eager rounds op outputs and state to the format and
// keeps in-op values in fp32; mixed keeps state in fp32 too; pure rounds everything.
//   inputs      Q, K, V rounded to q, k, v on entry into per-head copies (dO and O to grad and o).
//   matmul      acc_0 = 0, acc_t = accum(acc_{t-1} + a_t b_t), in order t = 0..k-1 (the product is
//               fused into the add (FMA) where the instruction set has it, as GPU kernels do). Under
//               FrameworkOps::libtorch1_cpublas the framework kinds' matmuls that are ops of their own
//               and not Q K^T-shaped (P V, P^T dO, dS K, dS^T Q) add acc_t = out(acc_{t-1} + out(a_t b_t)),
//               out the step that stores the op's output (GemmAccum in tiles.hpp).
//   exp         a vectorised Cephes-style expf (about 1 ulp) for float, std::exp for double.
// Baseline (S materialised, one fused softmax, P.V):
//   S = s(Q K^T * scale)                                  matmul
//   P = softmax(S): m = stats(rowmax S), e = softmax(exp(softmax(S - m))), l = stats(sum e, every add),
//       P = p(division(e / l))                            one fused op; lse = stats(m + log l)
//   O = o(P V)                                            matmul
// FA-2 (q_outer; per Q block, per KV tile j; state m, l, O per row):
//   S = s(Q K_j^T * scale)                                matmul
//   m_new = stats_running(max(m, rowmax S))               running max
//   P = p(exp(exp_arg(S - m_new)))                        two ops
//   alpha = rescale(exp(exp_arg(m - m_new)))              two ops
//   l = stats_running(stats_running(alpha l) + stats_running(rowsum P))   rowsum: in-op stats
//   O = o_running(o_running(alpha O) + o_running(P V_j))  P V_j: matmul
//   end: O = o(division(O / l)), lse = stats_running(m + log l)
// FA-1 (kv_outer; Algorithm 1 of FlashAttention; per KV tile j, per Q block):
//   S = s(Q_i K_j^T * scale);  m~ = stats_running(rowmax S);  P~ = p(exp(exp_arg(S - m~)))
//   l~ = stats_running(rowsum P~)  (in-op stats);  m_new = stats_running(max(m, m~))
//   alpha = rescale(exp(exp_arg(m - m_new))),  beta = rescale(exp(exp_arg(m~ - m_new)))
//   l_new = stats_running(stats_running(alpha l) + stats_running(beta l~))
//   O = o_running(division(o_running(o_running(alpha l O) + o_running(beta o_running(P~ V_j))) / l_new))
//   end: O = o(O), lse = stats_running(m + log l)
// When the running sum or O is exact in the container (stats_running / o_running at least as wide:
// mixed, as GPU kernels keep them in fp32 registers), FA-2 adds a tile's P and P.V straight into them
// (l = stats(stats(alpha l) + P_1 + P_2 ...), O = alpha O then accumulated by the P.V matmul), as
// FlashAttention-2's kernels do.
// Backward (both kinds: row by row over queries, FA-2 order for flash):
//   flash     P = p(exp(exp_arg(s(q k^T * scale) - lse))) recomputed from the saved lse,
//             D = stats_running(dO . O) (accum inside), dS = grad(P (dP - D)), dP = dO V^T (matmul)
//   baseline  P recomputed by the forward's softmax, D = accum-sum of P dP, dS = grad(P (dP - D))
//   dQ, dK, dV accumulated in accum and stored in grad.
// This models the flash backward *algorithm* run as framework ops, not autograd through the forward's
// loop (which a framework re-implementation would get if it did not write its own backward).
#pragma once

#include "kernels/detail/vec.hpp"
#include "kernels/detail/round_vec.hpp"
#include "kernels/detail/random_stream.hpp"
#include "kernels/detail/rounding.hpp"
#include "kernels/detail/exp.hpp"
#include "kernels/detail/tiles.hpp"
#include "kernels/detail/head.hpp"
#include "kernels/detail/forward.hpp"
#include "kernels/detail/backward.hpp"
#include "kernels/detail/fa2_pytorch.hpp"
#include "kernels/detail/dispatch.hpp"
