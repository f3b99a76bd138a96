// The fa2 reading under launch = "pytorch": PyTorch's copy of FlashAttention-2 (aten/src/ATen/native/
// transformers/cuda/flash_attn/, the same code as Dao-AILab/flash-attention csrc/flash_attn/src) as it
// runs on a Hopper GPU, step by step, forward (flash_fwd_kernel.h compute_attn_1rowblock, the split-KV
// compute_attn_1rowblock_splitkv and combine_attn_seqk_parallel) and backward (flash_bwd_preprocess_kernel.h
// compute_dot_do_o, flash_bwd_kernel.h compute_dq_dk_dv_1colblock, convert_dQ). The launch (tiles, KV
// split, dQ splits) is kernels/fa2_launch.hpp's; the arithmetic:
//   tensor cores  every product of two 16-bit tiles is mma.sync m16n8k16 with an fp32 accumulator, which
//                 kernels/mma_model.hpp models bit for bit (MMA-Sim): S = Q K^T over d in chunks of 16 from
//                 a zero accumulator (gemm: cute::gemm per k-slice, in order), O += P V over the block's keys
//                 in chunks of 16 (gemm_rs), and in the backward dP = dO V^T, dV += P^T dO, dK += dS^T Q (over
//                 the row block's rows), dQ = dS K (over the key block's keys, a fresh accumulator);
//   exp2f, __logf ex2.approx.f32 and lg2.approx.f32, the special function unit's table interpolation
//                 (kernels/nv_math_model.hpp), logf and expf of the combine kernel libdevice's accurate code;
//   the rest      one fp32 operation each, rounded to nearest, contracted into an fma where nvcc contracts
//                 it (checked in the PTX nvcc 13.0 emits for the same expressions, tests/kernels/
//                 fa2_softmax_ptx.cu for the softmax's) and nowhere else.
// Storage format F is fp16 or bf16 (FlashAttention-2 runs no other); T is float.
//
// B batch, H heads, N sequence, d head dim; one head's tensors are [N, d]; L the vector lanes (rows).
#pragma once

#include "kernels/detail/round_vec.hpp"
#include "kernels/detail/vec.hpp"
#include "kernels/fa2_launch.hpp"
#include "kernels/mma_model.hpp"
#include "kernels/nv_math_model.hpp"

namespace fastudy {
namespace {

using FV = vec_t<float>;
using IV = vec_t<std::int32_t>;
constexpr int kFL = kLanes<float>;
typedef double DVL __attribute__((vector_size(kFL * 8)));
typedef std::int64_t LVL __attribute__((vector_size(kFL * 8)));

// Vectors of FV on the heap, aligned as FV (std::allocator here may hand out 16-byte alignment).
template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(alignof(T)))); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(alignof(T))); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const AlignedAllocator<U>&) const { return false; }
};
using FVs = std::vector<FV, AlignedAllocator<FV>>;

FASTUDY_INLINE bool any_lane(IV m) {
#if defined(__AVX512F__) && FASTUDY_VEC_BYTES == 64
  return _mm512_test_epi32_mask((__m512i)m, (__m512i)m) != 0;
#elif defined(__AVX__) && FASTUDY_VEC_BYTES == 32
  return !_mm256_testz_si256((__m256i)m, (__m256i)m);
#elif defined(__SSE2__) && FASTUDY_VEC_BYTES == 16
  return _mm_movemask_ps((__m128)m) != 0;
#else
  bool any = false;
  for (int l = 0; l < kFL; ++l) any |= m[l] != 0;
  return any;
#endif
}

// One mma.sync dot product (k = 16) per lane (kernels/mma_model.hpp's dot_k16, the same arithmetic on L
// independent lanes): acc's lane l becomes a_l . b + acc_l, where lane l's 16 A values are a[i * lda + l]
// with exponents ae[i * lda + l] (mma::split's e, precomputed) and the 16 B values, shared by the lanes,
// are b[i * ldb] with exponents be[i * ldb]. The terms are aligned and truncated as integers in units of
// 2^(e_max - 25): each product a_i b_i is exact in fp32 (22 significant bits at most), scaling it by
// 2^(25 - e_max) is exact, and the truncating conversion to int32 is MMA-Sim's truncation; the two
// half-sums of 8 products (< 2^30 each) and the accumulator's term add exactly in fp64, whose low 29
// fraction bits are then cleared: fp32 toward zero. Lanes with an exponent outside [-100, 100] (values
// near fp32's range ends, inf or NaN) take mma::dot_k16 itself.
template <Format F>
__attribute__((noinline)) FV mma_lanes_scalar(FV acc, const float* a, std::int64_t lda, const float* b,
                                              std::int64_t ldb) {
  FV out;
  for (int l = 0; l < kFL; ++l) {
    float av[16], bv[16];
    for (int i = 0; i < 16; ++i) av[i] = a[i * lda + l], bv[i] = b[i * ldb];
    out[l] = mma::dot_k16<F>(av, bv, acc[l]);
  }
  return out;
}

