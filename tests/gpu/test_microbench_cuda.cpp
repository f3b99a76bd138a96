// Our CUDA kernels as microbenchmark algorithms (kernels/cuda/microbench_cuda.hpp): on the inputs of a
// point whose CPU kernels ran, the cuda_flash / cuda_baseline rows and their check against the CPU
// kernels. Device tests skip with "no CUDA device: <reason>" where none is visible (as on CI machines);
// the refusal of policies the CUDA kernels lack runs everywhere (checked before any CUDA call).
//
// B batch, H heads, N sequence, d head dim.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.hpp"
#include "kernels/attention.hpp"
#include "kernels/cuda/attention_cuda.hpp"
#include "kernels/cuda/microbench_cuda.hpp"
#include "kernels/microbench.hpp"

namespace fastudy {
namespace {

class CudaMicrobench : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

MicrobenchPoint point(Pass pass, Format f, const char* policy, bool causal) {
  MicrobenchPoint p;
  p.pass = pass;
  p.format = f;
  p.policy = policy;
  p.seq_len = 77;  // ragged last tiles
  p.head_dim = 24;
  p.block_q = 16;
  p.block_kv = 20;
  p.heads = 3;
  p.batch = 2;
  p.causal = causal;
  return p;
}

// Every format, reading, pass and mask the CUDA kernels run: bit-identical to the CPU kernels where the
// host twin promises it (float buffers, an FMA instruction set, no tensor-core products), else within
// twice the harness bound;
// with bit identity, the rows' errors against the golden value are the CPU rows' exactly.
TEST_F(CudaMicrobench, RowsAreCheckedAgainstTheCpuKernels) {
  for (Pass pass : kAllPasses)
    for (Format f : {Format::fp32, Format::fp16, Format::bf16})
      for (const char* policy : {"pure", "eager", "fa2", "fa3", "mixed"})
        for (bool causal : {false, true}) {
          const MicrobenchPoint p = point(pass, f, policy, causal);
          MicrobenchRun run;
          const std::vector<MicrobenchRow> cpu = run_microbench_point(p, std::nullopt, 1, nullptr, &run);
          const std::vector<MicrobenchRow> rows = cuda::microbench_cuda_rows(run);
          ASSERT_EQ(rows.size(), 2u);
          const std::string what = std::string(to_string(pass)) + " " + std::string(to_string(f)) + " " + policy +
                                   (causal ? " causal" : "");
          EXPECT_EQ(rows[0].algorithm, "cuda_flash");
          EXPECT_EQ(rows[1].algorithm, "cuda_baseline");
          for (int i = 0; i < 2; ++i) {
            if (cuda::cpu_bit_identity_promised(run, i == 0 ? AttentionKind::flash : AttentionKind::baseline)) {
              EXPECT_EQ(rows[i].check, "bit-identical") << what << " " << rows[i].algorithm;
              EXPECT_EQ(rows[i].max_abs, cpu[i].max_abs) << what << " " << rows[i].algorithm;
            } else {
              EXPECT_EQ(rows[i].check, "within bound") << what << " " << rows[i].algorithm << ": vs_cpu "
                                                       << rows[i].vs_cpu << " bound " << rows[i].check_bound;
              EXPECT_GT(rows[i].check_bound, 0.0) << what;
            }
            EXPECT_EQ(rows[i].tiles_kv, cpu[i].tiles_kv) << what;
          }
        }
}

// The microbench preflight asks check_flash_tiles before any work: configs/gpu-microbench.toml's tiles
// (64 x 64 at d = 128: 4 (2 Bc d + Br Bc + Br d) = 114688 bytes) fit an A100 or H100; 1024 x 1024 at
// d = 1024 (12 MiB) fits no GPU.
TEST_F(CudaMicrobench, FlashTilesAreCheckedBeforeAnyLaunch) {
  EXPECT_EQ(cuda::check_flash_tiles(64, 64, 128), 114688u);
  EXPECT_THROW(cuda::check_flash_tiles(1024, 1024, 1024), UsageError);
  EXPECT_THROW(cuda::check_flash_tiles(2048, 1, 1), UsageError);  // more than 1024 threads per block
}

// Checked before any CUDA call: runs without a device too.
TEST(CudaMicrobenchApi, PoliciesTheKernelsLackAreAUsageError) {
  MicrobenchPoint p = point(Pass::forward, Format::bf16, "mixed", false);
  p.rounding = Rounding::stochastic;
  MicrobenchRun run;
  run_microbench_point(p, std::nullopt, 1, nullptr, &run);
  try {
    cuda::microbench_cuda_rows(run);
    FAIL() << "a stochastic-rounding policy ran on the CUDA kernels";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("not available in the CUDA attention kernels"), std::string::npos) << e.what();
  }
  MicrobenchRun fresh =
      prepare_microbench_point(point(Pass::forward, Format::bf16, "mixed", false), std::nullopt, 1, nullptr);
  EXPECT_THROW(cuda::microbench_cuda_rows(fresh), Error);  // the CPU kernels have not run
}

}  // namespace
}  // namespace fastudy
