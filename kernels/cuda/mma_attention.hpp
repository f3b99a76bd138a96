// The tensor-core attention kernels of the readings whose products are fp16/bf16 x fp16/bf16 -> fp32
// (fa2, fa3, and the framework flash loops of eager and mixed; cuda_tile::TileRounding::kMma), forward
// and backward, as bodies of one thread block written against a warp context Ctx: DeviceWarp
// (kernels/cuda/warp_device.cuh, inline PTX) on the GPU, HostWarp (tests/gpu/warp_sim.hpp) in the
// host simulation that tests them on the CPU. The rounding steps are the host twin's
// (kernels/cuda/tile_math.hpp), applied to the fragments in registers; the products are mma.sync
// m16n8k16, chained over 16-blocks of the summed index in the order the twin's chains take.
//
// B batch, H heads, N sequence, d head dim, Br/Bc the reading's block sizes (cuda_tile::TileHead);
// operands are the prepared [B*H, N, d] arrays of fp16/bf16 bits (rounded to their steps, Q scaled for
// the `before` placement), lse and D are [B*H, N] floats.
// Layout of the work (warps of 16 rows or keys, 4 warps per block; ldmatrix from padded shared-memory
// tiles filled by cp.async, two stages):
//   forward    a block per 64 query rows and head, KV tiles of Bc keys (fa2/fa3 last to first, the
//              framework loops first to last); S = Q K^T and O += P V on the tensor cores, P taken from
//              the S accumulators as the A operand; row max over the quad's lanes by shuffles; the
//              fa2/fa3 row sums per lane, the framework's sequential row sums by one lane per row over
//              a shared-memory copy of the tile.
//   dK, dV     a block per 64 keys and head; row blocks of Br in the reading's order, 32 rows at a time:
//              S^T = K Q^T, dP^T = V dO^T, P^T and dS^T elementwise, dV += P^T dO, dK += dS^T Q (the
//              framework's `ops`: each row block summed from zero, handed on to accumulators in shared
//              memory).
//   dQ         a block per 64 query rows and head; KV blocks of Bc, 64 keys at a time: S, dP, dS, then
//              dQ += dS K (fa2/fa3: one part per KV block, summed from zero and added; `ops`: per tile).
// Supported shapes (mma_supported): d a multiple of 16 up to 128, Br and Bc multiples of 16, Bc up to
// 128 (d <= 64) or 64 (d > 64); other shapes run the per-row kernels of attention_cuda.cu, which
// compute the same values.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention.hpp"
#include "kernels/cuda/mma_layout.hpp"
#include "kernels/cuda/tile_math.hpp"

// Loops over fragments are unrolled on the device, so that every register array is indexed by constants
// (an array indexed at run time lives in local memory).
#if defined(__CUDA_ARCH__)
#define FASTUDY_UNROLL _Pragma("unroll")
#else
#define FASTUDY_UNROLL
#endif