template <Format F>
FASTUDY_INLINE FV mma_lanes(FV acc, const float* a, const std::int32_t* ae, std::int64_t lda, const float* b,
                            const std::int32_t* be, std::int64_t ldb) {
  const IV acc_bits = (IV)acc;
  const IV field = (acc_bits >> 23) & 0xFF;
  IV emax = field == 0 ? IV{} - 126 : field - 127;
  for (int i = 0; i < 16; ++i) {
    const IV e = vload(ae + i * lda) + be[i * ldb];
    emax = emax > e ? emax : e;
  }
  if (__builtin_expect(any_lane((emax < -100) | (emax > 100) | (field == 255)), 0))
    return mma_lanes_scalar<F>(acc, a, lda, b, ldb);
  const IV scale_bits = (152 - emax) << 23;  // 2^(25 - e_max)
  const FV scale = (FV)scale_bits;
  IV lo = __builtin_convertvector(acc * scale, IV), hi = IV{};
  for (int i = 0; i < 8; ++i) lo += __builtin_convertvector(vload(a + i * lda) * b[i * ldb] * scale, IV);
  for (int i = 8; i < 16; ++i) hi += __builtin_convertvector(vload(a + i * lda) * b[i * ldb] * scale, IV);
  const DVL total = __builtin_convertvector(lo, DVL) + __builtin_convertvector(hi, DVL);
  const LVL cleared = (LVL)total & ~((std::int64_t{1} << 29) - 1);
  const FV top24 = __builtin_convertvector((DVL)cleared, FV);
  const IV back_bits = (emax + 102) << 23;  // 2^(e_max - 25)
  return top24 * (FV)back_bits;
}

// mma_lanes' last step: the two half-sums added exactly in fp64, the low 29 fraction bits cleared (toward
// zero to 24 bits), times 2^(e_max - 25).
FASTUDY_INLINE FV mma_finish(IV lo, IV hi, IV emax) {
  const DVL total = __builtin_convertvector(lo, DVL) + __builtin_convertvector(hi, DVL);
  const LVL cleared = (LVL)total & ~((std::int64_t{1} << 29) - 1);
  return __builtin_convertvector((DVL)cleared, FV) * (FV)((emax + 102) << 23);
}

// Two mma_lanes sharing the A operand (the same lanes, two B columns b0 and b1): the same arithmetic per
// chain, interleaved so that the two independent chains fill the vector units (and A is loaded once).
template <Format F>
FASTUDY_INLINE void mma_lanes_x2(FV& acc0, FV& acc1, const float* a, const std::int32_t* ae, std::int64_t lda,
                                 const float* b0, const std::int32_t* be0, const float* b1, const std::int32_t* be1,
                                 std::int64_t ldb) {
  const IV field0 = ((IV)acc0 >> 23) & 0xFF, field1 = ((IV)acc1 >> 23) & 0xFF;
  IV emax0 = field0 == 0 ? IV{} - 126 : field0 - 127;
  IV emax1 = field1 == 0 ? IV{} - 126 : field1 - 127;
  for (int i = 0; i < 16; ++i) {
    const IV ea = vload(ae + i * lda);
    const IV e0 = ea + be0[i * ldb], e1 = ea + be1[i * ldb];
    emax0 = emax0 > e0 ? emax0 : e0;
    emax1 = emax1 > e1 ? emax1 : e1;
  }
  const IV bad = (emax0 < -100) | (emax0 > 100) | (field0 == 255) | (emax1 < -100) | (emax1 > 100) | (field1 == 255);
  if (__builtin_expect(any_lane(bad), 0)) {
    acc0 = mma_lanes_scalar<F>(acc0, a, lda, b0, ldb);
    acc1 = mma_lanes_scalar<F>(acc1, a, lda, b1, ldb);
    return;
  }
  const FV scale0 = (FV)((152 - emax0) << 23), scale1 = (FV)((152 - emax1) << 23);
  IV lo0 = __builtin_convertvector(acc0 * scale0, IV), hi0 = IV{};
  IV lo1 = __builtin_convertvector(acc1 * scale1, IV), hi1 = IV{};
  for (int i = 0; i < 16; ++i) {
    const FV x = vload(a + i * lda);
    const IV t0 = __builtin_convertvector(x * b0[i * ldb] * scale0, IV);
    const IV t1 = __builtin_convertvector(x * b1[i * ldb] * scale1, IV);
    if (i < 8) lo0 += t0, lo1 += t1;
    else hi0 += t0, hi1 += t1;
  }
  acc0 = mma_finish(lo0, hi0, emax0);
  acc1 = mma_finish(lo1, hi1, emax1);
}

// table[idx] lane by lane (a gather where the instruction set has one).
FASTUDY_INLINE IV gather_lanes(const std::int32_t* table, IV idx) {
#if defined(__AVX512F__) && FASTUDY_VEC_BYTES == 64
  return (IV)_mm512_i32gather_epi32((__m512i)idx, table, 4);
#elif defined(__AVX2__) && FASTUDY_VEC_BYTES == 32
  return (IV)_mm256_i32gather_epi32(table, (__m256i)idx, 4);
#else
  IV out;
  for (int l = 0; l < kFL; ++l) out[l] = table[idx[l]];
  return out;
#endif
}

