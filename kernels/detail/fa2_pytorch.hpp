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

// The AVX-512 and AVX2 builds switch their target with `#pragma GCC target` (kernels/attention_isa_*.cpp),
// which leaves __AVX512F__ and __AVX2__ undefined: the vector width names the instruction set.
#if defined(__x86_64__) && FASTUDY_VEC_BYTES == 64
#define FASTUDY_FA2_AVX512 1
#else
#define FASTUDY_FA2_AVX512 0
#endif
#if defined(__x86_64__) && FASTUDY_VEC_BYTES == 32
#define FASTUDY_FA2_AVX2 1
#else
#define FASTUDY_FA2_AVX2 0
#endif

namespace fastudy {
namespace {

using FV = vec_t<float>;
using IV = vec_t<std::int32_t>;
using UV = vec_t<std::uint32_t>;
constexpr int kFL = kLanes<float>;
typedef double DVL __attribute__((vector_size(kFL * 8)));
typedef std::int64_t LVL __attribute__((vector_size(kFL * 8)));
typedef std::int8_t E8V __attribute__((vector_size(kFL)));  // one int8 exponent per lane

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
#if FASTUDY_FA2_AVX512
  return _mm512_test_epi32_mask((__m512i)m, (__m512i)m) != 0;
#elif FASTUDY_FA2_AVX2
  return !_mm256_testz_si256((__m256i)m, (__m256i)m);
#elif defined(__SSE2__) && FASTUDY_VEC_BYTES == 16
  return _mm_movemask_ps((__m128)m) != 0;
#else
  bool any = false;
  for (int l = 0; l < kFL; ++l) any |= m[l] != 0;
  return any;
#endif
}

// Whether a lane of x is NaN / not finite (one compare into a mask where the build has AVX-512).
FASTUDY_INLINE bool any_nan(FV x) {
#if FASTUDY_FA2_AVX512
  return _mm512_cmp_ps_mask((__m512)x, (__m512)x, _CMP_UNORD_Q) != 0;
#else
  return any_lane(x != x);
#endif
}
FASTUDY_INLINE IV nonfinite_lanes(FV x) { return ((IV)x & 0x7F800000) == 0x7F800000; }
FASTUDY_INLINE bool any_nonfinite(FV x) {
#if FASTUDY_FA2_AVX512
  return _mm512_fpclass_ps_mask((__m512)x, 0x99) != 0;  // quiet NaN, +inf, -inf, signalling NaN
#else
  return any_lane(nonfinite_lanes(x));
#endif
}

FASTUDY_INLINE E8V load_e8(const std::int8_t* p) {
  E8V v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
FASTUDY_INLINE void store_e8(std::int8_t* p, E8V v) { __builtin_memcpy(p, &v, sizeof v); }
typedef std::uint8_t U8V __attribute__((vector_size(kFL)));
FASTUDY_INLINE void store_u8(std::uint8_t* p, U8V v) { __builtin_memcpy(p, &v, sizeof v); }
// L uint8 values widened to int32 lanes (vpmovzxbd where the build has it).
FASTUDY_INLINE IV load_u8_lanes(const std::uint8_t* p) {
#if FASTUDY_FA2_AVX512
  return (IV)_mm512_maskz_cvtepu8_epi32(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#elif FASTUDY_FA2_AVX2
  return (IV)_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#else
  U8V v;
  __builtin_memcpy(&v, p, sizeof v);
  return __builtin_convertvector(v, IV);
#endif
}
// L int8 values widened to int32 lanes (vpmovsxbd where the build has it).
FASTUDY_INLINE IV load_e8_lanes(const std::int8_t* p) {
#if FASTUDY_FA2_AVX512
  return (IV)_mm512_maskz_cvtepi8_epi32(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#elif FASTUDY_FA2_AVX2
  return (IV)_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#else
  return __builtin_convertvector(load_e8(p), IV);
#endif
}

// One mma.sync dot product (k = 16) per lane (kernels/mma_model.hpp's dot_k16, the same arithmetic on L
// independent lanes): lane l's 16 A values are a[i * lda + l], the 16 B values, shared by the lanes, are
// b[i * ldb]; the exponents e_a + e_b (mma::split's e) of the A and B values come precomputed as
// integers. The terms are aligned and truncated as integers in units of 2^(e_max - 25): each product a_i
// b_i is exact in fp32 (22 significant bits at most), scaling it by 2^(25 - e_max) is exact, and the
// truncating conversion to int32 is MMA-Sim's truncation of the term. The vector path holds where e_max is
// in [-100, 100] (and so every operand and the sum are far from fp32's range ends) and the operands are
// finite; each lane that it does not hold for takes mma::dot_k16 itself (mma_lanes_fixup). The exponent
// maxima come from exponent_max_tile, for a chunk's outputs at once; mma_chunk is then one output's dot
// products with the chunk's 16 A vectors held in registers.

// One operand's exponents for the dot products (mma::split's e, precomputed): int8, [R][C] with R
// along the dot product (d for Q^T and K^T, the keys for V), zero padded (zero's exponent -126). Finite
// values' exponents fit ([-126, 127]); inf and NaN (exponent 128) are stored as 127, and poison[(r / 16) C +
// c] is 127 where the chunk of 16 along R at column c holds one, else -128; `any` says whether one does.
struct Fa2Exponents {
  std::vector<std::int8_t> e, poison;
  std::int64_t ld = 0;
  bool any = false;
  void resize(std::int64_t rows, std::int64_t cols) {
    ld = cols;
    e.assign(static_cast<std::size_t>(rows * cols), static_cast<std::int8_t>(mma::kZeroExponent));
    poison.assign(static_cast<std::size_t>(rows / 16 * cols), -128);
    any = false;
  }
  void mark_special(std::int64_t r, std::int64_t c) {
    poison[static_cast<std::size_t>(r / 16 * ld + c)] = 127;
    any = true;
  }
  std::int8_t* at(std::int64_t r, std::int64_t c) { return e.data() + r * ld + c; }
  const std::int8_t* at(std::int64_t r, std::int64_t c) const { return e.data() + r * ld + c; }
  const std::int8_t* poison_at(std::int64_t r, std::int64_t c) const { return poison.data() + r / 16 * ld + c; }
};

// The exponent step of a chunk of 16 products for `count` outputs (a multiple of 4) at once, mma's e_max
// without its accumulator: E = max over i < 16 of ea[i lda + l] + eb[i ldb + o] (the A exponents of lane l,
// the B exponents of output o), clamped to [-127, 127] and stored biased, e[o L + l] = E + 127 (2^E's
// exponent field). The clamp keeps e_max exact wherever it decides anything: x -> min(max(x, -127), 127) is
// monotonic, so the maximum of the clamped (saturated) sums is the clamped maximum; where that is inside
// [-100, 100] it is the maximum itself, and where the maximum is above 127 (clamped: 127) or below -127
// (-127, under every accumulator's exponent, at least -126) the dot product's e_max is above 100 or the
// accumulator's, as without the clamp.
// AVX-512: 64 int8 lanes, [4 outputs][16 lanes]; the A exponents of the 16 lanes are repeated in each
// 128-bit lane, and output q's B exponent is spread over 128-bit lane q (vpshufb of the 4 bytes). (The
// maskz forms of the intrinsics here: the plain ones trip GCC 12's -Wmaybe-uninitialized in its header.)
FASTUDY_INLINE void exponent_max_tile(std::uint8_t* e, const std::int8_t* ea, std::int64_t lda, const std::int8_t* eb,
                                      std::int64_t ldb, std::int64_t count) {
#if FASTUDY_FA2_AVX512
  const __m512i spread = _mm512_set_epi32(0x03030303, 0x03030303, 0x03030303, 0x03030303, 0x02020202, 0x02020202,
                                          0x02020202, 0x02020202, 0x01010101, 0x01010101, 0x01010101, 0x01010101, 0, 0,
                                          0, 0);
  __m512i a[16];
  for (int i = 0; i < 16; ++i)
    a[i] = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(ea + i * lda)));
  for (std::int64_t o = 0; o < count; o += 4) {
    __m512i m = _mm512_set1_epi8(-127);
    for (int i = 0; i < 16; ++i) {
      std::int32_t four;
      std::memcpy(&four, eb + i * ldb + o, sizeof four);
      m = _mm512_max_epi8(m, _mm512_adds_epi8(a[i], _mm512_shuffle_epi8(_mm512_set1_epi32(four), spread)));
    }
    _mm512_storeu_si512(e + o * kFL, _mm512_add_epi8(m, _mm512_set1_epi8(127)));  // [0, 254] as bytes
  }
#else
  IV a[16];
  for (int i = 0; i < 16; ++i) a[i] = load_e8_lanes(ea + i * lda);
  for (std::int64_t o = 0; o < count; ++o) {
    IV m = IV{} - 127;
    for (int i = 0; i < 16; ++i) m = vmax(m, a[i] + static_cast<std::int32_t>(eb[i * ldb + o]));
    store_u8(e + o * kFL, __builtin_convertvector((m > 127 ? IV{} + 127 : m) + 127, U8V));
  }
#endif
}

// The outputs whose chunk holds an inf or NaN (lanes where pa[l] > 0, outputs where pb[o] > 0; null when
// none can) get the exponent 127 (stored 254), out of the vector path's range: they take mma::dot_k16.
inline void poison_tile(std::uint8_t* e, std::int64_t count, const std::int8_t* pa, const std::int8_t* pb) {
  for (std::int64_t o = 0; o < count; ++o)
    for (int l = 0; l < kFL; ++l)
      if ((pa && pa[l] > 0) || (pb && pb[o] > 0)) e[o * kFL + l] = 254;
}

// The truncated sum (units of 2^(e_max - 25)) rounded to fp32 toward zero: 24 significant bits (embedded
// rounding on AVX-512; elsewhere exactly in fp64, whose low 29 fraction bits are cleared).
FASTUDY_INLINE FV to_fp32_toward_zero(IV sum) {
#if FASTUDY_FA2_AVX512
  return (FV)_mm512_maskz_cvt_roundepi32_ps(0xFFFF, (__m512i)sum, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
#else
  const DVL exact = __builtin_convertvector(sum, DVL);
  return __builtin_convertvector((DVL)((LVL)exact & ~((std::int64_t{1} << 29) - 1)), FV);
#endif
}

// Whether the vector path holds in every lane: e_max (emax, 2^e_max's bits) in [-100, 100], and the int32 sum
// of the 17 terms exact. Each term is below 2^27 units, so the true sum T lies within 2^31 + 2^26 of 0 and
// the int32 sum W is T modulo 2^32; |W| <= 2^31 - 2^26 leaves T = W as the only value in that range.
FASTUDY_INLINE bool lanes_exact(IV emax, IV sum) {
  constexpr std::uint32_t kRange = 200u << 23, kBound = 0x7C000000u;  // 2^31 - 2^26
#if FASTUDY_FA2_AVX512
  const __mmask16 in_range = _mm512_cmple_epu32_mask(_mm512_sub_epi32((__m512i)emax, _mm512_set1_epi32(27 << 23)),
                                                     _mm512_set1_epi32(static_cast<int>(kRange)));
  return _mm512_mask_cmple_epu32_mask(in_range, _mm512_maskz_abs_epi32(0xFFFF, (__m512i)sum),
                                      _mm512_set1_epi32(static_cast<int>(kBound))) == 0xFFFF;
#else
  const UV magnitude = sum < 0 ? UV{} - (UV)sum : (UV)sum;
  return !any_lane(((UV)(emax - (27 << 23)) > kRange) | (magnitude > kBound));
#endif
}

// The lanes where lanes_exact fails, by mma::dot_k16 (a lane whose accumulator is zero and whose A values or
// B values are all zero, the others finite, is +0 without it: the causal mask's zero P and dS, zero padding).
template <Format F>
__attribute__((noinline, cold)) FV mma_lanes_fixup(FV out, IV emax, IV sum, FV acc, const float* a, std::int64_t lda,
                                                   const float* b, std::int64_t ldb) {
  float bv[16];
  bool b_finite = true, b_zero = true;
  for (int i = 0; i < 16; ++i) {
    bv[i] = b[i * ldb];
    b_finite &= std::isfinite(bv[i]);
    b_zero &= bv[i] == 0.0f;
  }
  for (int l = 0; l < kFL; ++l) {
    const std::uint32_t magnitude = sum[l] < 0 ? 0u - static_cast<std::uint32_t>(sum[l]) : static_cast<std::uint32_t>(sum[l]);
    if (static_cast<std::uint32_t>(emax[l] - (27 << 23)) <= (200u << 23) && magnitude <= 0x7C000000u) continue;
    float av[16];
    bool a_finite = true, a_zero = true;
    for (int i = 0; i < 16; ++i) {
      av[i] = a[i * lda + l];
      a_finite &= std::isfinite(av[i]);
      a_zero &= av[i] == 0.0f;
    }
    const bool zero = acc[l] == 0.0f && ((a_zero && b_finite) || (b_zero && a_finite));
    out[l] = zero ? 0.0f : mma::dot_k16<F>(av, bv, acc[l]);
  }
  return out;
}

// mma_chunk: the dot products of one chunk for one output (B values b[i * ldb]), the 16 A vectors in a (also
// at a_mem for the fixup), e8 the output's biased exponent maxima from exponent_max_tile. kZeroAcc: acc is +0.
template <Format F, bool kZeroAcc>
FASTUDY_INLINE FV mma_chunk(FV acc, const FV* a, const float* b, std::int64_t ldb, const std::uint8_t* e8,
                            const float* a_mem, std::int64_t lda) {
  // e_max as the bits of 2^e_max: the larger of the accumulator's exponent field (0 for zero and subnormals,
  // whose exponent -126 decides nothing in range: e_max >= -100 > -126 there) and the products'.
  const IV products = load_u8_lanes(e8) << 23;
  const IV emax = kZeroAcc ? products : vmax((IV)acc & 0x7F800000, products);
  const FV scale = (FV)((279u << 23) - (UV)emax);  // 2^(25 - e_max)
  IV sum = kZeroAcc ? IV{} : __builtin_convertvector(acc * scale, IV);
  for (int i = 0; i < 16; ++i) sum += __builtin_convertvector(a[i] * b[i * ldb] * scale, IV);
  FV out = to_fp32_toward_zero(sum) * (FV)((UV)emax - (25u << 23));  // times 2^(e_max - 25)
  if (__builtin_expect(!lanes_exact(emax, sum), 0)) out = mma_lanes_fixup<F>(out, emax, sum, acc, a_mem, lda, b, ldb);
  return out;
}

// The special function unit's ex2 table (nv::kSfuEx2) by column, for lookups of 16 lanes at once.
struct SfuColumns {
  alignas(64) std::int32_t value[64];
  alignas(64) std::int32_t slope[64];
  alignas(64) std::int32_t curvature[64];
};
constexpr SfuColumns sfu_ex2_columns() {
  SfuColumns c{};
  for (int i = 0; i < 64; ++i) {
    c.value[i] = nv::kSfuEx2[i].value;
    c.slope[i] = nv::kSfuEx2[i].slope;
    c.curvature[i] = nv::kSfuEx2[i].curvature;
  }
  return c;
}
inline constexpr SfuColumns kSfuEx2Columns = sfu_ex2_columns();

// table[idx] lane by lane for a 64-entry table (idx < 64): two-table permutes and a blend on AVX-512, a
// gather on AVX2.
FASTUDY_INLINE IV lookup64(const std::int32_t* table, IV idx) {
#if FASTUDY_FA2_AVX512
  const __m512i* t = reinterpret_cast<const __m512i*>(table);
  const __m512i low = _mm512_permutex2var_epi32(t[0], (__m512i)idx, t[1]);
  const __m512i high = _mm512_permutex2var_epi32(t[2], (__m512i)idx, t[3]);
  return (IV)_mm512_mask_blend_epi32(_mm512_test_epi32_mask((__m512i)idx, _mm512_set1_epi32(32)), low, high);
#elif FASTUDY_FA2_AVX2
  return (IV)_mm256_i32gather_epi32(table, (__m256i)idx, 4);
#else
  IV out;
  for (int l = 0; l < kFL; ++l) out[l] = table[idx[l]];
  return out;
#endif
}

// nv::sfu_square on lanes: bit i of r adds r >> (18 - i), that is the partial products r_i r_k 2^(i + k - 18)
// of r^2 / 2^18 with i + k >= 18, halved. With r = rh 2^9 + rl: all of rh^2 (i, k >= 9), none of rl^2 (i, k
// <= 8), and of the cross terms twice sum over i = 10..16 of r_i (rl >> (18 - i)); halved, rh^2 >> 1 plus
// that sum (the same value for each of the 2^17 remainders: tests/kernels/test_fa2_pytorch_lanes).
FASTUDY_INLINE IV sfu_square_lanes(IV r) {
  const IV rh = r >> 9, rl = r & 0x1FF;
#if FASTUDY_FA2_AVX512
  // rh^2 by vpmaddwd (rh < 2^8 in the low half of each lane), each term an add under bit i's mask.
  IV sq = (IV)_mm512_madd_epi16((__m512i)rh, (__m512i)rh) >> 1;
  for (int i = 10; i < 17; ++i)
    sq = (IV)_mm512_mask_add_epi32((__m512i)sq, _mm512_test_epi32_mask((__m512i)r, _mm512_set1_epi32(1 << i)),
                                   (__m512i)sq, (__m512i)(rl >> (18 - i)));
  return sq;
#else
  IV sq = (rh * rh) >> 1;
  for (int i = 10; i < 17; ++i) sq += (r & (1 << i)) != 0 ? rl >> (18 - i) : IV{};
  return sq;
#endif
}

// ex2.approx.f32 (exp2f) on a vector: nv::ex2_approx's steps lane by lane (the same bits; NaN lanes take
// the scalar model). The interpolation's sum A 2^13 + B r + C sq + 0x77E2 (below 2^41) is formed in two
// int32 halves, r = rh 2^9 + rl: H = A 2^4 + B rh (< 2^31) and L = B rl + C sq + 0x77E2 (< 2^27), and
// (H 2^9 + L) >> 15 = (H + (L >> 9)) >> 6.
FASTUDY_INLINE FV ex2_lanes(FV x) {
  if (__builtin_expect(any_nan(x), 0)) {
    FV out{};
    for (int l = 0; l < kFL; ++l) out[l] = nv::ex2_approx(x[l]);
    return out;
  }
  const IV halved = x < -126.0f;  // the compiler's expansion: MUFU.EX2(x / 2) squared
  const FV xh = halved ? x * 0.5f : x;
  const IV negative = (IV)xh < 0;
  const IV big = ((IV)xh & 0x7FFFFFFF) >= (134 << 23);  // |x| >= 128 and +-inf: 0 or +inf by the sign
  // The 7.23 fixed-point magnitude, truncated (a subnormal or zero x goes to 0): |x| 2^23 is exact, below
  // 2^30 where |x| < 128, and the conversion truncates.
  const IV fixed = __builtin_convertvector((FV)((IV)xh & 0x7FFFFFFF) * 8388608.0f, IV);
  IV ipart = fixed >> 23, f = fixed & 0x7FFFFF;
  const IV nonzero = f != 0;
  ipart = negative ? nonzero - ipart : ipart;  // -ipart - 1 where f != 0 (nonzero is -1 there), else -ipart
  f = negative & nonzero ? ~f & 0x7FFFFF : f;
  const IV seg = f >> 17, r = f & 0x1FFFF;
  const IV sq = sfu_square_lanes(r);
  const IV a = lookup64(kSfuEx2Columns.value, seg), b = lookup64(kSfuEx2Columns.slope, seg);
  const IV c = lookup64(kSfuEx2Columns.curvature, seg);
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
// exponent (a subnormal of F keeps it), -126 for zero (which the floor gives already where F's smallest
// normal exponent is -126: bf16).
template <Format F>
FASTUDY_INLINE IV exponent_lanes(FV x) {
  const IV field = ((IV)x >> 23) & 0xFF;
  const IV e = field - 127;
  const IV floor = IV{} + FormatTraits<F>::emin;
  const IV clamped = e > floor ? e : floor;
  if constexpr (FormatTraits<F>::emin == mma::kZeroExponent) return clamped;
  else return x == 0.0f ? IV{} + mma::kZeroExponent : clamped;
}

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

// One input tensor ([N, d]) rounded to F in the layouts the dot products read, zero padded to R rows (whole
// vectors or KV blocks) and d16 columns: its values by rows ([R][d16]: the B scalars of S = Q K^T and dP = dO
// V^T, the A vectors of dV, dK and dQ, lanes along d) and by columns ([d16][R]: the A vectors of S and dP,
// lanes along the rows; the B scalars of P V), and their exponents for exponent_max_tile the same two ways
// (rows_e: chunks of 16 rows; cols_e: of 16 columns). In cols_e the padded rows are lanes or outputs and take
// the exponent 0 rather than zero's -126: their dot products, zero and never read, stay on the vector path.
// Each layout only where the kernel reads it (Fa2Layout).
enum Fa2Layout : unsigned { kByRows = 1, kByCols = 2, kExpByRows = 4, kExpByCols = 8 };
struct Fa2Layouts {
  std::vector<float> rows, cols;
  Fa2Exponents rows_e, cols_e;
  std::int64_t r = 0, d16 = 0;
  const float* row_at(std::int64_t i, std::int64_t t) const { return rows.data() + i * d16 + t; }
  const float* col_at(std::int64_t t, std::int64_t i) const { return cols.data() + t * r + i; }
};

// The exponents the vector path reads for values of F, lane by lane (exponent_lanes: mma::split's e), as
// int8; 127 for inf and NaN, whose chunks are poisoned.
template <Format F>
FASTUDY_INLINE E8V exponents8(FV f) {
  return __builtin_convertvector(nonfinite_lanes(f) ? IV{} + 127 : exponent_lanes<F>(f), E8V);
}

// x's rows rounded to F L values at a time, with their exponents, L rows at a time so that the layouts by
// columns are written a whole vector at a time from a [d16][L] staging tile; each inf or NaN marked.
template <Format F>
void fa2_layouts(const float* x, std::int64_t n, std::int64_t d, std::int64_t d16, std::int64_t r, unsigned want,
                 Fa2Layouts& out) {
  out.r = r;
  out.d16 = d16;
  out.rows.assign(want & kByRows ? static_cast<std::size_t>(r * d16) : 0, 0.0f);
  out.cols.assign(want & kByCols ? static_cast<std::size_t>(d16 * r) : 0, 0.0f);
  out.rows_e.resize(want & kExpByRows ? r : 0, d16);
  out.cols_e.resize(want & kExpByCols ? d16 : 0, r);
  if (want & kExpByCols)
    for (std::int64_t t = 0; t < d16; ++t) std::fill(out.cols_e.at(t, n), out.cols_e.at(t, 0) + r, 0);
  std::vector<float> row(static_cast<std::size_t>(d16), 0.0f);  // one input row, zero padded to d16
  FVs col_tile(static_cast<std::size_t>(d16));
  std::vector<std::int8_t> col_e_tile(static_cast<std::size_t>(d16 * kFL));
  for (std::int64_t i0 = 0; i0 < n; i0 += kFL) {
    const int valid = static_cast<int>(std::min<std::int64_t>(kFL, n - i0));
    std::fill(col_tile.begin(), col_tile.end(), FV{});
    for (std::int64_t t = 0; t < d16; ++t)
      for (int l = 0; l < kFL; ++l)
        col_e_tile[static_cast<std::size_t>(t * kFL + l)] = l < valid ? static_cast<std::int8_t>(mma::kZeroExponent) : 0;
    for (int lane = 0; lane < valid; ++lane) {
      const std::int64_t i = i0 + lane;
      std::memcpy(row.data(), x + i * d, static_cast<std::size_t>(d) * sizeof(float));
      for (std::int64_t t0 = 0; t0 < d; t0 += kFL) {
        const FV f = round_lanes<F>(vload(row.data() + t0));
        const E8V e8 = exponents8<F>(f);
        if (__builtin_expect(any_nonfinite(f), 0)) {
          const IV special = nonfinite_lanes(f);
          for (int l = 0; l < kFL; ++l) {
            if (!special[l]) continue;
            if (want & kExpByRows) out.rows_e.mark_special(i, t0 + l);
            if (want & kExpByCols) out.cols_e.mark_special(t0 + l, i);
          }
        }
        if (want & kByRows) vstore(out.rows.data() + i * d16 + t0, f);
        if (want & kExpByRows) store_e8(out.rows_e.at(i, t0), e8);
        for (int l = 0; l < kFL; ++l) {
          col_tile[static_cast<std::size_t>(t0 + l)][lane] = f[l];
          col_e_tile[static_cast<std::size_t>((t0 + l) * kFL + lane)] = e8[l];
        }
      }
    }
    for (std::int64_t t = 0; t < d16; ++t) {
      if (want & kByCols) vstore(out.cols.data() + t * r + i0, col_tile[static_cast<std::size_t>(t)]);
      if (want & kExpByCols) std::memcpy(out.cols_e.at(t, i0), col_e_tile.data() + t * kFL, kFL);
    }
  }
}

// One vector of rows' tiles: S of a KV block ([block_n] vectors), P as F and its exponents ([block_n][L]),
// the lanes whose P chunk of 16 keys holds a NaN ([block_n / 16][L], 127 there, else -128), and one chunk's
// exponent maxima ([max(block_n, d16)][L]).
struct Fa2RowTiles {
  FVs s;
  std::vector<float> p;
  std::vector<std::int8_t> pe, p_poison;
  std::vector<std::uint8_t> e;
};

// s[j] = A B^T for L rows (row0 ...) and the keys j0 .. j0 + count, S = Q K^T or dP = dO V^T: per chunk of 16
// along d (gemm over the k-slices of sQ and sK, from a zero accumulator) the exponent maxima of every key,
// then each key's mma with the chunk's 16 A^T vectors held. a by columns, b by rows; e the maxima's tile.
template <Format F>
void score_tile(const Fa2Layouts& a, const Fa2Layouts& b, std::int64_t row0, std::int64_t j0, std::int64_t count,
                FV* s, std::uint8_t* e) {
  for (std::int64_t t = 0; t < a.d16; t += 16) {
    exponent_max_tile(e, a.cols_e.at(t, row0), a.cols_e.ld, b.cols_e.at(t, j0), b.cols_e.ld, round_up(count, 4));
    if (a.cols_e.any || b.cols_e.any)
      poison_tile(e, count, a.cols_e.any ? a.cols_e.poison_at(t, row0) : nullptr,
                  b.cols_e.any ? b.cols_e.poison_at(t, j0) : nullptr);
    FV at[16];
    for (int i = 0; i < 16; ++i) at[i] = vload(a.col_at(t + i, row0));
    const float* a_mem = a.col_at(t, row0);
    if (t == 0)
      for (std::int64_t j = 0; j < count; ++j)
        s[j] = mma_chunk<F, true>(FV{}, at, b.row_at(j0 + j, t), 1, e + j * kFL, a_mem, a.r);
    else
      for (std::int64_t j = 0; j < count; ++j)
        s[j] = mma_chunk<F, false>(s[j], at, b.row_at(j0 + j, t), 1, e + j * kFL, a_mem, a.r);
  }
}

// S for L rows (row0 ...) and a KV block's keys j0 .. j0 + block_n, masked: keys past N (mask.h, col >=
// max_seqlen_k) and causal keys after the row (apply_mask_causal: col > row) are -inf; keys masked for
// every lane skip their dot products.
template <Format F>
void masked_score_tile(const Fa2Geometry& g, const Fa2Layouts& q, const Fa2Layouts& k, std::int64_t row0,
                       std::int64_t j0, int block_n, FV* s, std::uint8_t* e) {
  std::int64_t end = std::min(g.n, j0 + block_n);
  if (g.causal) end = std::min(end, row0 + kFL);
  const std::int64_t count = std::max<std::int64_t>(end - j0, 0);
  score_tile<F>(q, k, row0, j0, count, s, e);
  IV lane;
  for (int l = 0; l < kFL; ++l) lane[l] = l;
  for (std::int64_t c = 0; c < block_n; ++c)
    if (c >= count) s[c] = splat(kNegInf<float>);
    else if (g.causal)  // lane l's row is row0 + l: the key is masked where it is ahead by more than l
      s[c] = IV{} + static_cast<std::int32_t>(std::clamp<std::int64_t>(j0 + c - row0, -1, kFL)) > lane
                 ? splat(kNegInf<float>)
                 : s[c];
}

// gemm_rs(acc_o, tOrP, tOrVt): acc_o += P V over the block's keys j0 .. j0 + block_n in k-slices of 16, the
// exponent maxima of every column of V per slice, then each column's mma with the slice's 16 P vectors held.
template <Format F>
void pv_tile(const Fa2Geometry& g, const Fa2Layouts& v, std::int64_t j0, int block_n, bool p_poisoned, FVs& acc,
             Fa2RowTiles& w) {
  std::uint8_t* e = w.e.data();
  for (int c = 0; c < block_n; c += 16) {
    exponent_max_tile(e, w.pe.data() + c * kFL, kFL, v.rows_e.at(j0 + c, 0), v.rows_e.ld, round_up(g.d, 4));
    if (p_poisoned || v.rows_e.any)
      poison_tile(e, g.d, p_poisoned ? w.p_poison.data() + c / 16 * kFL : nullptr,
                  v.rows_e.any ? v.rows_e.poison_at(j0 + c, 0) : nullptr);
    FV a[16];
    for (int i = 0; i < 16; ++i) a[i] = vload(w.p.data() + (c + i) * kFL);
    const float* a_mem = w.p.data() + c * kFL;
    for (std::int64_t t = 0; t < g.d; ++t)
      acc[static_cast<std::size_t>(t)] =
          mma_chunk<F, false>(acc[static_cast<std::size_t>(t)], a, v.col_at(t, j0 + c), 1, e + t * kFL, a_mem, kFL);
  }
}

// a * b + c rounded once (fma), lane by lane.
FASTUDY_INLINE FV fma_lanes(FV a, FV b, FV c) {
#if FASTUDY_ISA_FMA
  return madd(a, b, c);
#else
  for (int l = 0; l < kFL; ++l) c[l] = std::fma(a[l], b[l], c[l]);
  return c;
#endif
}

// P for one KV block (scale_apply_exp2, below): exp2f(S * scale_log2 - max_scaled) for every key, added into
// the lane's row sum l[(c % 8) / 2] (the first add of each into fma(l, rescale, P)), stored as F with its
// exponents. Returns whether a P is NaN; its lane's chunk is then marked in p_poison.
template <Format F>
bool p_tile(Fa2RowTiles& w, int block_n, FV sl2, FV max_scaled, FV rescale, FV* l) {
  bool poisoned = false;
  auto one = [&](int c, FV& sum, bool fused) __attribute__((always_inline)) {
    const FV p = ex2_lanes(w.s[static_cast<std::size_t>(c)] * sl2 - max_scaled);
    sum = fused ? fma_lanes(sum, rescale, p) : sum + p;
    const FV r = round_lanes<F>(p);
    vstore(w.p.data() + c * kFL, r);
    store_e8(w.pe.data() + c * kFL, __builtin_convertvector(exponent_lanes<F>(r), E8V));  // a NaN's: poisoned
    if (__builtin_expect(any_nonfinite(r), 0)) {  // a NaN P: its lane's chunk takes mma::dot_k16
      if (!poisoned) w.p_poison.assign(static_cast<std::size_t>(block_n / 16 * kFL), -128);
      poisoned = true;
      const IV special = nonfinite_lanes(r);
      for (int lane = 0; lane < kFL; ++lane)
        if (special[lane]) w.p_poison[static_cast<std::size_t>(c / 16 * kFL + lane)] = 127;
    }
  };
  FV l0 = l[0], l1 = l[1], l2 = l[2], l3 = l[3];
  for (int c = 0; c < block_n; c += 8) {
    one(c, l0, c == 0), one(c + 1, l0, false), one(c + 2, l1, c == 0), one(c + 3, l1, false);
    one(c + 4, l2, c == 0), one(c + 5, l2, false), one(c + 6, l3, c == 0), one(c + 7, l3, false);
  }
  l[0] = l0, l[1] = l1, l[2] = l2, l[3] = l3;
  return poisoned;
}

// One split (or the whole row range) of the forward for L rows: KV blocks [nb_lo, nb_hi) of block_n keys
// from the last to the first, then normalize_softmax_lse. acc receives acc_o * (1 / sum) in fp32 ([d16]
// vectors), lse the split's lse (Split: -inf for an empty row, else +inf).
template <Format F>
void fa2_forward_rows(const Fa2Geometry& g, const Fa2Layouts& q, const Fa2Layouts& k, const Fa2Layouts& v,
                      std::int64_t row0, int block_n, std::int64_t nb_lo, std::int64_t nb_hi, bool split, FVs& acc,
                      Fa2RowTiles& w, FV* lse_out) {
  const FV sl2 = splat(g.scale_log2);
  acc.assign(static_cast<std::size_t>(g.d16), FV{});
  w.s.resize(static_cast<std::size_t>(block_n));
  w.p.resize(static_cast<std::size_t>(block_n * kFL));
  w.pe.resize(static_cast<std::size_t>(block_n * kFL));
  w.e.resize(static_cast<std::size_t>(std::max<std::int64_t>(block_n, g.d16) * kFL));
  FV m = splat(kNegInf<float>);
  FV l[4] = {FV{}, FV{}, FV{}, FV{}};  // the row sum of each lane of an MMA quad (softmax.h reduce_sum)
  for (std::int64_t nb = nb_hi - 1; nb >= nb_lo; --nb) {  // "We iterate over the blocks in reverse order"
    const bool first = nb == nb_hi - 1;
    const std::int64_t j0 = nb * block_n;
    masked_score_tile<F>(g, q, k, row0, j0, block_n, w.s.data(), w.e.data());
    FV m_tile = splat(kNegInf<float>);
    for (int c = 0; c < block_n; c += 2)
      m_tile = vmax(m_tile, vmax(w.s[static_cast<std::size_t>(c)], w.s[static_cast<std::size_t>(c + 1)]));
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
    // P is kept as F with its exponents, the A operand of P V (convert_type<Element>(acc_s)): p_tile.
    const FV max_scaled = m == kNegInf<float> ? FV{} : m * sl2;
    const bool p_poisoned = p_tile<F>(w, block_n, sl2, max_scaled, rescale, l);
    pv_tile<F>(g, v, j0, block_n, p_poisoned, acc, w);
  }
  // normalize_softmax_lse: quad_allreduce_ of row_sum (shfl_xor 2, then 1: (s0 + s2) + (s1 + s3)),
  // inv_sum = 1 / sum (IEEE division; 1 for 0 or NaN), acc_o *= inv_sum, lse = row_max * softmax_scale +
  // __logf(sum), contracted to fma(row_max, softmax_scale, lg2.approx(sum) * ln2) (PTX of nvcc 13.0,
  // ctest -R fa2_softmax_ptx).
  const FV sum = (l[0] + l[2]) + (l[1] + l[3]);
  const IV empty = (sum == 0.0f) | (sum != sum);
  const FV inv = empty ? splat(1.0f) : splat(1.0f) / sum;
  for (auto& x : acc) x *= inv;
  for (int lane_i = 0; lane_i < kFL; ++lane_i)
    (*lse_out)[lane_i] = empty[lane_i] ? (split ? -INFINITY : INFINITY)
                                       : std::fma(m[lane_i], g.scale, nv::fast_logf(sum[lane_i]));
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
  Fa2Layouts ql, kl, vl;  // Q^T (A of S), K (B of S), V^T (B of P V)
  fa2_layouts<F>(q, g.n, g.d, g.d16, g.rows, kByCols | kExpByCols, ql);
  fa2_layouts<F>(k, g.n, g.d, g.d16, keys, kByRows | kExpByCols, kl);
  fa2_layouts<F>(v, g.n, g.d, g.d16, keys, kByCols | kExpByRows, vl);
  FVs acc;
  Fa2RowTiles tiles;
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
      fa2_forward_rows<F>(g, ql, kl, vl, row0, block_n, 0, causal_max, false, acc, tiles, &lse_v);
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
      fa2_forward_rows<F>(g, ql, kl, vl, row0, block_n, lo, hi, true, o_vec[static_cast<std::size_t>(sidx)], tiles,
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

// acc[c][t] += the row block's rows i0 .. i0 + bm of B^T A for its keys c < bn and all of d: dV += P^T dO,
// dK += dS^T Q (over the row block's rows in k-slices of 16: for each key, acc's chain over the slices in
// order). Per slice and vector of d the exponent maxima of every key, then each key's mma with the slice's
// 16 A vectors held. a by rows; b the block's [key][bm] values, be their exponents by rows.
template <Format F>
void key_grad_tile(const Fa2Layouts& a, std::int64_t i0, int bm, const float* b, const Fa2Exponents& be, int bn,
                   float* acc, std::uint8_t* e) {
  const std::int64_t d16 = a.d16;
  for (int r = 0; r < bm; r += 16)
    for (std::int64_t t = 0; t < d16; t += kFL) {
      exponent_max_tile(e, a.rows_e.at(i0 + r, t), a.rows_e.ld, be.at(r, 0), be.ld, bn);
      if (a.rows_e.any || be.any)
        poison_tile(e, bn, a.rows_e.any ? a.rows_e.poison_at(i0 + r, t) : nullptr, be.any ? be.poison_at(r, 0) : nullptr);
      FV av[16];
      for (int i = 0; i < 16; ++i) av[i] = vload(a.row_at(i0 + r + i, t));
      const float* a_mem = a.row_at(i0 + r, t);
      for (int c = 0; c < bn; ++c)
        vstore(acc + c * d16 + t, mma_chunk<F, false>(vload(acc + c * d16 + t), av, b + c * bm + r, 1, e + c * kFL, a_mem, d16));
    }
}

// out[r][t] = the KV block's keys j0 .. j0 + bn of B A for each row r < bm of the row block and all of d: dQ =
// dS K from a fresh accumulator (per row, the chain over the block's k-slices of 16 keys in order). k by rows;
// b the block's dS as [key][bm], be its exponents by keys.
template <Format F>
void query_grad_tile(const Fa2Layouts& k, std::int64_t j0, int bn, const float* b, const Fa2Exponents& be, int bm,
                     float* out, std::uint8_t* e) {
  const std::int64_t d16 = k.d16;
  for (int c0 = 0; c0 < bn; c0 += 16)
    for (std::int64_t t = 0; t < d16; t += kFL) {
      exponent_max_tile(e, k.rows_e.at(j0 + c0, t), k.rows_e.ld, be.at(c0, 0), be.ld, bm);
      if (k.rows_e.any || be.any)
        poison_tile(e, bm, k.rows_e.any ? k.rows_e.poison_at(j0 + c0, t) : nullptr, be.any ? be.poison_at(c0, 0) : nullptr);
      FV av[16];
      for (int i = 0; i < 16; ++i) av[i] = vload(k.row_at(j0 + c0 + i, t));
      const float* a_mem = k.row_at(j0 + c0, t);
      for (int r = 0; r < bm; ++r) {
        const FV acc = c0 == 0 ? mma_chunk<F, true>(FV{}, av, b + c0 * bm + r, bm, e + r * kFL, a_mem, d16)
                               : mma_chunk<F, false>(vload(out + r * d16 + t), av, b + c0 * bm + r, bm, e + r * kFL, a_mem, d16);
        vstore(out + r * d16 + t, acc);
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
  // A operands with lanes over rows (by columns: Q^T and dO^T for S and dP), B operands of scalars per key (by
  // rows: K and V), and A operands whose vectors run over d (by rows: dO, Q and K for dV, dK and dQ).
  Fa2Layouts ql, dol, kl, vl;
  fa2_layouts<F>(q, g.n, g.d, g.d16, rows, kByCols | kExpByCols | kByRows | kExpByRows, ql);
  fa2_layouts<F>(dout, g.n, g.d, g.d16, rows, kByCols | kExpByCols | kByRows | kExpByRows, dol);
  fa2_layouts<F>(k, g.n, g.d, g.d16, keys, kByRows | kExpByCols | kExpByRows, kl);
  fa2_layouts<F>(v, g.n, g.d, g.d16, keys, kByRows | kExpByCols, vl);
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
  // P and dS of one (KV block, row block) as [key][rows of the block], values of F; their exponents by rows
  // ([rows][keys], the B operands of dV and dK) and dS's by keys (the B operand of dQ).
  std::vector<float> p16(static_cast<std::size_t>(bn * bm)), ds16(static_cast<std::size_t>(bn * bm));
  Fa2Exponents pe_rows, dse_rows, dse_keys;
  FVs s(static_cast<std::size_t>(bn)), dp(static_cast<std::size_t>(bn));
  std::vector<std::uint8_t> e(static_cast<std::size_t>(std::max(bm, bn) * kFL));
  std::vector<float> acc_dk(static_cast<std::size_t>(bn * g.d16)), acc_dv(acc_dk.size()), acc_dq(static_cast<std::size_t>(bm * g.d16));
  std::vector<float> dq_accum(static_cast<std::size_t>(launch.dq_splits * rows * g.d16), 0.0f);
  for (std::int64_t nb = 0; nb < n_blocks; ++nb) {  // one thread block per KV block
    const std::int64_t j0 = nb * bn;
    std::fill(acc_dk.begin(), acc_dk.end(), 0.0f);
    std::fill(acc_dv.begin(), acc_dv.end(), 0.0f);
    // m_block from m_block_max - 1 down to m_block_min (causal: n_block * kBlockN / kBlockM).
    const std::int64_t mb_min = g.causal ? (nb * bn) / bm : 0;
    for (std::int64_t mb = m_blocks - 1; mb >= mb_min; --mb) {
      const std::int64_t i0 = mb * bm;
      pe_rows.resize(bm, bn);
      dse_rows.resize(bm, bn);
      dse_keys.resize(bn, bm);
      for (std::int64_t r0 = 0; r0 < bm; r0 += kFL) {
        const std::int64_t row0 = i0 + r0;
        const FV lse_v = vload(lse2.data() + row0), d_v = vload(delta.data() + row0);
        // S = Q K^T (gemm), masked; dP = dO V^T (gemm).
        masked_score_tile<F>(g, ql, kl, row0, j0, bn, s.data(), e.data());
        score_tile<F>(dol, vl, row0, j0, bn, dp.data(), e.data());
        for (int c = 0; c < bn; ++c) {
          // P = exp2f(__fmul_rn(S, scale_log2) - lse * log2e) in fp32; dS = P (dP - D) on the fp32 P
          // (pointwise_mult), then both as F.
          const FV p = ex2_lanes(s[static_cast<std::size_t>(c)] * sl2 - lse_v);
          const FV ds = p * (dp[static_cast<std::size_t>(c)] - d_v);
          const FV pr = round_lanes<F>(p), dsr = round_lanes<F>(ds);
          vstore(p16.data() + c * bm + r0, pr);
          vstore(ds16.data() + c * bm + r0, dsr);
          // Exponents where a key or row past N is an output (zero, never read): 0, the vector path's.
          const bool key_past = j0 + c >= g.n;
          const E8V pe = exponents8<F>(pr), dse = exponents8<F>(dsr);
          E8V dse_out = dse;
          for (int l = 0; l < kFL; ++l) {
            if (row0 + l >= g.n) dse_out[l] = 0;
            *pe_rows.at(r0 + l, c) = key_past ? 0 : pe[l];
            *dse_rows.at(r0 + l, c) = key_past ? 0 : dse[l];
          }
          store_e8(dse_keys.at(c, r0), dse_out);
          if (__builtin_expect(any_nonfinite(pr) || any_nonfinite(dsr), 0)) {
            const IV p_special = nonfinite_lanes(pr), ds_special = nonfinite_lanes(dsr);
            for (int l = 0; l < kFL; ++l) {
              if (p_special[l]) pe_rows.mark_special(r0 + l, c);
              if (ds_special[l]) dse_rows.mark_special(r0 + l, c), dse_keys.mark_special(c, r0 + l);
            }
          }
        }
      }
      // dV += P^T dO and dK += dS^T Q over the row block's rows in k-slices of 16 (lanes over t).
      key_grad_tile<F>(dol, i0, bm, p16.data(), pe_rows, bn, acc_dv.data(), e.data());
      key_grad_tile<F>(ql, i0, bm, ds16.data(), dse_rows, bn, acc_dk.data(), e.data());
      // dQ = dS K over the KV block's keys (a fresh accumulator), added into dq_accum split nb % dq_splits
      // (deterministic mode; with atomicAdd the GPU's order of these adds varies).
      query_grad_tile<F>(kl, j0, bn, ds16.data(), dse_keys, bm, acc_dq.data(), e.data());
      float* accum = dq_accum.data() + (nb % launch.dq_splits) * rows * g.d16;
      for (int r = 0; r < bm; ++r)
        for (std::int64_t t = 0; t < g.d16; t += kFL) {
          float* dst = accum + (i0 + r) * g.d16 + t;
          vstore(dst, vload(dst) + vload(acc_dq.data() + r * g.d16 + t));
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
