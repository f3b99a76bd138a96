// CPU tests of the tensor-core attention kernels (kernels/cuda/mma_attention.hpp): their fragment and
// ldmatrix maps against the PTX ISA's tables, the fp16/bf16 packing, a plain matrix product by one
// simulated warp, and the whole kernels run by the warp simulation (tests/gpu/warp_sim.hpp) against the
// host twin (kernels/cuda/tile_reference.hpp), bit for bit, and against the fp64 reference within the
// check harness's bounds: causal and not, N not a multiple of the tiles, d 32, 64 and 128, fp16 and
// bf16, every tensor-core reading (fa2, fa3, and the framework loops of mixed and eager in both loop
// orders). No GPU involved: this is what the GPU runs, on the host.
//
// B batch, H heads, N sequence, d head dim.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/check.hpp"
#include "kernels/cuda/mma_attention.hpp"
#include "kernels/cuda/tile_reference.hpp"
#include "tests/gpu/common.hpp"
#include "tests/gpu/mismatch.hpp"
#include "tests/gpu/mma_sim.hpp"
#include "tests/gpu/warp_sim.hpp"

namespace fastudy {
namespace {

using namespace gpu_test;
using cuda_mma::RowCol;

bool same(RowCol a, int row, int col) { return a.row == row && a.col == col; }

// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type": the figures' entries for
// lanes 0, 5 (group 1, thread 1) and 31 (group 7, thread 3).
TEST(MmaLayout, FragmentsAreThePtxIsaTables) {
  const int a_rows[3][8] = {{0, 0, 8, 8, 0, 0, 8, 8}, {1, 1, 9, 9, 1, 1, 9, 9}, {7, 7, 15, 15, 7, 7, 15, 15}};
  const int a_cols[3][8] = {{0, 1, 0, 1, 8, 9, 8, 9}, {2, 3, 2, 3, 10, 11, 10, 11}, {6, 7, 6, 7, 14, 15, 14, 15}};
  const int b_rows[3][4] = {{0, 1, 8, 9}, {2, 3, 10, 11}, {6, 7, 14, 15}};
  const int c_rows[3][4] = {{0, 0, 8, 8}, {1, 1, 9, 9}, {7, 7, 15, 15}};
  const int c_cols[3][4] = {{0, 1, 0, 1}, {2, 3, 2, 3}, {6, 7, 6, 7}};
  const int lanes[3] = {0, 5, 31}, groups[3] = {0, 1, 7};
  for (int x = 0; x < 3; ++x) {
    for (int i = 0; i < 8; ++i)
      EXPECT_TRUE(same(cuda_mma::a_element(lanes[x], i), a_rows[x][i], a_cols[x][i])) << "A lane " << lanes[x] << " a" << i;
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(same(cuda_mma::b_element(lanes[x], i), b_rows[x][i], groups[x])) << "B lane " << lanes[x] << " b" << i;
      EXPECT_TRUE(same(cuda_mma::c_element(lanes[x], i), c_rows[x][i], c_cols[x][i])) << "C lane " << lanes[x] << " c" << i;
    }
  }
  // Every element of A (16 x 16), B (16 x 8) and C (16 x 8) is held by exactly one lane.
  std::set<int> a, b, c;
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) a.insert(cuda_mma::a_element(lane, i).row * 16 + cuda_mma::a_element(lane, i).col);
    for (int i = 0; i < 4; ++i) {
      b.insert(cuda_mma::b_element(lane, i).row * 8 + cuda_mma::b_element(lane, i).col);
      c.insert(cuda_mma::c_element(lane, i).row * 8 + cuda_mma::c_element(lane, i).col);
    }
  }
  EXPECT_EQ(a.size(), 256u);
  EXPECT_EQ(b.size(), 128u);
  EXPECT_EQ(c.size(), 128u);
}