// ex2.approx.f32 (exp2f) on a vector: nv::ex2_approx's steps lane by lane (the same bits; NaN lanes take
// the scalar model). The interpolation's sum A 2^13 + B r + C sq + 0x77E2 (below 2^41) is formed in two
// int32 halves, r = rh 2^9 + rl: H = A 2^4 + B rh (< 2^31) and L = B rl + C sq + 0x77E2 (< 2^27), and
// (H 2^9 + L) >> 15 = (H + (L >> 9)) >> 6.
FASTUDY_INLINE FV ex2_lanes(FV x) {
  static_assert(sizeof(nv::SfuSegment) == 3 * sizeof(std::int32_t), "the table is read as int32 triples");
  if (__builtin_expect(any_lane(x != x), 0)) {
    FV out;
    for (int l = 0; l < kFL; ++l) out[l] = nv::ex2_approx(x[l]);
    return out;
  }
  const IV halved = x < -126.0f;  // the compiler's expansion: MUFU.EX2(x / 2) squared
  const IV u = (IV)(halved ? x * 0.5f : x);
  const IV negative = u < 0;
  const IV e = ((u >> 23) & 0xFF) - 127;
  const IV big = e >= 7;  // |x| >= 128 and +-inf: 0 or +inf by the sign
  // The 7.23 fixed-point magnitude, truncated (a subnormal or zero x shifts out to 0).
  const IV sig = (u & 0x7FFFFF) | 0x800000;
  const IV left = (e > 0) & ~big ? e : 0;
  const IV right = e < -31 ? 31 : (e < 0 ? -e : 0);
  const IV fixed = (sig << left) >> right;
  IV ipart = fixed >> 23, f = fixed & 0x7FFFFF;
  const IV nonzero = f != 0;
  ipart = negative ? nonzero - ipart : ipart;  // -ipart - 1 where f != 0 (nonzero is -1 there), else -ipart
  f = negative & nonzero ? ~f & 0x7FFFFF : f;
  const IV seg3 = (f >> 17) * 3, r = f & 0x1FFFF;
  IV sq{};
  for (int i = 2; i < 17; ++i) sq += ((r << (31 - i)) >> 31) & (r >> (18 - i));  // nv::sfu_square
  sq >>= 1;
  const std::int32_t* table = &nv::kSfuEx2[0].value;
  const IV a = gather_lanes(table, seg3), b = gather_lanes(table + 1, seg3), c = gather_lanes(table + 2, seg3);
  const IV high = (a << 4) + b * (r >> 9);
  const IV low = b * (r & 0x1FF) + c * sq + 0x77E2;
  IV sig_out = (high + (low >> 9)) >> 6;
  const IV carry = sig_out >> 24;  // 1 where the interpolation reached 2
  sig_out >>= carry;
  const IV biased = ipart + 127 + carry;
  const FV inf = splat(std::numeric_limits<float>::infinity());
  FV h = (FV)((biased << 23) | (sig_out & 0x7FFFFF));
  h = biased <= 0 ? FV{} : h;
  h = biased >= 0xFF ? inf : h;
  h = big ? (negative ? FV{} : inf) : h;
  return halved ? h * h : h;
}

template <Format F>
FASTUDY_INLINE FV round_lanes(FV x) {
  return round_vec<F, float>(x);
}

// mma::split's exponent of values of F, lane by lane: the fp32 exponent, at least F's smallest normal
// exponent (a subnormal of F keeps it), -126 for zero.
template <Format F>
FASTUDY_INLINE IV exponent_lanes(FV x) {
  const IV field = ((IV)x >> 23) & 0xFF;
  const IV e = field - 127;
  const IV floor = IV{} + FormatTraits<F>::emin;
  const IV clamped = e > floor ? e : floor;
  return x == 0.0f ? IV{} + mma::kZeroExponent : clamped;
}

// One head's operands as the tensor cores read them: values of F and their mma exponents, transposed
// (lanes = rows: [t][rows]) or not ([rows][t]), zero padded to whole vectors and to d rounded up to 16
// (a chunk of zero products leaves an accumulator unchanged, so this is the kernel's kHeadDim padding).
struct Fa2Operand {
  std::vector<float> x;
  std::vector<std::int32_t> e;
  std::int64_t ld = 0;  // row length
  void resize(std::int64_t rows, std::int64_t cols) {
    ld = cols;
    x.assign(static_cast<std::size_t>(rows * cols), 0.0f);
    e.assign(static_cast<std::size_t>(rows * cols), mma::kZeroExponent);
  }
  template <Format F>
  void set(std::int64_t r, std::int64_t c, float v) {
    const float f = round_to_format<F>(v);
    x[static_cast<std::size_t>(r * ld + c)] = f;
    e[static_cast<std::size_t>(r * ld + c)] = mma::split<F>(f).e;
  }
  const float* at(std::int64_t r, std::int64_t c) const { return x.data() + r * ld + c; }
  const std::int32_t* exp_at(std::int64_t r, std::int64_t c) const { return e.data() + r * ld + c; }
};

struct Fa2Geometry {
  std::int64_t n, d, d16, rows;  // rows: N rounded up to the lanes
  float scale, scale_log2;
  bool causal;
};

inline Fa2Geometry fa2_geometry(const AttentionShape& shape) {
  Fa2Geometry g;
  g.n = shape.seq_len;
  g.d = shape.head_dim;
  g.d16 = round_up(g.d, 16);
  g.rows = round_up(g.n, kFL);
  const double scale = shape.scale != 0.0 ? shape.scale : 1.0 / std::sqrt(static_cast<double>(g.d));
  g.scale = static_cast<float>(scale);  // mha_fwd's `const float softmax_scale`
  // flash_api.cpp set_params_fprop: params.scale_softmax_log2 = softmax_scale * M_LOG2E (in double).
  g.scale_log2 = static_cast<float>(static_cast<double>(g.scale) * 1.44269504088896340736);
  g.causal = shape.causal;
  return g;
}

