// The tile kernels, the hot loops of every forward and backward: score_tile (a transposed score
// tile S^T = s(K Q^T * scale), its other placements of the scale, or the plain dot products), pv_tile (Out += P V, the accumulation
// rounded to accum after every add) and mask_tile (causal masking), built from register-blocked
// score_block / pv_block.
#pragma once

#include "kernels/detail/rounding.hpp"
#include "kernels/detail/vec.hpp"

namespace fastudy {
namespace {

// Register blocks: kBlockRows rows x kBlockVecs vectors of accumulators (16 with 32 zmm registers,
// 8 with 16 ymm/xmm registers): enough independent FMA chains to cover the FMA latency on two ports.
constexpr int kBlockRows = 4;
constexpr int kBlockVecs = kVecBytes == 64 ? 4 : 2;

// What score_tile stores of each dot product acc (accumulated in accum):
//   fused  s(acc * scale)      the framework kinds' S with the scale inside the matmul (`fused`)
//   after  s(s(acc) * scale)   `after`: the matmul's output, then the scaling op (eager's flash too)
//   raw    s(acc)              unscaled: the baseline's `before` (Q holds the scale) and fa2/fa3 (the
//                              scale folded into exp2; their s is fp32, so S is never rounded)
//   dot    acc                 the plain dot products (the backward's dP = dO V^T)
enum class ScoreStore { fused, after, raw, dot };

// A CB x RV block of the transposed score tile: out[cb * ldst + rv * L] for key rows cb < CB and
// query vectors rv < RV, each lane the dot product over t = 0..d-1 in order.
template <int CB, int RV, ScoreStore Store, class T, class R>
FASTUDY_INLINE void score_block(const R& rd, const T* k, std::int64_t d, const T* qt, std::int64_t ldq, T scale,
                                T* out, std::int64_t ldst) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  V acc[CB][RV];
#pragma GCC unroll 16
  for (int cb = 0; cb < CB; ++cb)
#pragma GCC unroll 16
    for (int rv = 0; rv < RV; ++rv) acc[cb][rv] = V{};
  for (std::int64_t t = 0; t < d; ++t) {
    V q_vecs[RV];
#pragma GCC unroll 16
    for (int rv = 0; rv < RV; ++rv) q_vecs[rv] = vload(qt + t * ldq + rv * L);
#pragma GCC unroll 16
    for (int cb = 0; cb < CB; ++cb) {
      const V factor = splat(k[cb * d + t]);
#pragma GCC unroll 16
      for (int rv = 0; rv < RV; ++rv) acc[cb][rv] = rd.accum(madd(factor, q_vecs[rv], acc[cb][rv]));
    }
  }
#pragma GCC unroll 16
  for (int cb = 0; cb < CB; ++cb)
#pragma GCC unroll 16
    for (int rv = 0; rv < RV; ++rv) {
      if constexpr (Store == ScoreStore::fused) vstore(out + cb * ldst + rv * L, rd.s(acc[cb][rv] * scale));
      else if constexpr (Store == ScoreStore::after) vstore(out + cb * ldst + rv * L, rd.s(rd.s(acc[cb][rv]) * scale));
      else if constexpr (Store == ScoreStore::raw) vstore(out + cb * ldst + rv * L, rd.s(acc[cb][rv]));
      else vstore(out + cb * ldst + rv * L, acc[cb][rv]);
    }
}

// St[c * ldst + r] = s(scale * (K_c . Q_r)) for c < bc and r < br_padded (a multiple of the lane count):
// the transposed score tile, or what Store says of the dot product K_c . Q_r. K is row-major [bc, d];
// Qt is Q transposed, Qt[t * ldq + r].
template <ScoreStore Store = ScoreStore::fused, class T, class R>
void score_tile(const R& rd, const T* k, std::int64_t d, const T* qt, std::int64_t ldq, std::int64_t bc,
                std::int64_t br_padded, T scale, T* st, std::int64_t ldst) {
  constexpr int L = kLanes<T>;
  constexpr int CB = kBlockRows, RV = kBlockVecs;
  std::int64_t c = 0;
  for (; c + CB <= bc; c += CB) {
    std::int64_t r = 0;
    for (; r + RV * L <= br_padded; r += RV * L)
      score_block<CB, RV, Store>(rd, k + c * d, d, qt + r, ldq, scale, st + c * ldst + r, ldst);
    for (; r < br_padded; r += L)
      score_block<CB, 1, Store>(rd, k + c * d, d, qt + r, ldq, scale, st + c * ldst + r, ldst);
  }
  for (; c < bc; ++c) {
    std::int64_t r = 0;
    for (; r + RV * L <= br_padded; r += RV * L)
      score_block<1, RV, Store>(rd, k + c * d, d, qt + r, ldq, scale, st + c * ldst + r, ldst);
    for (; r < br_padded; r += L)
      score_block<1, 1, Store>(rd, k + c * d, d, qt + r, ldq, scale, st + c * ldst + r, ldst);
  }
}

// score_tile with the scale where the framework code applies it (ScalePlacement; `before`: Q holds it
// already): the baseline and the framework flash loops.
template <class T, class R>
void placed_score_tile(ScalePlacement placement, const R& rd, const T* k, std::int64_t d, const T* qt,
                       std::int64_t ldq, std::int64_t bc, std::int64_t br_padded, T scale, T* st, std::int64_t ldst) {
  switch (placement) {
    case ScalePlacement::fused: score_tile<ScoreStore::fused>(rd, k, d, qt, ldq, bc, br_padded, scale, st, ldst); break;
    case ScalePlacement::after: score_tile<ScoreStore::after>(rd, k, d, qt, ldq, bc, br_padded, scale, st, ldst); break;
    case ScalePlacement::before: score_tile<ScoreStore::raw>(rd, k, d, qt, ldq, bc, br_padded, scale, st, ldst); break;
  }
}

// How pv_tile adds a product a b into its accumulator acc (FrameworkOps, kernels/attention.hpp):
//   fused      acc = accum(acc + a b), the product fused into the add where the ISA has FMA: every GEMM
//              the readings model (fp32 accumulators inside the op, as PyTorch's CUDA matmuls and oneDNN)
//   in_format  acc = Out(acc + Out(a b)), Out the step that stores the op's output: LibTorch 1.x's own
//              CPU GEMM on bf16 (gemm_notrans_ in aten/src/ATen/native/cpu/BlasKernel.cpp adds
//              `a * val` into the BFloat16 output, the summed index ascending), libtorch1_cpublas
enum class GemmAccum { fused, in_format };

template <GemmAccum Accum, StepId Out, class V, class R>
FASTUDY_INLINE V gemm_add(const R& rd, V factor, V x, V acc) {
  if constexpr (Accum == GemmAccum::in_format) return rd.template step<Out>(acc + rd.template step<Out>(factor * x));
  else return rd.accum(madd(factor, x, acc));
}

// An RB x TV block of Out += P.V: rows rb < RB, head-dim vectors tv < TV, the sum over c in order.
// The factor of row rb and term c is p[c * ldp + rb], or p[rb * ldp + c] with kRowsOfP.
template <int RB, int TV, bool kRowsOfP, GemmAccum Accum, StepId Out, class T, class R>
FASTUDY_INLINE void pv_block(const R& rd, const T* p, std::int64_t ldp, const T* v, std::int64_t d_padded,
                             std::int64_t bc, T* out, std::int64_t ldo) {
  using V = vec_t<T>;
  constexpr int L = kLanes<T>;
  V acc[RB][TV];
#pragma GCC unroll 16
  for (int rb = 0; rb < RB; ++rb)
#pragma GCC unroll 16
    for (int tv = 0; tv < TV; ++tv) acc[rb][tv] = vload(out + rb * ldo + tv * L);
  for (std::int64_t c = 0; c < bc; ++c) {
    V v_vecs[TV];
#pragma GCC unroll 16
    for (int tv = 0; tv < TV; ++tv) v_vecs[tv] = vload(v + c * d_padded + tv * L);
#pragma GCC unroll 16
    for (int rb = 0; rb < RB; ++rb) {
      const V factor = splat(kRowsOfP ? p[rb * ldp + c] : p[c * ldp + rb]);
#pragma GCC unroll 16
      for (int tv = 0; tv < TV; ++tv) acc[rb][tv] = gemm_add<Accum, Out>(rd, factor, v_vecs[tv], acc[rb][tv]);
    }
  }
#pragma GCC unroll 16
  for (int rb = 0; rb < RB; ++rb)
#pragma GCC unroll 16
    for (int tv = 0; tv < TV; ++tv) vstore(out + rb * ldo + tv * L, acc[rb][tv]);
}

// Out[r * ldo + t] = accum-sequence of Out[r][t] + sum_c P[c * ldp + r] * V[c * d_padded + t], for
// r < br and t < d_padded (a multiple of the lane count), c in order: p holds P transposed. With
// kRowsOfP the factors are read as P[r * ldp + c] (the same products in the same order: no
// transposed copy needed). Accum and Out: how each product is added (GemmAccum).
template <bool kRowsOfP = false, GemmAccum Accum = GemmAccum::fused, StepId Out = StepId::accum, class T, class R>
void pv_tile(const R& rd, const T* p, std::int64_t ldp, const T* v, std::int64_t d_padded, std::int64_t bc,
             std::int64_t br, T* out, std::int64_t ldo) {
  constexpr int L = kLanes<T>;
  constexpr int RB = kBlockRows, TV = kBlockVecs;
  const std::int64_t row_step = kRowsOfP ? ldp : 1;
  std::int64_t r = 0;
  for (; r + RB <= br; r += RB) {
    const T* p_rows = p + r * row_step;
    std::int64_t t = 0;
    for (; t + TV * L <= d_padded; t += TV * L)
      pv_block<RB, TV, kRowsOfP, Accum, Out>(rd, p_rows, ldp, v + t, d_padded, bc, out + r * ldo + t, ldo);
    for (; t < d_padded; t += L)
      pv_block<RB, 1, kRowsOfP, Accum, Out>(rd, p_rows, ldp, v + t, d_padded, bc, out + r * ldo + t, ldo);
  }
  for (; r < br; ++r) {
    const T* p_rows = p + r * row_step;
    std::int64_t t = 0;
    for (; t + TV * L <= d_padded; t += TV * L)
      pv_block<1, TV, kRowsOfP, Accum, Out>(rd, p_rows, ldp, v + t, d_padded, bc, out + r * ldo + t, ldo);
    for (; t < d_padded; t += L)
      pv_block<1, 1, kRowsOfP, Accum, Out>(rd, p_rows, ldp, v + t, d_padded, bc, out + r * ldo + t, ldo);
  }
}

// pv_tile as a framework matmul that is an op of its own, its output stored by step Out: in the format
// where the framework's GEMM adds in it (Head::gemm_in_format), else fused.
template <StepId Out, bool kRowsOfP = false, class T, class R>
void op_pv_tile(bool in_format, const R& rd, const T* p, std::int64_t ldp, const T* v, std::int64_t d_padded,
                std::int64_t bc, std::int64_t br, T* out, std::int64_t ldo) {
  if (in_format) pv_tile<kRowsOfP, GemmAccum::in_format, Out>(rd, p, ldp, v, d_padded, bc, br, out, ldo);
  else pv_tile<kRowsOfP>(rd, p, ldp, v, d_padded, bc, br, out, ldo);
}

// Sets St[c][r] = -inf where key j0 + c comes after query i0 + r (causal masking).
template <class T>
void mask_tile(T* st, std::int64_t ldst, std::int64_t bc, std::int64_t br_padded, std::int64_t j0,
               std::int64_t i0) {
  for (std::int64_t c = 0; c < bc; ++c) {
    const std::int64_t first_masked = std::max<std::int64_t>(0, j0 + c - i0);  // rows r < j0 + c - i0
    for (std::int64_t r = 0; r < std::min(first_masked, br_padded); ++r) st[c * ldst + r] = kNegInf<T>;
  }
}

}  // namespace
}  // namespace fastudy