namespace fastudy::cuda_mma {

using cuda_tile::TileHead;

// Compile-time shape of the kernels: kDMax head-dim columns and kBcMax keys held in registers (the
// runtime d and Bc may be smaller, in steps of 16), warps of 16 rows, 4 warps per block.
template <int DMax, int BcMax>
struct MmaTraits {
  static constexpr int kDMax = DMax, kBcMax = BcMax;
  static constexpr int kWarps = 4, kThreads = 32 * kWarps, kBlockRows = 16 * kWarps;
  static constexpr int kDTiles = DMax / 8, kDSteps = DMax / 16;  // n-tiles and k-steps over d
  static constexpr int kSTiles = BcMax / 8, kSSteps = BcMax / 16;  // n-tiles and k-steps over a KV tile
  static constexpr int kSubRows = 32;                              // rows per step of the dK/dV block
  static constexpr int kSubKeys = 64;                              // keys per step of the dQ block
  static_assert(DMax % 16 == 0 && DMax >= 16 && DMax <= 128, "head dim held in registers: 16 to 128, steps of 16");
  static_assert(BcMax % 16 == 0 && BcMax >= 16 && BcMax <= 128, "KV tile held in registers: 16 to 128 keys");
  static_assert(kBlockRows == 64 && kSubRows % 16 == 0 && kSubKeys % 16 == 0, "blocks of 64 rows, 16-row steps");
};

// The framework flash loops (eager, mixed) store S in the format; fa2/fa3 keep it in fp32 registers
// (cuda_tile::tile_storage_format): the rounding object tells the kernels apart at compile time.
template <class R>
inline constexpr bool kFramework = R::kScore != Format::fp32;

// The register tiles of a head dim: up to 64 columns with KV tiles up to 128 keys, up to 128 columns with
// KV tiles up to 64 keys (the registers of one thread: O, S and the framework's tile product).
FASTUDY_HD inline int mma_d_max(int d) { return d <= 64 ? 64 : 128; }
FASTUDY_HD inline int mma_bc_max(int d) { return d <= 64 ? 128 : 64; }

// Whether the tensor-core kernels run this head: d in 16..128 (steps of 16), Br and Bc multiples of 16,
// Bc up to mma_bc_max(d) (Br and Bc are the reading's blocks clipped to N).
FASTUDY_HD inline bool mma_supported(const TileHead& h) {
  return h.d % 16 == 0 && h.d >= 16 && h.d <= 128 && h.br % 16 == 0 && h.br >= 16 && h.bc % 16 == 0 &&
         h.bc <= mma_bc_max(h.d);
}

struct ForwardArgs {
  TileHead h;
  LoopOrder order;  // framework kernels: q_outer (FA-2) or kv_outer (FA-1)
  const std::uint16_t *q, *k, *v;
  void* o;       // [B*H, N, d]: floats when o_float, else fp16/bf16 bits
  bool o_float;
  float* lse;  // may be null
};

struct BackwardArgs {
  TileHead h;
  const std::uint16_t *q, *k, *v, *dout;
  const float* lse;  // fa2/fa3: lse * log2 e as the kernels subtract it (kernel_lse_log2); framework: lse
  const float* dd;   // D_i
  void *dq, *dk, *dv;  // floats when grad_float, else fp16/bf16 bits
  bool grad_float;
};

// Shared memory of the three kernels (bytes), for the runtime d and Bc.
FASTUDY_HD inline std::size_t forward_smem_bytes(int d, int bc, bool framework) {
  return 2u * static_cast<std::size_t>(tile_elements(64, d) + 4 * tile_elements(bc, d)) +
         (framework ? 4u * 4u * 16u * static_cast<std::size_t>(bc + 1) : 0u);
}
FASTUDY_HD inline std::size_t dkdv_smem_bytes(int d, bool ops) {
  return 2u * static_cast<std::size_t>(2 * tile_elements(64, d) + 4 * tile_elements(32, d)) + 4u * 2u * 2u * 32u +
         (ops ? 4u * 2u * 64u * static_cast<std::size_t>(d) : 0u);
}
FASTUDY_HD inline std::size_t dq_smem_bytes(int d) {
  return 2u * static_cast<std::size_t>(2 * tile_elements(64, d) + 4 * tile_elements(64, d)) + 4u * 2u * 64u;
}

// ---- operands and row statistics (the device's prepare and delta kernels, and the host simulation) ----
// An input value as the kernels read it: rounded to the storage format S, and for Q of the framework's
// `before` placement scaled and rounded again (scale != 0), as its 16-bit pattern.
template <Format S>
FASTUDY_HD inline std::uint16_t prepared_bits(float x, float scale) {
  float v = round_to_format<S>(x);
  if (scale != 0.0f) v = round_to_format<S>(v * scale);
  return storage_bits<S>(v);
}

// D of one row (dO and O in float, d values) and, for fa2/fa3, lse log2 e as the kernels subtract it.
template <class R>
FASTUDY_HD inline void row_delta(const TileHead& h, const float* dout, const float* o, float lse, float& dd,
                                 float& lse2) {
  if constexpr (kFramework<R>) {
    dd = cuda_tile::flash_delta<R>(dout, o, h.d, h.ops);
    lse2 = lse;
  } else {
    dd = R::stats_running(cuda_tile::dot_do_o<R>(h.kernel, dout, o, h.d));
    lse2 = cuda_tile::kernel_lse_log2<R>(h.kernel, lse);
  }
}

// ---- helpers ---------------------------------------------------------------------------------------
FASTUDY_HD inline std::int64_t min64(std::int64_t a, std::int64_t b) { return a < b ? a : b; }

// Copies rows [0, rows) of a tile of `cols` 16-bit columns from global row `row0` (rows at or past
// `row_end` and rows for which `keep` is false are zero-filled) into a padded shared-memory tile, 16
// bytes per cp.async, spread over the block's threads.
template <class Ctx, class Keep>
FASTUDY_HD inline void load_tile(Ctx& cx, std::uint16_t* dst, const std::uint16_t* src, std::int64_t row0,
                                 std::int64_t row_end, int rows, int cols, int threads, Keep keep) {
  const int chunks = cols / 8;
  for (int x = cx.thread(); x < rows * chunks; x += threads) {
    const int r = x / chunks, c = (x % chunks) * 8;
    const std::int64_t row = row0 + r;
    const bool valid = row < row_end && keep(row);
    cx.cp_async16(dst + tile_offset(r, c, cols), valid ? src + row * cols + c : src, valid);
  }
}

// One value of an output row pair (columns col, col + 1) into a float or fp16/bf16 array.
template <Format S>
FASTUDY_HD inline void store_pair(void* out, bool as_float, std::int64_t index, float x0, float x1) {
  if (as_float) {
    float* p = static_cast<float*>(out) + index;
    p[0] = x0;
    p[1] = x1;
  } else {
    *reinterpret_cast<std::uint32_t*>(static_cast<std::uint16_t*>(out) + index) = pack2<S>(x0, x1);
  }
}

// The sequential row sums of the framework tiles: sum = init, then sum = stats(sum + p_c) for the tile's
// columns c < bca in order, row by row (rows g and g + 8 of each lane), over a shared-memory copy of the
// warp's 16 x bca values (scratch: 16 rows of stride bc + 1 floats), one lane per row.
template <class R, int NT, class Ctx>
FASTUDY_HD inline void sequential_row_sums(Ctx& cx, float* scratch, int stride, const float (&p)[NT][4], int bca,
                                           const float (&init)[2], float (&out)[2]) {
  const int lane = cx.lane();
  FASTUDY_UNROLL
  for (int nt = 0; nt < NT; ++nt)
    FASTUDY_UNROLL
    for (int e = 0; e < 4; ++e) {
      const RowCol rc = c_element(lane, e);
      const int c = 8 * nt + rc.col;
      if (c < bca) scratch[rc.row * stride + c] = p[nt][e];
    }
  cx.sync_warp();
  // Row L (lane L < 16) starts from the init of its quad: lanes 4 (L % 8) .. hold rows L % 8 and L % 8 + 8.
  const float init_lo = cx.shfl(init[0], 4 * (lane & 7)), init_hi = cx.shfl(init[1], 4 * (lane & 7));
  float acc = lane < 8 ? init_lo : init_hi;
  if (lane < 16)
    for (int c = 0; c < bca; ++c) acc = R::stats(acc + scratch[lane * stride + c]);
  cx.sync_warp();
  const int g = group_of(lane);
  out[0] = cx.shfl(acc, g);
  out[1] = cx.shfl(acc, g + 8);
}

// Row max (and the max_offset count) over the quad's lanes: each lane's values of rows g and g + 8,
// then the other three lanes' by shuffles.
template <int NT, class Ctx>
FASTUDY_HD inline void quad_row_max(Ctx& cx, const float (&s)[NT][4], float (&m)[2]) {
  m[0] = m[1] = cuda_tile::neg_inf();
  FASTUDY_UNROLL
  for (int nt = 0; nt < NT; ++nt)
    FASTUDY_UNROLL
    for (int e = 0; e < 4; ++e) m[e >> 1] = cuda_tile::max_of(m[e >> 1], s[nt][e]);
  FASTUDY_UNROLL
  for (int r = 0; r < 2; ++r) {
    m[r] = cuda_tile::max_of(m[r], cx.shfl_xor(m[r], 1));
    m[r] = cuda_tile::max_of(m[r], cx.shfl_xor(m[r], 2));
  }
}
template <int NT, class Ctx>
FASTUDY_HD inline void quad_offset_max(Ctx& cx, const float (&s)[NT][4], const TileHead& h, float (&m)[2]) {
  float close[2] = {0.0f, 0.0f};
  FASTUDY_UNROLL
  for (int nt = 0; nt < NT; ++nt)
    FASTUDY_UNROLL
    for (int e = 0; e < 4; ++e)
      close[e >> 1] += s[nt][e] >= cuda_tile::offset_floor(m[e >> 1], h) ? 1.0f : 0.0f;
  FASTUDY_UNROLL
  for (int r = 0; r < 2; ++r) {
    close[r] += cx.shfl_xor(close[r], 1);
    close[r] += cx.shfl_xor(close[r], 2);
    if (cuda_tile::offset_applies(m[r], h)) m[r] = cuda_tile::offset_max_of(m[r], static_cast<int>(close[r]), h);
  }
}

// acc (NT n-tiles of 8 columns) += A B over the k-steps ks < ksteps of 16: A fragments from a padded tile
// (rows a_row0.., columns 16 ks..), B from a padded tile holding B transposed (n-major: rows n0 + 8 nt..,
// columns 16 ks..); n-tile pairs np with 16 np < n_limit only.
template <Format S, int KS, int NT, class Ctx>
FASTUDY_HD inline void mma_a_tile_b_nmajor(Ctx& cx, float (&acc)[NT][4], const std::uint16_t* a_tile, int a_row0,
                                           const std::uint16_t* b_tile, int cols, int ksteps, int n_limit) {
  const int lane = cx.lane();
  FASTUDY_UNROLL
  for (int ks = 0; ks < KS; ++ks) {
    if (ks >= ksteps) break;
    std::uint32_t a[4];
    const RowCol ra = ldsm_a_address(lane, a_row0, 16 * ks);
    cx.ldsm_x4(a, a_tile + tile_offset(ra.row, ra.col, cols));
    FASTUDY_UNROLL
    for (int np = 0; np < NT / 2; ++np) {
      if (16 * np >= n_limit) break;
      std::uint32_t b[4];
      const RowCol rb = ldsm_b_nmajor_address(lane, 16 * np, 16 * ks);
      cx.ldsm_x4(b, b_tile + tile_offset(rb.row, rb.col, cols));
      cx.template mma<S>(acc[2 * np], a, b[0], b[1]);
      cx.template mma<S>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc (ND n-tiles over d) += A B with A the 16 x 16 block `a` (registers) and B rows k0.. of a padded tile
// holding B as is (k-major), columns up to d.
template <Format S, int ND, class Ctx>
FASTUDY_HD inline void mma_a_regs_b_kmajor(Ctx& cx, float (&acc)[ND][4], const std::uint32_t (&a)[4],
                                           const std::uint16_t* b_tile, int k0, int cols, int d) {
  const int lane = cx.lane();
  FASTUDY_UNROLL
  for (int dp = 0; dp < ND / 2; ++dp) {
    if (16 * dp >= d) break;
    std::uint32_t b[4];
    const RowCol rb = ldsm_b_kmajor_address(lane, k0, 16 * dp);
    cx.ldsm_x4_trans(b, b_tile + tile_offset(rb.row, rb.col, cols));
    cx.template mma<S>(acc[2 * dp], a, b[0], b[1]);
    cx.template mma<S>(acc[2 * dp + 1], a, b[2], b[3]);
  }
}

// ---- forward ---------------------------------------------------------------------------------------
// One block: 64 query rows (bx) of head `head`.
template <class R, class T, class Ctx>
FASTUDY_HD inline void mma_forward_block(Ctx& cx, const ForwardArgs& a, int bx, int head, unsigned char* smem) {
  constexpr Format S = R::kStorage;
  static_assert(R::kMma, "the tensor-core kernels run readings of fp16/bf16 products into fp32");
  const TileHead& h = a.h;
  const int d = h.d, bc = h.bc, lane = cx.lane(), warp = cx.warp();
  constexpr bool framework = kFramework<R>;
  std::uint16_t* qs = reinterpret_cast<std::uint16_t*>(smem);
  std::uint16_t* kv = qs + tile_elements(64, d);  // stage s: K at kv + 2 s tile, V at kv + (2 s + 1) tile
  const int kv_tile = tile_elements(bc, d);
  float* scratch = reinterpret_cast<float*>(kv + 4 * kv_tile) + warp * 16 * (bc + 1);
  const std::int64_t base = static_cast<std::int64_t>(head) * h.n;
  const std::int64_t i0 = static_cast<std::int64_t>(bx) * T::kBlockRows, r0 = i0 + 16 * warp;
  const std::uint16_t* qg = a.q + base * d;
  const std::uint16_t* kg = a.k + base * d;
  const std::uint16_t* vg = a.v + base * d;
  auto blocks_for_row = [&](std::int64_t r) {
    const std::int64_t j_end = h.causal ? min64(h.n, (r / h.br + 1) * h.br) : h.n;
    return (j_end + bc - 1) / bc;
  };
  // A warp's rows lie in one row block of Br (Br a multiple of 16): they see the same KV tiles.
  const std::int64_t warp_blocks = r0 < h.n ? blocks_for_row(r0) : 0;
  const std::int64_t blocks = blocks_for_row(min64(h.n, i0 + T::kBlockRows) - 1);
  auto block_at = [&](std::int64_t it) { return framework ? it : blocks - 1 - it; };
  auto all = [](std::int64_t) { return true; };
  auto load_kv = [&](std::int64_t jb, int stage) {
    const std::int64_t j0 = jb * bc;
    load_tile(cx, kv + 2 * stage * kv_tile, kg, j0, h.n, bc, d, T::kThreads, all);
    load_tile(cx, kv + (2 * stage + 1) * kv_tile, vg, j0, h.n, bc, d, T::kThreads, all);
  };
  load_tile(cx, qs, qg, i0, h.n, T::kBlockRows, d, T::kThreads, all);
  load_kv(block_at(0), 0);
  cx.cp_commit();

  const float scale_log2 = cuda_tile::scale_log2_of(h.scale);
  const cuda_tile::TileScore store = framework ? cuda_tile::tile_score_of(h) : cuda_tile::TileScore::raw;
  float o[T::kDTiles][4];
  FASTUDY_UNROLL
  for (int nt = 0; nt < T::kDTiles; ++nt)
    FASTUDY_UNROLL
    for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
  float m[2] = {cuda_tile::neg_inf(), cuda_tile::neg_inf()};
  float l[2] = {0.0f, 0.0f};  // fa2/fa3: this lane's share of the row sum; framework: the row sum

  for (std::int64_t it = 0; it < blocks; ++it) {
    if (it + 1 < blocks) {
      load_kv(block_at(it + 1), static_cast<int>((it + 1) & 1));
      cx.cp_commit();
      cx.template cp_wait<1>();
    } else {
      cx.template cp_wait<0>();
    }
    cx.sync_block();
    const std::int64_t jb = block_at(it);
    if (jb < warp_blocks) {
      const std::uint16_t* ks = kv + 2 * (it & 1) * kv_tile;
      const std::uint16_t* vs = ks + kv_tile;
      const std::int64_t j0 = jb * bc;
      const int bca = static_cast<int>(min64(bc, h.n - j0));
      float s[T::kSTiles][4];
      FASTUDY_UNROLL
      for (int nt = 0; nt < T::kSTiles; ++nt)
        FASTUDY_UNROLL
        for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
      mma_a_tile_b_nmajor<S, T::kDSteps>(cx, s, qs, 16 * warp, ks, d, d / 16, bca);
      FASTUDY_UNROLL
      for (int nt = 0; nt < T::kSTiles; ++nt)
        FASTUDY_UNROLL
        for (int e = 0; e < 4; ++e) {
          const RowCol rc = c_element(lane, e);
          const int c = 8 * nt + rc.col;
          const std::int64_t row = r0 + rc.row;
          const bool out = c >= bca || (h.causal && j0 + c > row);
          s[nt][e] = out ? cuda_tile::neg_inf() : cuda_tile::score_of<R>(s[nt][e], h.scale, store);
        }
      float mt[2];
      quad_row_max(cx, s, mt);
      if (h.max_offset != 0.0f) quad_offset_max(cx, s, h, mt);
      float alpha[2] = {1.0f, 1.0f}, beta[2] = {1.0f, 1.0f}, mref[2];
      bool seen[2] = {true, true};  // kv_outer: whether the row sees a key of this tile
      const bool first = framework ? jb == 0 : jb == warp_blocks - 1;
      FASTUDY_UNROLL
      for (int r = 0; r < 2; ++r) {
        if (!framework) {
          const float m_new = cuda_tile::round_running_max<R>(cuda_tile::max_of(m[r], mt[r]));
          const float m_use = m_new == cuda_tile::neg_inf() ? 0.0f : m_new;
          if (!first) {
            alpha[r] = cuda_tile::kernel_rescale<R>(m[r], m_use, scale_log2);
            l[r] = R::stats_running(l[r] * alpha[r]);
          }
          mref[r] = cuda_tile::kernel_max_scaled<R>(m_new, m_use, scale_log2);
          m[r] = m_new;
        } else if (a.order == LoopOrder::q_outer) {
          const float m_new = cuda_tile::round_running_max<R>(cuda_tile::max_of(m[r], mt[r]));
          mref[r] = m_new == cuda_tile::neg_inf() ? 0.0f : m_new;
          alpha[r] = cuda_tile::framework_rescale<R>(m[r], mref[r]);
          beta[r] = m_new;  // kept until the row sum is known
        } else {
          mt[r] = cuda_tile::round_running_max<R>(mt[r]);
          seen[r] = mt[r] != cuda_tile::neg_inf();
          mref[r] = mt[r];
        }
      }
      // P: fa2/fa3 the unrounded exp2 into the lane's row sums, p(P) as the A operand; framework p(exp).
      FASTUDY_UNROLL
      for (int nt = 0; nt < T::kSTiles; ++nt)
        FASTUDY_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          const int c = 8 * nt + c_element(lane, e).col;
          if (c >= bca || !seen[r]) {
            s[nt][e] = 0.0f;
          } else if (!framework) {
            const float p = cuda_tile::kernel_p<R>(s[nt][e], scale_log2, mref[r]);
            s[nt][e] = R::p(p);
            l[r] = R::stats(l[r] + p);
          } else {
            s[nt][e] = cuda_tile::framework_p<R>(s[nt][e], mref[r]);
          }
        }
      float pv[T::kDTiles][4];  // the framework's tile product when it is an op of its own
      constexpr bool kTileProduct = !R::kExactState;
      if (framework) {
        float init[2], sums[2];
        const bool kv_outer = a.order == LoopOrder::kv_outer;
        FASTUDY_UNROLL
        for (int r = 0; r < 2; ++r) init[r] = kv_outer || !R::kExactState ? 0.0f : R::stats(alpha[r] * l[r]);
        sequential_row_sums<R>(cx, scratch, bc + 1, s, bca, init, sums);
        FASTUDY_UNROLL
        for (int r = 0; r < 2; ++r) {
          if (!kv_outer) {
            l[r] = R::kExactState ? sums[r]
                                  : R::stats_running(R::stats_running(alpha[r] * l[r]) + R::stats_running(sums[r]));
            m[r] = beta[r];
          } else if (seen[r]) {
            const float m_new = cuda_tile::round_running_max<R>(cuda_tile::max_of(m[r], mt[r]));
            alpha[r] = cuda_tile::framework_rescale<R>(m[r], m_new);
            beta[r] = cuda_tile::framework_rescale<R>(mt[r], m_new);
            const float alpha_l = R::stats_running(alpha[r] * l[r]);
            l[r] = R::stats_running(alpha_l + R::stats_running(beta[r] * R::stats_running(sums[r])));
            alpha[r] = alpha_l;  // kv_outer scales O by alpha l
            m[r] = m_new;
          }
        }
      }
      const bool rescale = framework ? a.order == LoopOrder::q_outer && !first : !first;
      if (rescale)
        FASTUDY_UNROLL
        for (int nt = 0; nt < T::kDTiles; ++nt)
          FASTUDY_UNROLL
          for (int e = 0; e < 4; ++e) o[nt][e] = R::o_running(alpha[e >> 1] * o[nt][e]);
      const bool separate = framework && (a.order == LoopOrder::kv_outer || kTileProduct);
      if (separate)
        FASTUDY_UNROLL
        for (int nt = 0; nt < T::kDTiles; ++nt)
          FASTUDY_UNROLL
          for (int e = 0; e < 4; ++e) pv[nt][e] = 0.0f;
      FASTUDY_UNROLL
      for (int kc = 0; kc < T::kSSteps; ++kc) {
        if (16 * kc >= bca) break;
        std::uint32_t pa[4];
        c_pair_to_a<S>(s[2 * kc], s[2 * kc + 1], pa);
        if (separate) mma_a_regs_b_kmajor<S>(cx, pv, pa, vs, 16 * kc, d, d);
        else mma_a_regs_b_kmajor<S>(cx, o, pa, vs, 16 * kc, d, d);
      }
      if (separate) {
        FASTUDY_UNROLL
        for (int nt = 0; nt < T::kDTiles; ++nt)
          FASTUDY_UNROLL
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            if (a.order == LoopOrder::q_outer) {
              o[nt][e] = R::o_running(o[nt][e] + R::o_running(pv[nt][e]));
            } else if (seen[r]) {
              const float num = R::o_running(R::o_running(alpha[r] * o[nt][e]) +
                                             R::o_running(beta[r] * R::o_running(pv[nt][e])));
              o[nt][e] = R::o_running(R::division(num / l[r]));
            }
          }
      }
    }
    cx.sync_block();
  }
  if (warp_blocks == 0) return;
  // The end of the rows: fa2/fa3 all-reduce the lanes' sums ((l0 + l2) + (l1 + l3)) and multiply by 1/l.
  float scale_out[2], lse[2];
  FASTUDY_UNROLL
  for (int r = 0; r < 2; ++r) {
    if (!framework) {
      const float l02 = R::stats_running(l[r] + cx.shfl_xor(l[r], 2));
      const float lsum = R::stats_running(l02 + cx.shfl_xor(l02, 1));
      scale_out[r] = cuda_tile::kernel_inverse<R>(h.kernel, lsum);
      lse[r] = cuda_tile::kernel_lse<R>(h.kernel, m[r], lsum, h.scale, scale_log2);
    } else {
      scale_out[r] = l[r];
      lse[r] = cuda_tile::framework_lse<R>(m[r], l[r]);
    }
  }
  FASTUDY_UNROLL
  for (int nt = 0; nt < T::kDTiles; ++nt) {
    if (8 * nt >= d) break;
    FASTUDY_UNROLL
    for (int r = 0; r < 2; ++r) {
      const RowCol rc = c_element(lane, 2 * r);
      const std::int64_t row = r0 + rc.row;
      if (row >= h.n) continue;
      float x[2];
      FASTUDY_UNROLL
      for (int e = 0; e < 2; ++e) {
        const float v = o[nt][2 * r + e];
        x[e] = !framework                        ? R::o(R::division(v * scale_out[r]))
               : a.order == LoopOrder::q_outer ? R::o(R::division(v / scale_out[r]))
                                               : R::o(v);
      }
      store_pair<S>(a.o, a.o_float, (base + row) * d + 8 * nt + rc.col, x[0], x[1]);
    }
  }
  if (a.lse != nullptr && thread_in_group(lane) == 0)
    FASTUDY_UNROLL
    for (int r = 0; r < 2; ++r) {
      const std::int64_t row = r0 + c_element(lane, 2 * r).row;
      if (row < h.n) a.lse[base + row] = lse[r];
    }
}

// ---- backward: dK, dV --------------------------------------------------------------------------------
// One block: 64 keys (bx) of head `head`; warp w holds keys 16 w.. in registers (dK, dV accumulators; the
// framework's `ops` keeps them in shared memory and the row block's sums in registers).
template <class R, class T, class Ctx>
FASTUDY_HD inline void mma_dkdv_block(Ctx& cx, const BackwardArgs& a, int bx, int head, unsigned char* smem) {
  constexpr Format S = R::kStorage;
  constexpr int RB = T::kSubRows, NR = RB / 8;
  static_assert(R::kMma, "the tensor-core kernels run readings of fp16/bf16 products into fp32");
  const TileHead& h = a.h;
  const int d = h.d, lane = cx.lane(), warp = cx.warp();
  constexpr bool framework = kFramework<R>;
  const bool ops = framework && h.ops;
  std::uint16_t* ks = reinterpret_cast<std::uint16_t*>(smem);
  std::uint16_t* vs = ks + tile_elements(64, d);
  std::uint16_t* rows = vs + tile_elements(64, d);  // stage s: Q at rows + 2 s tile, dO at rows + (2 s + 1) tile
  const int row_tile = tile_elements(RB, d);
  float* stats = reinterpret_cast<float*>(rows + 4 * row_tile);  // stage s: lse at stats + 2 s RB, D at + RB
  float* acc_smem = stats + 4 * RB;                                // ops: dK then dV, [64][d]
  const std::int64_t base = static_cast<std::int64_t>(head) * h.n;
  const std::int64_t kb0 = static_cast<std::int64_t>(bx) * 64, kw = kb0 + 16 * warp;
  const float scale_log2 = cuda_tile::scale_log2_of(h.scale);
  const cuda_tile::TileScore store = cuda_tile::tile_score_of(h);
  auto all = [](std::int64_t) { return true; };
  load_tile(cx, ks, a.k + base * d, kb0, h.n, 64, d, T::kThreads, all);
  load_tile(cx, vs, a.v + base * d, kb0, h.n, 64, d, T::kThreads, all);
  cx.cp_commit();

  // Row blocks of Br in the reading's order (fa2 last to first, fa3 and the framework first to last),
  // each in steps of RB rows. fa2/fa3 skip a row block when causal and it ends before the key's KV block
  // of Bc; the framework starts at the first row that sees a key of the warp (its 16-block: MMA chains).
  const std::int64_t row_blocks = (h.n + h.br - 1) / h.br;
  const std::int64_t w_kv0 = kw / h.bc * h.bc, b_kv0 = kb0 / h.bc * h.bc;
  const std::int64_t w_lo = framework && h.causal ? kw : 0, b_lo = framework && h.causal ? kb0 : 0;
  auto row_block = [&](std::int64_t step) {
    return framework ? step : cuda_tile::kernel_row_block(h.kernel, step, row_blocks);
  };
  auto visits = [&](std::int64_t i_end, std::int64_t kv0, std::int64_t lo) {
    return framework ? i_end > lo : !(h.causal && i_end - 1 < kv0);
  };
  // The (row block, step) pairs the block visits, in order, as a flat counter.
  const std::int64_t steps_per_block = (h.br + RB - 1) / RB;
  auto sub_of = [&](std::int64_t x, std::int64_t& i0, std::int64_t& i_end, std::int64_t& sb0) {
    i0 = row_block(x / steps_per_block) * h.br;
    i_end = min64(h.n, i0 + h.br);
    sb0 = i0 + (x % steps_per_block) * RB;
    return sb0 < i_end && visits(i_end, b_kv0, b_lo) && sb0 + RB > b_lo;
  };
  const std::int64_t total = row_blocks * steps_per_block;
  auto next_visited = [&](std::int64_t x) {
    std::int64_t i0, i_end, sb0;
    while (x < total && !sub_of(x, i0, i_end, sb0)) ++x;
    return x;
  };
  auto load_rows = [&](std::int64_t x, int stage) {
    std::int64_t i0, i_end, sb0;
    sub_of(x, i0, i_end, sb0);
    auto in_block = [&](std::int64_t row) { return row >= i0 && row < i_end; };
    load_tile(cx, rows + 2 * stage * row_tile, a.q + base * d, sb0, h.n, RB, d, T::kThreads, in_block);
    load_tile(cx, rows + (2 * stage + 1) * row_tile, a.dout + base * d, sb0, h.n, RB, d, T::kThreads, in_block);
    for (int r = cx.thread(); r < RB; r += T::kThreads) {
      const std::int64_t row = sb0 + r;
      const bool valid = row < h.n && in_block(row);
      stats[2 * stage * RB + r] = valid ? a.lse[base + row] : 0.0f;
      stats[(2 * stage + 1) * RB + r] = valid ? a.dd[base + row] : 0.0f;
    }
  };

  float dk[T::kDTiles][4], dv[T::kDTiles][4];  // accumulators (ops: the row block's sums)
  FASTUDY_UNROLL
  for (int nt = 0; nt < T::kDTiles; ++nt)
    FASTUDY_UNROLL
    for (int e = 0; e < 4; ++e) dk[nt][e] = dv[nt][e] = 0.0f;
  if (ops)
    for (int x = cx.thread(); x < 2 * 64 * d; x += T::kThreads) acc_smem[x] = 0.0f;

  std::int64_t x = next_visited(0);
  if (x < total) load_rows(x, 0);
  cx.cp_commit();
  int stage = 0;
  // ops: the warp's row-block sums are handed on when its row block ends.
  auto flush = [&]() {
    FASTUDY_UNROLL
    for (int nt = 0; nt < T::kDTiles; ++nt) {
      if (8 * nt >= d) break;
      FASTUDY_UNROLL
      for (int e = 0; e < 4; ++e) {
        const RowCol rc = c_element(lane, e);
        const int key = 16 * warp + rc.row, col = 8 * nt + rc.col;
        float& ak = acc_smem[key * d + col];
        float& av = acc_smem[64 * d + key * d + col];
        ak = cuda_tile::tile_op_value<R>(ak, dk[nt][e], h.placement, h.scale);
        av = cuda_tile::tile_op_value<R>(av, dv[nt][e], ScalePlacement::before, h.scale);
        dk[nt][e] = dv[nt][e] = 0.0f;
      }
    }
  };
  bool pending = false;  // ops: the warp holds sums of a row block not yet handed on
  std::int64_t pending_block = -1;
  while (x < total) {
    const std::int64_t next = next_visited(x + 1);
    if (next < total) {
      load_rows(next, stage ^ 1);
      cx.cp_commit();
      cx.template cp_wait<1>();
    } else {
      cx.template cp_wait<0>();
    }
    cx.sync_block();
    std::int64_t i0, i_end, sb0;
    sub_of(x, i0, i_end, sb0);
    if (ops && pending && pending_block != i0) {
      flush();
      pending = false;
    }
    if (kw < h.n && visits(i_end, w_kv0, w_lo) && sb0 + RB > w_lo) {
      const std::uint16_t* qs = rows + 2 * stage * row_tile;
      const std::uint16_t* dos = qs + row_tile;
      const float* lse_s = stats + 2 * stage * RB;
      const float* dd_s = lse_s + RB;
      float st[NR][4], dpt[NR][4];
      FASTUDY_UNROLL
      for (int nt = 0; nt < NR; ++nt)
        FASTUDY_UNROLL
        for (int e = 0; e < 4; ++e) st[nt][e] = dpt[nt][e] = 0.0f;
      mma_a_tile_b_nmajor<S, T::kDSteps>(cx, st, ks, 16 * warp, qs, d, d / 16, RB);
      mma_a_tile_b_nmajor<S, T::kDSteps>(cx, dpt, vs, 16 * warp, dos, d, d / 16, RB);
      // P^T and dS^T: key j (row of the fragment), query row i (column).
      FASTUDY_UNROLL
      for (int nt = 0; nt < NR; ++nt)
        FASTUDY_UNROLL
        for (int e = 0; e < 4; ++e) {
          const RowCol rc = c_element(lane, e);
          const std::int64_t j = kw + rc.row, i = sb0 + 8 * nt + rc.col;
          float p = 0.0f, ds = 0.0f;
          if (j < h.n && i < h.n && i >= i0 && i < i_end && i >= w_lo) {
            const int r = static_cast<int>(i - sb0);
            if (framework) {
              cuda_tile::flash_backward_values<R>(st[nt][e], dpt[nt][e], h.scale, store, h.ops, lse_s[r], dd_s[r],
                                                  h.causal && i < j, p, ds);
            } else {
              cuda_tile::kernel_backward_values<R>(st[nt][e], dpt[nt][e], scale_log2, lse_s[r], dd_s[r],
                                                   h.causal && j > i, p, ds);
            }
          }
          st[nt][e] = p;
          dpt[nt][e] = ds;
        }
      FASTUDY_UNROLL
      for (int kc = 0; kc < RB / 16; ++kc) {
        const std::int64_t c0 = sb0 + 16 * kc;
        if (c0 >= i_end || c0 + 16 <= w_lo) continue;  // not in the row block, or before the warp's first row
        std::uint32_t pa[4], da[4];
        c_pair_to_a<S>(st[2 * kc], st[2 * kc + 1], pa);
        c_pair_to_a<S>(dpt[2 * kc], dpt[2 * kc + 1], da);
        mma_a_regs_b_kmajor<S>(cx, dv, pa, dos, 16 * kc, d, d);
        mma_a_regs_b_kmajor<S>(cx, dk, da, qs, 16 * kc, d, d);
      }
      if (ops) {
        pending = true;
        pending_block = i0;
      }
    }
    cx.sync_block();
    stage ^= 1;
    x = next;
  }
  if (ops && pending) flush();
  cx.sync_block();
  if (kw >= h.n) return;
  FASTUDY_UNROLL
  for (int nt = 0; nt < T::kDTiles; ++nt) {
    if (8 * nt >= d) break;
    FASTUDY_UNROLL
    for (int r = 0; r < 2; ++r) {
      const RowCol rc = c_element(lane, 2 * r);
      const std::int64_t j = kw + rc.row;
      if (j >= h.n) continue;
      float gk[2], gv[2];
      FASTUDY_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int col = 8 * nt + rc.col + e, key = 16 * warp + rc.row;
        const float ak = ops ? acc_smem[key * d + col] : dk[nt][2 * r + e];
        const float av = ops ? acc_smem[64 * d + key * d + col] : dv[nt][2 * r + e];
        gk[e] = cuda_tile::stored_dk<R>(h.grad_placement, h.scale, ak);
        gv[e] = cuda_tile::stored_dv<R>(av);
      }
      const std::int64_t index = (base + j) * d + 8 * nt + rc.col;
      store_pair<S>(a.dk, a.grad_float, index, gk[0], gk[1]);
      store_pair<S>(a.dv, a.grad_float, index, gv[0], gv[1]);
    }
  }
}

// ---- backward: dQ ------------------------------------------------------------------------------------
// One block: 64 query rows (bx) of head `head`; warp w holds rows 16 w.. (dQ accumulator, and fa2/fa3's
// part or the framework `ops` tile sum).
template <class R, class T, class Ctx>
FASTUDY_HD inline void mma_dq_block(Ctx& cx, const BackwardArgs& a, int bx, int head, unsigned char* smem) {
  constexpr Format S = R::kStorage;
  constexpr int KB = T::kSubKeys, NK = KB / 8;
  static_assert(R::kMma, "the tensor-core kernels run readings of fp16/bf16 products into fp32");
  const TileHead& h = a.h;
  const int d = h.d, bc = h.bc, lane = cx.lane(), warp = cx.warp();
  constexpr bool framework = kFramework<R>;
  std::uint16_t* qs = reinterpret_cast<std::uint16_t*>(smem);
  std::uint16_t* dos = qs + tile_elements(64, d);
  std::uint16_t* keys = dos + tile_elements(64, d);  // stage s: K at keys + 2 s tile, V at + (2 s + 1) tile
  const int key_tile = tile_elements(KB, d);
  float* stats = reinterpret_cast<float*>(keys + 4 * key_tile);  // lse then D of the block's 64 rows
  const std::int64_t base = static_cast<std::int64_t>(head) * h.n;
  const std::int64_t i0 = static_cast<std::int64_t>(bx) * 64, r0 = i0 + 16 * warp;
  const float scale_log2 = cuda_tile::scale_log2_of(h.scale);
  const cuda_tile::TileScore store = cuda_tile::tile_score_of(h);
  auto all = [](std::int64_t) { return true; };
  load_tile(cx, qs, a.q + base * d, i0, h.n, 64, d, T::kThreads, all);
  load_tile(cx, dos, a.dout + base * d, i0, h.n, 64, d, T::kThreads, all);
  for (int r = cx.thread(); r < 64; r += T::kThreads) {
    const std::int64_t row = i0 + r;
    stats[r] = row < h.n ? a.lse[base + row] : 0.0f;
    stats[64 + r] = row < h.n ? a.dd[base + row] : 0.0f;
  }
  cx.cp_commit();

  // The keys a row sees: fa2/fa3 whole KV blocks of Bc up to the one past the row's row block (causal);
  // the framework keys up to the end of the row's 16-block (causal: the warp's last row + 1), in
  // segments of Bc with `ops`. The block's key range is its last warp's.
  auto key_end = [&](std::int64_t r_first) {
    if (!h.causal) return h.n;
    if (framework) return min64(h.n, r_first + 16);
    const std::int64_t i_last = min64(h.n, r_first / h.br * h.br + h.br) - 1;
    return min64(h.n, (i_last / bc + 1) * bc);  // KV blocks with j0 <= i_last
  };
  const std::int64_t w_end = r0 < h.n ? key_end(r0) : 0;
  const std::int64_t b_end = key_end(min64(h.n, i0 + 64) - 1 - (min64(h.n, i0 + 64) - 1 - i0) % 16);
  const std::int64_t steps = (b_end + KB - 1) / KB;
  auto load_keys = [&](std::int64_t step, int stage) {
    load_tile(cx, keys + 2 * stage * key_tile, a.k + base * d, step * KB, b_end, KB, d, T::kThreads, all);
    load_tile(cx, keys + (2 * stage + 1) * key_tile, a.v + base * d, step * KB, b_end, KB, d, T::kThreads, all);
  };
  if (steps > 0) load_keys(0, 0);
  cx.cp_commit();

  float dq[T::kDTiles][4], part[T::kDTiles][4];
  FASTUDY_UNROLL
  for (int nt = 0; nt < T::kDTiles; ++nt)
    FASTUDY_UNROLL
    for (int e = 0; e < 4; ++e) dq[nt][e] = part[nt][e] = 0.0f;
  const bool parts = !framework || h.ops;  // a segment's product summed from zero, then handed on
  const std::int64_t segment = framework && !h.ops ? h.n : bc;
  auto hand_on = [&]() {
    FASTUDY_UNROLL
    for (int nt = 0; nt < T::kDTiles; ++nt)
      FASTUDY_UNROLL
      for (int e = 0; e < 4; ++e) {
        dq[nt][e] = framework ? cuda_tile::tile_op_value<R>(dq[nt][e], part[nt][e], h.placement, h.scale)
                              : R::accum(dq[nt][e] + part[nt][e]);
        part[nt][e] = 0.0f;
      }
  };
  for (std::int64_t step = 0; step < steps; ++step) {
    const int stage = static_cast<int>(step & 1);
    if (step + 1 < steps) {
      load_keys(step + 1, stage ^ 1);
      cx.cp_commit();
      cx.template cp_wait<1>();
    } else {
      cx.template cp_wait<0>();
    }
    cx.sync_block();
    const std::int64_t kb = step * KB;
    if (kb < w_end) {
      const std::uint16_t* kt = keys + 2 * stage * key_tile;
      const std::uint16_t* vt = kt + key_tile;
      const int klim = static_cast<int>(min64(KB, w_end - kb));
      float s[NK][4], dp[NK][4];
      FASTUDY_UNROLL
      for (int nt = 0; nt < NK; ++nt)
        FASTUDY_UNROLL
        for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
      mma_a_tile_b_nmajor<S, T::kDSteps>(cx, s, qs, 16 * warp, kt, d, d / 16, klim);
      mma_a_tile_b_nmajor<S, T::kDSteps>(cx, dp, dos, 16 * warp, vt, d, d / 16, klim);
      FASTUDY_UNROLL
      for (int nt = 0; nt < NK; ++nt)
        FASTUDY_UNROLL
        for (int e = 0; e < 4; ++e) {
          const RowCol rc = c_element(lane, e);
          const std::int64_t i = r0 + rc.row, j = kb + 8 * nt + rc.col;
          float p = 0.0f, ds = 0.0f;
          if (i < h.n && j < w_end) {
            const float lse_i = stats[16 * warp + rc.row], d_i = stats[64 + 16 * warp + rc.row];
            if (framework) {
              cuda_tile::flash_backward_values<R>(s[nt][e], dp[nt][e], h.scale, store, h.ops, lse_i, d_i,
                                                  h.causal && j > i, p, ds);
            } else {
              cuda_tile::kernel_backward_values<R>(s[nt][e], dp[nt][e], scale_log2, lse_i, d_i, h.causal && j > i, p,
                                                   ds);
            }
          }
          dp[nt][e] = ds;
        }
      FASTUDY_UNROLL
      for (int kc = 0; kc < KB / 16; ++kc) {
        const std::int64_t c0 = kb + 16 * kc;
        if (c0 >= w_end) break;
        std::uint32_t da[4];
        c_pair_to_a<S>(dp[2 * kc], dp[2 * kc + 1], da);
        if (parts) mma_a_regs_b_kmajor<S>(cx, part, da, kt, 16 * kc, d, d);
        else mma_a_regs_b_kmajor<S>(cx, dq, da, kt, 16 * kc, d, d);
        // The end of a segment (a KV block of Bc, Bc a multiple of 16): hand its part on.
        if (parts && ((c0 + 16) % segment == 0 || c0 + 16 >= w_end)) hand_on();
      }
    }
    cx.sync_block();
  }
  if (r0 >= h.n) return;
  FASTUDY_UNROLL
  for (int nt = 0; nt < T::kDTiles; ++nt) {
    if (8 * nt >= d) break;
    FASTUDY_UNROLL
    for (int r = 0; r < 2; ++r) {
      const RowCol rc = c_element(lane, 2 * r);
      const std::int64_t i = r0 + rc.row;
      if (i >= h.n) continue;
      const float g0 = cuda_tile::stored_dq<R>(h.grad_placement, h.scale, dq[nt][2 * r]);
      const float g1 = cuda_tile::stored_dq<R>(h.grad_placement, h.scale, dq[nt][2 * r + 1]);
      store_pair<S>(a.dq, a.grad_float, (base + i) * d + 8 * nt + rc.col, g0, g1);
    }
  }
}

}  // namespace fastudy::cuda_mma