// S for L rows (row0 ...) and key j: the chain of mma over d from a zero accumulator (gemm over the
// k-slices of sQ and sK), masked: keys past N (mask.h, col >= max_seqlen_k) and causal keys after the row
// (apply_mask_causal: col > row) are -inf.
template <Format F>
FASTUDY_INLINE FV score_lanes(const Fa2Geometry& g, const Fa2Operand& at, const Fa2Operand& b, std::int64_t row0,
                              std::int64_t j) {
  if (j >= g.n || (g.causal && j > row0 + kFL - 1)) return splat(kNegInf<float>);  // masked for every lane
  FV s{};
  for (std::int64_t t = 0; t < g.d16; t += 16) s = mma_lanes<F>(s, at.at(t, row0), at.exp_at(t, row0), at.ld, b.at(j, t), b.exp_at(j, t), 1);
  if (g.causal)
    for (int l = 0; l < kFL; ++l)
      if (j > row0 + l) s[l] = kNegInf<float>;
  return s;
}

// score_lanes for keys j and j + 1 together (mma_lanes_x2).
template <Format F>
FASTUDY_INLINE void score_lanes_x2(const Fa2Geometry& g, const Fa2Operand& at, const Fa2Operand& b, std::int64_t row0,
                                   std::int64_t j, FV& s0, FV& s1) {
  const bool skip0 = j >= g.n || (g.causal && j > row0 + kFL - 1);
  const bool skip1 = j + 1 >= g.n || (g.causal && j + 1 > row0 + kFL - 1);
  if (skip0 || skip1) {
    s0 = score_lanes<F>(g, at, b, row0, j);
    s1 = score_lanes<F>(g, at, b, row0, j + 1);
    return;
  }
  s0 = FV{}, s1 = FV{};
  for (std::int64_t t = 0; t < g.d16; t += 16)
    mma_lanes_x2<F>(s0, s1, at.at(t, row0), at.exp_at(t, row0), at.ld, b.at(j, t), b.exp_at(j, t), b.at(j + 1, t),
                    b.exp_at(j + 1, t), 1);
  if (g.causal)
    for (int l = 0; l < kFL; ++l) {
      if (j > row0 + l) s0[l] = kNegInf<float>;
      if (j + 1 > row0 + l) s1[l] = kNegInf<float>;
    }
}

// One split (or the whole row range) of the forward for L rows: KV blocks [nb_lo, nb_hi) of block_n keys
// from the last to the first, then normalize_softmax_lse. o receives acc_o * (1 / sum) in fp32 ([d16]
// vectors), lse the split's lse (Split: -inf for an empty row, else +inf).
template <Format F>
void fa2_forward_rows(const Fa2Geometry& g, const Fa2Operand& qt, const Fa2Operand& k, const Fa2Operand& vt,
                      std::int64_t row0, int block_n, std::int64_t nb_lo, std::int64_t nb_hi, bool split,
                      FVs& acc, std::vector<float>& p16, std::vector<std::int32_t>& pe, FV* lse_out) {
  const FV sl2 = splat(g.scale_log2);
  acc.assign(static_cast<std::size_t>(g.d16), FV{});
  p16.resize(static_cast<std::size_t>(block_n * kFL));
  pe.resize(static_cast<std::size_t>(block_n * kFL));
  FV m = splat(kNegInf<float>);
  FV l[4] = {FV{}, FV{}, FV{}, FV{}};  // the row sum of each lane of an MMA quad (softmax.h reduce_sum)
  FVs s(static_cast<std::size_t>(block_n));
  for (std::int64_t nb = nb_hi - 1; nb >= nb_lo; --nb) {  // "We iterate over the blocks in reverse order"
    const bool first = nb == nb_hi - 1;
    const std::int64_t j0 = nb * block_n;
    FV m_tile = splat(kNegInf<float>);
    for (int c = 0; c < block_n; c += 2) {
      score_lanes_x2<F>(g, qt, k, row0, j0 + c, s[static_cast<std::size_t>(c)], s[static_cast<std::size_t>(c + 1)]);
      m_tile = vmax(m_tile, vmax(s[static_cast<std::size_t>(c)], s[static_cast<std::size_t>(c + 1)]));
    }
    // softmax_rescale_o: reduce_max (the quad all-reduce of a max is exact), then for a block after the
    // first scores_scale = exp2f((max_prev - max_cur) * scale_log2) with Check_inf (-inf counts as 0),
    // row_sum *= scale and acc_o *= scale.
    const FV m_prev = m;
    m = vmax(m, m_tile);
    FV rescale = splat(1.0f);
    if (!first) {
      const FV cur = m == kNegInf<float> ? FV{} : m;
      rescale = ex2_lanes((m_prev - cur) * sl2);
      for (auto& x : acc) x *= rescale;
    }
    // scale_apply_exp2 with PyTorch's UNFUSE_FMA (softmax.h: `#define UNFUSE_FMA`): max_scaled = max *
    // scale_log2 (0 for -inf), P = exp2f(__fmul_rn(S, scale_log2) - max_scaled); reduce_sum adds each lane's
    // columns 2q, 2q + 1, 8 + 2q, 9 + 2q, ... (q = lane % 4) of the block in order into its own row_sum.
    // After the first block, `row_sum(mi) *= scores_scale` (softmax_rescale_o) feeds only the first add of
    // reduce_sum<zero_init=false> (utils.h thread_reduce_: summary(mi) = op(summary(mi), tensor(mi, 0))),
    // and nvcc (-fmad=true, its default) contracts the two into one fma: row_sum = fma(row_sum,
    // scores_scale, P of the lane's first column) (the PTX nvcc 13.0 emits for these expressions, checked by
    // ctest -R fa2_softmax_ptx). On the first block zero_init starts row_sum at that P (0 + P here).
    const FV max_scaled = m == kNegInf<float> ? FV{} : m * sl2;
    for (int c = 0; c < block_n; ++c) {
      const FV p = ex2_lanes(s[static_cast<std::size_t>(c)] * sl2 - max_scaled);
      FV& sum = l[(c % 8) / 2];
      if (c < 8 && c % 2 == 0) {
        for (int lane = 0; lane < kFL; ++lane) sum[lane] = std::fma(sum[lane], rescale[lane], p[lane]);
      } else {
        sum += p;
      }
      const FV r = round_lanes<F>(p);  // convert_type<Element>(acc_s): P as the A operand of P V
      vstore(p16.data() + c * kFL, r);
      vstore(pe.data() + c * kFL, exponent_lanes<F>(r));
    }
    // gemm_rs(acc_o, tOrP, tOrVt): acc_o += P V over the block's keys in k-slices of 16.
    for (std::int64_t t = 0; t < g.d; t += 2)  // two columns of V at a time (d is even)
      for (int c0 = 0; c0 < block_n; c0 += 16)
        mma_lanes_x2<F>(acc[static_cast<std::size_t>(t)], acc[static_cast<std::size_t>(t + 1)], p16.data() + c0 * kFL,
                        pe.data() + c0 * kFL, kFL, vt.at(t, j0 + c0), vt.exp_at(t, j0 + c0), vt.at(t + 1, j0 + c0),
                        vt.exp_at(t + 1, j0 + c0), 1);
  }
  // normalize_softmax_lse: quad_allreduce_ of row_sum (shfl_xor 2, then 1: (s0 + s2) + (s1 + s3)),
  // inv_sum = 1 / sum (IEEE division; 1 for 0 or NaN), acc_o *= inv_sum, lse = row_max * softmax_scale +
  // __logf(sum), contracted to fma(row_max, softmax_scale, lg2.approx(sum) * ln2) (PTX of nvcc 13.0,
  // ctest -R fa2_softmax_ptx).
  const FV sum = (l[0] + l[2]) + (l[1] + l[3]);
  for (int lane = 0; lane < kFL; ++lane) {
    const float sm = sum[lane];
    const bool empty = sm == 0.0f || sm != sm;
    const float inv = empty ? 1.0f : 1.0f / sm;
    for (auto& x : acc) x[lane] *= inv;
    (*lse_out)[lane] = empty ? (split ? -INFINITY : INFINITY) : std::fma(m[lane], g.scale, nv::fast_logf(sm));
  }
}