// PTX ISA, "ldmatrix": lane l addresses row l % 8 of matrix l / 8 and receives row l / 4, columns
// 2 (l % 4), +1 (.trans: those rows of column l / 4).
TEST(MmaLayout, LdmatrixIsThePtxIsaTable) {
  EXPECT_EQ(cuda_mma::ldsm_matrix_of(13), 1);
  EXPECT_EQ(cuda_mma::ldsm_row_of(13), 5);
  EXPECT_TRUE(same(cuda_mma::ldsm_element(5, 0, false), 1, 2));
  EXPECT_TRUE(same(cuda_mma::ldsm_element(5, 1, false), 1, 3));
  EXPECT_TRUE(same(cuda_mma::ldsm_element(5, 0, true), 2, 1));
  EXPECT_TRUE(same(cuda_mma::ldsm_element(5, 1, true), 3, 1));
  EXPECT_TRUE(same(cuda_mma::ldsm_element(31, 1, false), 7, 7));
  // The operand loads give matrices in register order: A (rows 0-7 | 8-15) x (k 0-7 | 8-15) as a0a1, a2a3,
  // a4a5, a6a7.
  EXPECT_TRUE(same(cuda_mma::ldsm_a_address(9, 16, 32), 16 + 1 + 8, 32));
  EXPECT_TRUE(same(cuda_mma::ldsm_a_address(17, 16, 32), 16 + 1, 40));
  EXPECT_TRUE(same(cuda_mma::ldsm_b_nmajor_address(9, 0, 0), 1, 8));
  EXPECT_TRUE(same(cuda_mma::ldsm_b_nmajor_address(17, 0, 0), 9, 0));
  EXPECT_TRUE(same(cuda_mma::ldsm_b_kmajor_address(9, 0, 0), 9, 0));
  EXPECT_TRUE(same(cuda_mma::ldsm_b_kmajor_address(17, 0, 0), 1, 8));
}