// combine_attn_seqk_parallel for one row: the splits' fp32 outputs o_s ([d16] each) and lse_s. Its threads
// hold the splits l R + r (R = min(128 / kBlockM, kMaxSplits) rows per load, kBlockM 4, 8 or 16 by the
// head dim): each sums its own in order, then Allreduce<R> (offset R/2 first) for max and sum; lse =
// logf(sum) + max (0 max for all -inf; +inf for a zero or NaN sum), each split's weight expf(lse_s - lse),
// O = sum over splits in order of weight * o_s, contracted to fma.
inline float fa2_combine_row(const std::vector<float>& lse_s, const std::vector<const float*>& o_s, int d_instance,
                             std::int64_t d, float* o) {
  const int splits = static_cast<int>(lse_s.size());
  int max_splits = 2;
  while (max_splits < splits) max_splits *= 2;  // kMaxSplits = 1 << Log_max_splits, Log_max_splits >= 1
  const int block_m = d_instance % 128 == 0 ? 4 : (d_instance % 64 == 0 ? 8 : 16);
  const int rows_per_load = std::min(128 / block_m, max_splits);  // kRowsPerLoadTranspose
  const int per_thread = (max_splits * block_m + 127) / 128;      // kNLsePerThread
  auto lse_of = [&](int split) { return split < splits ? lse_s[static_cast<std::size_t>(split)] : -INFINITY; };
  std::vector<float> mx(static_cast<std::size_t>(rows_per_load)), sm(static_cast<std::size_t>(rows_per_load));
  for (int r = 0; r < rows_per_load; ++r) {
    float v = lse_of(r);
    for (int i = 1; i < per_thread; ++i) v = std::max(v, lse_of(i * rows_per_load + r));
    mx[static_cast<std::size_t>(r)] = v;
  }
  float lse_max = mx[0];
  for (int r = 1; r < rows_per_load; ++r) lse_max = std::max(lse_max, mx[static_cast<std::size_t>(r)]);
  if (lse_max == -INFINITY) lse_max = 0.0f;
  for (int r = 0; r < rows_per_load; ++r) {
    float v = nv::expf_accurate(lse_of(r) - lse_max);
    for (int i = 1; i < per_thread; ++i) v += nv::expf_accurate(lse_of(i * rows_per_load + r) - lse_max);
    sm[static_cast<std::size_t>(r)] = v;
  }
  for (int offset = rows_per_load / 2; offset >= 1; offset /= 2)
    for (int r = 0; r < offset; ++r) sm[static_cast<std::size_t>(r)] += sm[static_cast<std::size_t>(r + offset)];
  const float lse_sum = sm[0];
  const float lse = lse_sum == 0.0f || lse_sum != lse_sum ? INFINITY : nv::logf_accurate(lse_sum) + lse_max;
  for (std::int64_t t = 0; t < d; ++t) o[t] = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float w = nv::expf_accurate(lse_s[static_cast<std::size_t>(s)] - lse);
    for (std::int64_t t = 0; t < d; ++t) o[t] = std::fma(w, o_s[static_cast<std::size_t>(s)][t], o[t]);
  }
  return lse;
}

template <Format F>
void fa2_pytorch_forward_head(const AttentionShape& shape, int sm_count, const float* q, const float* k,
                              const float* v, float* o, float* lse) {
  const Fa2Geometry g = fa2_geometry(shape);
  const Fa2ForwardLaunch launch = fa2_forward_launch(shape, sm_count);
  const int block_n = launch.block_n;
  const std::int64_t n_blocks = (g.n + block_n - 1) / block_n;
  const std::int64_t keys = n_blocks * block_n;  // K, V zero padded to whole blocks (Clear_OOB_MN)
  Fa2Operand qt, kk, vt;
  qt.resize(g.d16, g.rows);
  kk.resize(keys, g.d16);
  vt.resize(g.d16, keys);
  for (std::int64_t i = 0; i < g.n; ++i)
    for (std::int64_t t = 0; t < g.d; ++t) {
      qt.set<F>(t, i, q[i * g.d + t]);
      kk.set<F>(i, t, k[i * g.d + t]);
      vt.set<F>(t, i, v[i * g.d + t]);
    }
  FVs acc;
  std::vector<float> p16;
  std::vector<std::int32_t> pe;
  const int splits = launch.num_splits;
  std::vector<std::vector<float>> o_split(static_cast<std::size_t>(splits));
  std::vector<float> lse_split(static_cast<std::size_t>(splits));
  FVs lse_vec(static_cast<std::size_t>(splits));
  std::vector<FVs> o_vec(static_cast<std::size_t>(splits));
  std::vector<const float*> parts(static_cast<std::size_t>(splits));
  std::vector<float> row_out(static_cast<std::size_t>(g.d16));
  for (std::int64_t row0 = 0; row0 < g.n; row0 += kFL) {
    const std::int64_t m_block = row0 / launch.block_m;  // kFL divides 64: a vector lies in one row block
    // n_block_max: the causal limit ceil((m_block + 1) block_m / block_n) (compute_attn_1rowblock{,_splitkv}).
    std::int64_t causal_max = n_blocks;
    if (g.causal) causal_max = std::min(n_blocks, ((m_block + 1) * launch.block_m + block_n - 1) / block_n);
    if (splits == 1) {
      FV lse_v;
      fa2_forward_rows<F>(g, qt, kk, vt, row0, block_n, 0, causal_max, false, acc, p16, pe, &lse_v);
      for (int lane = 0; lane < kFL && row0 + lane < g.n; ++lane) {
        const std::int64_t i = row0 + lane;
        for (std::int64_t t = 0; t < g.d; ++t) o[i * g.d + t] = round_to_format<F>(acc[static_cast<std::size_t>(t)][lane]);
        if (lse) lse[i] = lse_v[lane];
      }
      continue;
    }
    // The split-KV kernel: split s takes blocks [s bps, min(n_blocks, (s + 1) bps)) within the causal limit;
    // an empty split writes O = 0 and lse = -inf.
    for (int sidx = 0; sidx < splits; ++sidx) {
      const std::int64_t lo = static_cast<std::int64_t>(sidx) * launch.blocks_per_split;
      const std::int64_t hi = std::min(causal_max, std::min(n_blocks, lo + launch.blocks_per_split));
      if (lo >= hi) {
        o_vec[static_cast<std::size_t>(sidx)].assign(static_cast<std::size_t>(g.d16), FV{});
        lse_vec[static_cast<std::size_t>(sidx)] = splat(kNegInf<float>);
        continue;
      }
      fa2_forward_rows<F>(g, qt, kk, vt, row0, block_n, lo, hi, true, o_vec[static_cast<std::size_t>(sidx)], p16, pe,
                          &lse_vec[static_cast<std::size_t>(sidx)]);
    }
    for (int lane = 0; lane < kFL && row0 + lane < g.n; ++lane) {
      const std::int64_t i = row0 + lane;
      for (int sidx = 0; sidx < splits; ++sidx) {
        auto& os = o_split[static_cast<std::size_t>(sidx)];
        os.resize(static_cast<std::size_t>(g.d));
        for (std::int64_t t = 0; t < g.d; ++t) os[static_cast<std::size_t>(t)] = o_vec[static_cast<std::size_t>(sidx)][static_cast<std::size_t>(t)][lane];
        parts[static_cast<std::size_t>(sidx)] = os.data();
        lse_split[static_cast<std::size_t>(sidx)] = lse_vec[static_cast<std::size_t>(sidx)][lane];
      }
      const float l = fa2_combine_row(lse_split, parts, launch.head_dim_instance, g.d, row_out.data());
      for (std::int64_t t = 0; t < g.d; ++t) o[i * g.d + t] = round_to_format<F>(row_out[static_cast<std::size_t>(t)]);
      if (lse) lse[i] = l;
    }
  }
}

// compute_dot_do_o's dot_do_o for one row: each of `threads` threads sums its 8-column chunks (page width
// 8 threads) in order, the first product plain, the rest contracted to fma, then Allreduce (offset
// threads/2 first), times p_dropout (1). Columns past d are the kernel's zero padding (adding 0 * 0 is
// exact, so they are left out).
inline float fa2_dot_do_o(const float* dout, const float* o, std::int64_t d, int threads, std::vector<float>& partial) {
  const std::int64_t page = 8 * threads;
  partial.assign(static_cast<std::size_t>(threads), 0.0f);
  for (int r = 0; r < threads; ++r) {
    bool started = false;
    float acc = 0.0f;
    for (std::int64_t p0 = 0; p0 < d; p0 += page)
      for (std::int64_t t = p0 + 8 * r; t < std::min(d, p0 + 8 * r + 8); ++t) {
        acc = started ? std::fma(dout[t], o[t], acc) : dout[t] * o[t];
        started = true;
      }
    partial[static_cast<std::size_t>(r)] = acc;
  }
  for (int offset = threads / 2; offset >= 1; offset /= 2)
    for (int r = 0; r < offset; ++r) partial[static_cast<std::size_t>(r)] += partial[static_cast<std::size_t>(r + offset)];
  return partial[0];
}