TEST(MmaLayout, StorageBitsRoundTripEveryFp16AndBf16Value) {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float h = cuda_mma::storage_value<Format::fp16>(bits), f = cuda_mma::storage_value<Format::bf16>(bits);
    if (!std::isnan(h)) {
      EXPECT_EQ(cuda_mma::storage_bits<Format::fp16>(h), bits) << std::hex << b;
      EXPECT_EQ(round_to_format<Format::fp16>(h), h) << std::hex << b;
    }
    if (!std::isnan(f)) {
      EXPECT_EQ(cuda_mma::storage_bits<Format::bf16>(f), bits) << std::hex << b;
    }
  }
  EXPECT_EQ(cuda_mma::storage_value<Format::fp16>(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(cuda_mma::storage_value<Format::fp16>(0x3C00), 1.0f);
  EXPECT_EQ(cuda_mma::storage_value<Format::bf16>(0xC000), -2.0f);
}

// One simulated warp multiplies a 16 x 32 A by a 32 x 16 B through the kernels' own loads (ldmatrix from
// padded tiles) and mma.sync: small integers give the exact product; random values give, per output,
// the twin's MMA chain (cuda_tile::dot of the tensor-core readings) bit for bit.
template <Format S>
void check_warp_product(bool integers) {
  using R = cuda_tile::TileRounding<S, Format::fp32, Format::fp32>;
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> small(-8, 8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int M = 16, K = 32, N = 16;
  std::vector<float> A(M * K), Bt(N * K);  // Bt: B transposed (n-major), as K is in S = Q K^T
  for (float& x : A) x = round_to_format<S>(integers ? static_cast<float>(small(gen)) : normal(gen));
  for (float& x : Bt) x = round_to_format<S>(integers ? static_cast<float>(small(gen)) : normal(gen));
  const std::size_t a_elems = cuda_mma::tile_elements(M, K), b_elems = cuda_mma::tile_elements(N, K);
  std::vector<float> C(M * N);
  cuda_mma::simulate_block(32, 2 * (a_elems + b_elems), [&](cuda_mma::HostWarp& cx, unsigned char* smem) {
    auto* as = reinterpret_cast<std::uint16_t*>(smem);
    auto* bs = as + a_elems;
    if (cx.lane() == 0) {
      for (int r = 0; r < M; ++r)
        for (int k = 0; k < K; ++k) as[cuda_mma::tile_offset(r, k, K)] = cuda_mma::storage_bits<S>(A[r * K + k]);
      for (int n = 0; n < N; ++n)
        for (int k = 0; k < K; ++k) bs[cuda_mma::tile_offset(n, k, K)] = cuda_mma::storage_bits<S>(Bt[n * K + k]);
    }
    cx.sync_warp();
    float acc[2][4] = {};
    cuda_mma::mma_a_tile_b_nmajor<S, 2>(cx, acc, as, 0, bs, K, K / 16, N);
    for (int nt = 0; nt < 2; ++nt)
      for (int e = 0; e < 4; ++e) {
        const RowCol rc = cuda_mma::c_element(cx.lane(), e);
        C[rc.row * N + 8 * nt + rc.col] = acc[nt][e];
      }
  });
  for (int r = 0; r < M; ++r)
    for (int n = 0; n < N; ++n) {
      if (integers) {
        double exact = 0.0;
        for (int k = 0; k < K; ++k) exact += static_cast<double>(A[r * K + k]) * Bt[n * K + k];
        EXPECT_EQ(C[r * N + n], exact) << r << "," << n;
      } else {
        const float chain = cuda_tile::dot<R>(&A[r * K], &Bt[n * K], 1, K);
        EXPECT_EQ(std::memcmp(&C[r * N + n], &chain, 4), 0) << r << "," << n << ": " << C[r * N + n] << " vs " << chain;
      }
    }
}

TEST(MmaWarp, PlainProductExactOnIntegersAndTheTwinsChainOnRandomValues) {
  check_warp_product<Format::bf16>(true);
  check_warp_product<Format::fp16>(true);
  check_warp_product<Format::bf16>(false);
  check_warp_product<Format::fp16>(false);
}

// ---- the kernels against the twin ---------------------------------------------------------------------
struct Case {
  const char* reading;
  LoopOrder order;  // framework loops only
  Format format;
  std::int64_t n, d;
  int block_q, block_kv;
  bool causal;
  std::int64_t heads = 2;
};

std::string name_of(const Case& c) {
  return std::string(c.reading) + " " + std::string(to_string(c.format)) +
         (std::string(c.reading) == "fa2" || std::string(c.reading) == "fa3" ? std::string()
                                                                              : " " + std::string(to_string(c.order))) +
         " N=" + std::to_string(c.n) + " d=" + std::to_string(c.d) + " Br=" + std::to_string(c.block_q) +
         " Bc=" + std::to_string(c.block_kv) + (c.causal ? " causal" : "");
}

void check_case(const Case& c, bool backward) {
  AttentionShape shape;
  shape.batch = 1;
  shape.heads = c.heads;
  shape.seq_len = c.n;
  shape.head_dim = c.d;
  shape.causal = c.causal;
  AttentionParams params;
  params.attention = AttentionKind::flash;
  params.order = c.order;
  params.policy = make_policy(c.reading, c.format, AttentionKind::flash);
  params.block_q = c.block_q;
  params.block_kv = c.block_kv;
  const std::string what = name_of(c);
  ASSERT_TRUE(mma_runs(shape, params)) << what;
  const std::size_t size = static_cast<std::size_t>(c.heads * c.n * c.d), rows = static_cast<std::size_t>(c.heads * c.n);
  const std::vector<float> q = random_normal(size, 61), k = random_normal(size, 62), v = random_normal(size, 63);
  std::vector<float> o_twin(size), lse_twin(rows), o_sim(size), lse_sim(rows);
  cuda_tile::attention_forward_host(shape, params, q.data(), k.data(), v.data(), o_twin.data(), lse_twin.data());
  mma_forward_sim(shape, params, q.data(), k.data(), v.data(), o_sim.data(), lse_sim.data());
  EXPECT_EQ(first_mismatch("O", o_sim, o_twin, c.n, c.d), "") << what;
  EXPECT_EQ(first_mismatch("lse", lse_sim, lse_twin, c.n, 1), "") << what;
  if (!backward) return;
  const std::vector<float> g = random_normal(size, 64);
  std::vector<float> twin(3 * size), sim(3 * size);
  cuda_tile::attention_backward_host(shape, params, q.data(), k.data(), v.data(), o_twin.data(), lse_twin.data(),
                                     g.data(), twin.data(), twin.data() + size, twin.data() + 2 * size);
  mma_backward_sim(shape, params, q.data(), k.data(), v.data(), o_twin.data(), lse_twin.data(), g.data(), sim.data(),
                   sim.data() + size, sim.data() + 2 * size);
  const char* names[3] = {"dQ", "dK", "dV"};
  for (int x = 0; x < 3; ++x) {
    const std::vector<float> a(sim.begin() + x * size, sim.begin() + (x + 1) * size);
    const std::vector<float> b(twin.begin() + x * size, twin.begin() + (x + 1) * size);
    EXPECT_EQ(first_mismatch(names[x], a, b, c.n, c.d), "") << what;
  }
}

// Every reading and loop order, both formats, causal and not, on one small ragged shape (N = 45: the last
// KV tile and the last 16 rows partial; 3 KV tiles of 16, row blocks of 32).
TEST(MmaKernels, EveryReadingMatchesTheTwinBitForBit) {
  for (const char* reading : {"fa2", "fa3", "mixed", "eager"})
    for (LoopOrder order : {LoopOrder::q_outer, LoopOrder::kv_outer})
      for (Format f : {Format::bf16, Format::fp16})
        for (bool causal : {true, false}) {
          const bool kernel = std::string(reading) == "fa2" || std::string(reading) == "fa3";
          if (kernel && order == LoopOrder::kv_outer) continue;
          check_case({reading, order, f, 45, 32, 32, 16, causal}, true);
        }
}

// The shapes of the kernels' other traits and tiles: d 64 with KV tiles of 128 keys and more than one
// block of 64 rows (N = 150), d 128 with 64-key tiles, head dim 16 (the demo model), row blocks of 16.
TEST(MmaKernels, LargerTilesAndHeadDimsMatchTheTwinBitForBit) {
  check_case({"fa2", LoopOrder::q_outer, Format::bf16, 150, 64, 64, 128, true, 1}, true);
  check_case({"mixed", LoopOrder::kv_outer, Format::bf16, 150, 64, 128, 64, true, 1}, true);
  check_case({"eager", LoopOrder::q_outer, Format::fp16, 70, 128, 64, 64, true, 1}, true);
  check_case({"fa3", LoopOrder::q_outer, Format::bf16, 70, 128, 16, 32, false, 1}, true);
  check_case({"mixed", LoopOrder::q_outer, Format::bf16, 64, 16, 16, 16, true, 1}, true);
}

// max_offset and the `before` scale placement run through the same kernels.
TEST(MmaKernels, MaxOffsetAndScalePlacementMatchTheTwin) {
  AttentionShape shape;
  shape.batch = 1;
  shape.heads = 1;
  shape.seq_len = 40;
  shape.head_dim = 32;
  shape.causal = true;
  for (const char* reading : {"fa2", "eager"}) {
    AttentionParams params;
    params.attention = AttentionKind::flash;
    params.order = LoopOrder::q_outer;
    params.policy = make_policy(reading, Format::bf16, AttentionKind::flash);
    params.policy.max_offset = 2.0;
    if (std::string(reading) == "eager") params.policy.scale = ScalePlacement::before;
    params.block_q = 16;
    params.block_kv = 16;
    const std::size_t size = 40 * 32;
    std::vector<float> q = random_normal(size, 71), k = random_normal(size, 72), v = random_normal(size, 73);
    for (int j = 0; j < 4; ++j)
      for (int t = 0; t < 32; ++t) k[j * 32 + t] = 3.0f * q[5 * 32 + t];  // repeated row maxima
    std::vector<float> o_twin(size), lse_twin(40), o_sim(size), lse_sim(40);
    cuda_tile::attention_forward_host(shape, params, q.data(), k.data(), v.data(), o_twin.data(), lse_twin.data());
    mma_forward_sim(shape, params, q.data(), k.data(), v.data(), o_sim.data(), lse_sim.data());
    EXPECT_EQ(first_mismatch("O", o_sim, o_twin, 40, 32), "") << reading;
    EXPECT_EQ(first_mismatch("lse", lse_sim, lse_twin, 40, 1), "") << reading;
  }
}

// The simulated kernels against the fp64 reference (the check harness's bounds: forward on max |dO|,
// backward on the relative L2 error of dQ, dK, dV, from the formats' unit roundoffs).
TEST(MmaKernels, WithinTheBoundsOfTheFp64Reference) {
  AttentionShape shape;
  shape.batch = 1;
  shape.heads = 2;
  shape.seq_len = 80;
  shape.head_dim = 64;
  shape.causal = true;
  const std::size_t size = static_cast<std::size_t>(2 * 80 * 64);
  const std::vector<float> q0 = random_normal(size, 81), k0 = random_normal(size, 82), v0 = random_normal(size, 83);
  const std::vector<float> g0 = random_normal(size, 84);
  for (const char* reading : {"fa2", "mixed", "eager"}) {
    AttentionParams params;
    params.attention = AttentionKind::flash;
    params.policy = make_policy(reading, Format::bf16, AttentionKind::flash);
    params.block_q = 64;
    params.block_kv = 32;
    const AttentionReference ref = make_reference(shape, params.policy, widen(q0), widen(k0), widen(v0), widen(g0));
    const ForwardCheck<float> fwd = check_forward<float>(ref, params, [](const AttentionShape& s, const AttentionParams& p,
                                                                          const float* q, const float* k, const float* v,
                                                                          float* o, float* lse) {
      mma_forward_sim(s, p, q, k, v, o, lse);
      return AttentionStats{};
    });
    EXPECT_TRUE(fwd.ok()) << reading << ": " << fwd.summary();
    const BackwardCheck<float> bwd = check_backward<float>(
        ref, params,
        [](const AttentionShape& s, const AttentionParams& p, const float* q, const float* k, const float* v, float* o,
           float* lse) {
          mma_forward_sim(s, p, q, k, v, o, lse);
          return AttentionStats{};
        },
        mma_backward_sim);
    EXPECT_TRUE(bwd.ok()) << reading << ": " << bwd.summary();
  }
}

}  // namespace
}  // namespace fastudy