template <Format F>
void fa2_pytorch_backward_head(const AttentionShape& shape, int sm_count, const float* q, const float* k,
                               const float* v, const float* o, const float* lse, const float* dout, float* dq,
                               float* dk, float* dv) {
  const Fa2Geometry g = fa2_geometry(shape);
  const Fa2BackwardLaunch launch = fa2_backward_launch(shape, sm_count);
  const int bm = launch.block_m, bn = launch.block_n;
  const std::int64_t m_blocks = (g.n + bm - 1) / bm, n_blocks = (g.n + bn - 1) / bn;
  const std::int64_t rows = m_blocks * bm, keys = n_blocks * bn;  // zero padded to whole blocks
  // A operands with lanes over rows ([t][rows]: Q^T, dO^T), B operands of scalars per key ([keys][t]: K, V),
  // and the row-major [rows][t] operands whose vectors run over t (Q, dO, K for dK, dV, dQ).
  Fa2Operand qt, dot, kk, vv, qr, dor;
  qt.resize(g.d16, rows);
  dot.resize(g.d16, rows);
  kk.resize(keys, g.d16);
  vv.resize(keys, g.d16);
  qr.resize(rows, g.d16);
  dor.resize(rows, g.d16);
  for (std::int64_t i = 0; i < g.n; ++i)
    for (std::int64_t t = 0; t < g.d; ++t) {
      qt.set<F>(t, i, q[i * g.d + t]);
      qr.set<F>(i, t, q[i * g.d + t]);
      dot.set<F>(t, i, dout[i * g.d + t]);
      dor.set<F>(i, t, dout[i * g.d + t]);
      kk.set<F>(i, t, k[i * g.d + t]);
      vv.set<F>(i, t, v[i * g.d + t]);
    }
  // compute_dot_do_o: D = rowsum(dO * O) on the forward's O as stored (F); scale_apply_exp2<Scale_max=false>
  // in the backward subtracts lse * float(M_LOG2E) (0 for -inf; an empty row's +inf gives P = 0).
  std::vector<float> delta(static_cast<std::size_t>(rows), 0.0f), lse2(static_cast<std::size_t>(rows), INFINITY);
  std::vector<float> o_row(static_cast<std::size_t>(g.d)), do_row(static_cast<std::size_t>(g.d)), partial;
  const float log2e = static_cast<float>(1.44269504088896340736);
  for (std::int64_t i = 0; i < g.n; ++i) {
    for (std::int64_t t = 0; t < g.d; ++t) {
      o_row[static_cast<std::size_t>(t)] = round_to_format<F>(o[i * g.d + t]);
      do_row[static_cast<std::size_t>(t)] = round_to_format<F>(dout[i * g.d + t]);
    }
    delta[static_cast<std::size_t>(i)] = fa2_dot_do_o(do_row.data(), o_row.data(), g.d, launch.dot_do_o_threads, partial);
    const float l = lse[i];
    lse2[static_cast<std::size_t>(i)] = l == -INFINITY ? 0.0f : l * log2e;
  }
  const FV sl2 = splat(g.scale_log2);
  // P and dS of one (KV block, row block) as [key][rows of the block] (values of F and exponents).
  std::vector<float> p16(static_cast<std::size_t>(bn * bm)), ds16(static_cast<std::size_t>(bn * bm));
  std::vector<std::int32_t> pe(p16.size()), dse(ds16.size());
  std::vector<float> acc_dk(static_cast<std::size_t>(bn * g.d16)), acc_dv(acc_dk.size());
  std::vector<float> dq_accum(static_cast<std::size_t>(launch.dq_splits * rows * g.d16), 0.0f);
  for (std::int64_t nb = 0; nb < n_blocks; ++nb) {  // one thread block per KV block
    const std::int64_t j0 = nb * bn;
    std::fill(acc_dk.begin(), acc_dk.end(), 0.0f);
    std::fill(acc_dv.begin(), acc_dv.end(), 0.0f);
    // m_block from m_block_max - 1 down to m_block_min (causal: n_block * kBlockN / kBlockM).
    const std::int64_t mb_min = g.causal ? (nb * bn) / bm : 0;
    for (std::int64_t mb = m_blocks - 1; mb >= mb_min; --mb) {
      const std::int64_t i0 = mb * bm;
      for (std::int64_t r0 = 0; r0 < bm; r0 += kFL) {
        const std::int64_t row0 = i0 + r0;
        FV lse_v, d_v;
        for (int l = 0; l < kFL; ++l) {
          lse_v[l] = lse2[static_cast<std::size_t>(row0 + l)];
          d_v[l] = delta[static_cast<std::size_t>(row0 + l)];
        }
        for (int c = 0; c < bn; ++c) {
          // S = Q K^T (gemm), masked; P = exp2f(__fmul_rn(S, scale_log2) - lse * log2e) in fp32.
          const FV s = score_lanes<F>(g, qt, kk, row0, j0 + c);
          const FV p = ex2_lanes(s * sl2 - lse_v);
          // dP = dO V^T (gemm); dS = P (dP - D) on the fp32 P (pointwise_mult), then both as F.
          FV dp{};
          for (std::int64_t t = 0; t < g.d16; t += 16)
            dp = mma_lanes<F>(dp, dot.at(t, row0), dot.exp_at(t, row0), dot.ld, vv.at(j0 + c, t), vv.exp_at(j0 + c, t), 1);
          const FV ds = p * (dp - d_v);
          const FV pr = round_lanes<F>(p), dsr = round_lanes<F>(ds);
          const std::size_t at = static_cast<std::size_t>(c * bm + r0);
          vstore(p16.data() + at, pr);
          vstore(pe.data() + at, exponent_lanes<F>(pr));
          vstore(ds16.data() + at, dsr);
          vstore(dse.data() + at, exponent_lanes<F>(dsr));
        }
      }
      // dV += P^T dO and dK += dS^T Q over the row block's rows in k-slices of 16 (lanes over t).
      for (int c = 0; c < bn; ++c)
        for (std::int64_t t = 0; t < g.d16; t += kFL) {
          FV av = vload(acc_dv.data() + c * g.d16 + t), ak = vload(acc_dk.data() + c * g.d16 + t);
          for (int r = 0; r < bm; r += 16) {
            av = mma_lanes<F>(av, dor.at(i0 + r, t), dor.exp_at(i0 + r, t), dor.ld, p16.data() + c * bm + r,
                              pe.data() + c * bm + r, 1);
            ak = mma_lanes<F>(ak, qr.at(i0 + r, t), qr.exp_at(i0 + r, t), qr.ld, ds16.data() + c * bm + r,
                              dse.data() + c * bm + r, 1);
          }
          vstore(acc_dv.data() + c * g.d16 + t, av);
          vstore(acc_dk.data() + c * g.d16 + t, ak);
        }
      // dQ = dS K over the KV block's keys (a fresh accumulator), added into dq_accum split nb % dq_splits
      // (deterministic mode; with atomicAdd the GPU's order of these adds varies).
      float* accum = dq_accum.data() + (nb % launch.dq_splits) * rows * g.d16;
      for (int r = 0; r < bm; ++r)
        for (std::int64_t t = 0; t < g.d16; t += kFL) {
          FV a{};
          for (int c0 = 0; c0 < bn; c0 += 16)
            a = mma_lanes<F>(a, kk.at(j0 + c0, t), kk.exp_at(j0 + c0, t), kk.ld, ds16.data() + c0 * bm + r,
                             dse.data() + c0 * bm + r, bm);
          float* dst = accum + (i0 + r) * g.d16 + t;
          vstore(dst, vload(dst) + a);
        }
    }
    // Epilogue: dK = acc_dk * softmax_scale (scale_softmax_rp_dropout), dV = acc_dv, each converted to F.
    for (std::int64_t c = 0; c < bn && j0 + c < g.n; ++c)
      for (std::int64_t t = 0; t < g.d; ++t) {
        dk[(j0 + c) * g.d + t] = round_to_format<F>(acc_dk[static_cast<std::size_t>(c * g.d16 + t)] * g.scale);
        dv[(j0 + c) * g.d + t] = round_to_format<F>(acc_dv[static_cast<std::size_t>(c * g.d16 + t)]);
      }
  }
  // convert_dQ: the splits summed in order from 0, times softmax_scale, converted to F.
  for (std::int64_t i = 0; i < g.n; ++i)
    for (std::int64_t t = 0; t < g.d; ++t) {
      float acc = 0.0f;
      for (int s = 0; s < launch.dq_splits; ++s) acc += dq_accum[static_cast<std::size_t>((s * rows + i) * g.d16 + t)];
      dq[i * g.d + t] = round_to_format<F>(acc * g.scale);
    }
}

// The heads [head_begin, head_end) of a call under launch = "pytorch" (fp16 or bf16 storage).
inline void fa2_pytorch_forward_heads(const AttentionShape& shape, const AttentionParams& params, const float* q,
                                      const float* k, const float* v, float* o, float* lse, std::int64_t head_begin,
                                      std::int64_t head_end) {
  const std::int64_t per_head = shape.seq_len * shape.head_dim;
  for (std::int64_t h = head_begin; h < head_end; ++h) {
    float* lse_head = lse ? lse + h * shape.seq_len : nullptr;
    if (params.policy.q == Format::fp16)
      fa2_pytorch_forward_head<Format::fp16>(shape, params.sm_count, q + h * per_head, k + h * per_head,
                                             v + h * per_head, o + h * per_head, lse_head);
    else
      fa2_pytorch_forward_head<Format::bf16>(shape, params.sm_count, q + h * per_head, k + h * per_head,
                                             v + h * per_head, o + h * per_head, lse_head);
  }
}

inline void fa2_pytorch_backward_heads(const AttentionShape& shape, const AttentionParams& params, const float* q,
                                       const float* k, const float* v, const float* o, const float* lse,
                                       const float* dout, float* dq, float* dk, float* dv, std::int64_t head_begin,
                                       std::int64_t head_end) {
  const std::int64_t per_head = shape.seq_len * shape.head_dim;
  for (std::int64_t h = head_begin; h < head_end; ++h) {
    const std::int64_t at = h * per_head;
    const float* lse_head = lse + h * shape.seq_len;
    if (params.policy.q == Format::fp16)
      fa2_pytorch_backward_head<Format::fp16>(shape, params.sm_count, q + at, k + at, v + at, o + at, lse_head,
                                              dout + at, dq + at, dk + at, dv + at);
    else
      fa2_pytorch_backward_head<Format::bf16>(shape, params.sm_count, q + at, k + at, v + at, o + at, lse_head,
                                              dout + at, dq + at, dk + at, dv + at);
  }
}

}  // namespace
}  // namespace fastudy
