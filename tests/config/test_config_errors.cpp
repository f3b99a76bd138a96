// One test per configuration error message: each bad grid.toml must fail with a ConfigError that
// names the file and line (and column), the offending key, says what is allowed, and, where a typo
// is likely, suggests the fix.
#include <gtest/gtest.h>

#include <string>

#include "fastudy/version.hpp"  // FASTUDY_TORCH_SDPA, FASTUDY_TORCH_CUDA, FASTUDY_CUDA_KERNELS
#include "src/core/config.hpp"

using namespace fastudy;

namespace {

struct BadCase {
  const char* name;
  const char* toml;
  int line;              // expected line of the error
  const char* key;       // expected key (ConfigError::key())
  const char* fragment;  // expected text in the message
  const char* also = "";  // a second expected text (e.g. the hint); "" for none
};

const BadCase kCases[] = {
    {"syntax_error", "[model]\nd_model = = 3\n", 2, "", "TOML syntax error"},
    {"unknown_section", "[modle]\nd_model = 64\n", 1, "modle", "did you mean `model`?"},
    {"unknown_key_typo", "[model]\nd_modle = 64\n", 2, "model.d_modle", "did you mean `d_model`?"},
    {"wrong_type_string", "[model]\nd_model = \"64\"\n", 2, "model.d_model", "must be an integer (got a string)"},
    {"float_for_int", "[model]\nlayers = 2.5\n", 2, "model.layers", "must be an integer (got a float)"},
    {"d_model_not_divisible", "[model]\nd_model = 100\nheads = 3\n", 2, "model.d_model", "not divisible by heads = 3"},
    {"negative_steps", "[train]\nsteps = -5\n", 2, "train.steps", "must be >= 1"},
    {"empty_axis", "[grid]\nseed = []\n", 2, "grid.seed", "is empty"},
    {"duplicate_axis_value", "[grid]\nattention = [\"flash\", \"flash\"]\n", 2, "grid.attention", "twice"},
    {"unknown_precision", "[grid]\nprecision = [\"fp32\", \"bf61\"]\n", 2, "grid.precision", "did you mean `bf16`?"},
    {"fp8_training", "[grid]\nprecision = [\"fp8_e4m3\"]\n", 2, "grid.precision", "microbenchmark only"},
    {"unknown_attention", "[grid]\nattention = [\"flsh\"]\n", 2, "grid.attention", "did you mean `flash`?"},
    {"unknown_init", "[grid]\ninit = [\"xavier\"]\n", 2, "grid.init", "allowed: normal, xavier_uniform"},
    {"unknown_axis", "[grid]\nseeds = [1]\n", 2, "grid.seeds", "did you mean `seed`?"},
    {"axis_wrong_type", "[grid]\nseed = [\"one\"]\n", 2, "grid.seed", "must hold integers"},
    {"axis_not_array", "[grid]\nseed = 1\n", 2, "grid.seed", "must be an array"},
    {"block_larger_than_seq", "[model]\nseq_len = 32\n[attention]\nblock_q = 64\n", 4, "attention.block_q",
     "larger than [model] seq_len = 32"},
    {"grid_block_larger_than_seq", "[model]\nseq_len = 32\n[grid]\nblock_kv = [16, 64]\n", 4, "grid.block_kv",
     "larger than [model] seq_len"},
    {"unknown_phase", "[study]\nphases = [\"train\", \"reduse\"]\n", 2, "study.phases", "did you mean `reduce`?"},
    {"text_without_path", "[model]\nvocab = 256\n[data]\nkind = \"text\"\n", 4, "data.kind", "needs a path"},
    {"unknown_data_kind", "[data]\nkind = \"synthetik\"\n", 2, "data.kind", "did you mean `synthetic`?"},
    {"text_small_vocab", "[data]\nkind = \"text\"\npath = \"x.txt\"\n", 2, "data.kind", "vocab >= 256"},
    {"lr_not_positive", "[train]\nlr = 0\n", 2, "train.lr", "must be > 0"},
    {"checkpoint_every_zero", "[train]\ncheckpoint_every = 0\n", 2, "train.checkpoint_every", "must be >= 1"},
    {"ranks_per_variant_zero", "[train]\nranks_per_variant = 0\n", 2, "train.ranks_per_variant", "must be >= 1"},
    {"batch_not_divisible_by_ranks", "[train]\nbatch = 6\nranks_per_variant = 4\n", 2, "train.batch",
     "not divisible by ranks_per_variant = 4"},
    // The training-loop keys ([train] and their grid axes; checked per variant after expansion).
    {"dp_width_zero", "[train]\ndp_width = 0\n", 2, "train.dp_width", "must be >= 1"},
    {"dp_width_not_dividing_batch", "[train]\nbatch = 6\ndp_width = 4\n", 3, "train.dp_width",
     "dp_width = 4 does not divide [train] batch = 6"},
    {"grid_dp_width_not_dividing_batch", "[train]\nbatch = 12\n[grid]\ndp_width = [1, 8]\n", 4, "grid.dp_width",
     "dp_width = 8 does not divide [train] batch = 12 (variant dp8)"},
    {"dp_width_not_multiple_of_ranks", "[train]\nranks_per_variant = 2\n[grid]\ndp_width = [1, 2]\n", 4,
     "grid.dp_width", "dp_width = 1 is not a multiple of [train] ranks_per_variant = 2"},
    {"grid_dp_width_below_one", "[grid]\ndp_width = [0, 2]\n", 2, "grid.dp_width", "must be >= 1"},
    {"unknown_allreduce", "[train]\nallreduce = \"rign\"\n", 2, "train.allreduce", "did you mean `ring`?"},
    {"grid_unknown_allreduce", "[grid]\nallreduce = [\"rank\", \"butterfly\"]\n", 2, "grid.allreduce",
     "allowed: rank, ring, tree"},
    {"allreduce_without_dp_width", "[train]\nranks_per_variant = 2\nallreduce = \"tree\"\n", 3, "train.allreduce",
     "dp_width is unset"},
    {"grad_accum_zero", "[train]\ngrad_accum = 0\n", 2, "train.grad_accum", "must be >= 1"},
    {"grad_accum_not_dividing_shard", "[train]\nbatch = 8\ndp_width = 4\ngrad_accum = 4\n", 4, "train.grad_accum",
     "does not divide the per-shard batch 2"},
    {"grid_grad_accum_not_dividing_shard", "[train]\nbatch = 8\n[grid]\ndp_width = [2, 4]\ngrad_accum = [1, 4]\n", 5,
     "grid.grad_accum", "does not divide the per-shard batch 2 ([train] batch = 8 over dp_width = 4) (variant dp4-ga4)"},
    {"repeat_negative", "[train]\nrepeat = -1\n", 2, "train.repeat", "must be >= 0"},
    {"grid_repeat_negative", "[grid]\nrepeat = [-1, 0]\n", 2, "grid.repeat", "must be >= 0"},
    {"warmup_beyond_steps", "[train]\nsteps = 10\nwarmup = 20\n", 3, "train.warmup", "must be in [0, steps]"},
    {"unknown_schedule", "[train]\nschedule = \"cosin\"\n", 2, "train.schedule", "did you mean `cosine`?"},
    {"unknown_policy", "[attention]\npolicy = \"mixd\"\n", 2, "attention.policy", "did you mean `mixed`?"},
    {"custom_policy_bad_step", "[attention.policies.x]\naccumulator = \"fp32\"\n", 2, "attention.policies.x.accumulator",
     "did you mean `accum`?"},
    {"custom_policy_bad_format", "[attention.policies.x]\naccum = \"fp31\"\n", 2, "attention.policies.x.accum",
     "unknown format \"fp31\""},
    {"custom_policy_named_like_preset", "[attention.policies.pure]\naccum = \"fp32\"\n", 1, "attention.policies.pure",
     "cannot be named"},
    {"custom_policy_named_like_eager", "[attention.policies.eager]\naccum = \"fp32\"\n", 1, "attention.policies.eager",
     "cannot be named"},
    {"microbench_captured_without_variant", "[microbench]\ndistribution = \"captured\"\n", 2, "microbench.distribution",
     "needs captured_variant"},
    {"microbench_captured_negative_layer", "[microbench]\ncaptured_layer = -1\n", 2, "microbench.captured_layer",
     "must be >= 0"},
    {"microbench_captured_negative_step", "[microbench]\ncaptured_step = -2\n", 2, "microbench.captured_step",
     "must be >= 0"},
    {"microbench_captured_negative_batch", "[microbench]\ncaptured_batch = -1\n", 2, "microbench.captured_batch",
     "must be >= 0"},
    {"custom_policy_bad_rounding", "[attention.policies.x]\nrounding = \"stochastik\"\n", 2,
     "attention.policies.x.rounding", "did you mean `stochastic`?"},
    {"custom_policy_bad_preset", "[attention.policies.x]\npreset = \"eagre\"\n", 2, "attention.policies.x.preset",
     "did you mean `eager`?"},
    {"unknown_loop_order", "[attention]\nloop_order = \"q-outer\"\n", 2, "attention.loop_order", "did you mean `q_outer`?"},
    {"microbench_unknown_format", "[microbench]\nformats = [\"fp32\", \"fp12\"]\n", 2, "microbench.formats",
     "unknown value \"fp12\""},
    {"microbench_blocks_not_pairs", "[microbench]\nblocks = [16, 32]\n", 2, "microbench.blocks", "[block_q, block_kv]"},
    {"microbench_bad_distribution", "[microbench]\ndistribution = \"gauss\"\n", 2, "microbench.distribution",
     "allowed: normal, uniform, outliers, sink"},
    {"microbench_unknown_rounding", "[microbench]\nroundings = [\"nearest\", \"stochastc\"]\n", 2,
     "microbench.roundings", "did you mean `stochastic`?"},
    {"microbench_blocks_and_sram", "[microbench]\nblocks = [[8, 8]]\nsram = [4096]\n", 3, "microbench.sram",
     "both blocks and sram"},
    {"microbench_tile_rules_without_sram", "[microbench]\ntile_rules = [\"swapped\"]\n", 2, "microbench.tile_rules",
     "has no sram"},
    {"microbench_unknown_tile_rule", "[microbench]\nsram = [4096]\ntile_rules = [\"swaped\"]\n", 3,
     "microbench.tile_rules", "did you mean `swapped`?"},
    {"microbench_sram_too_small", "[microbench]\nsram = [2]\n", 2, "microbench.sram", "must be >= 4"},
    {"microbench_sink_logit_not_positive", "[microbench]\nsink_logit = 0\n", 2, "microbench.sink_logit",
     "must be > 0"},
    {"microbench_sweep_unknown_key", "[microbench]\n[[microbench.sweeps]]\nname = \"a\"\nseqlens = [1]\n", 4,
     "microbench.sweeps.seqlens", "did you mean `seq_lens`?"},
    // The real-kernel keys (docs/microbench.md "Real kernels"): what the kernels cannot run, in every build.
    {"microbench_devices_without_cpu", "[microbench]\ndevices = [\"cuda\"]\n", 2, "microbench.devices",
     "devices must list \"cpu\""},
    {"microbench_unknown_device", "[microbench]\ndevices = [\"cpu\", \"gpu\"]\n", 2, "microbench.devices",
     "allowed: cpu, cuda"},
    {"microbench_unknown_framework", "[microbench]\nframework = [\"sdpa_flsh\"]\n", 2, "microbench.framework",
     "did you mean `sdpa_flash`?"},
    {"microbench_cuda_fp64", "[microbench]\nformats = [\"fp64\", \"bf16\"]\ndevices = [\"cpu\", \"cuda\"]\n", 2,
     "microbench.formats", "the CUDA kernels do not run fp64"},
    {"microbench_cuda_custom_policy", "[attention.policies.x]\npreset = \"fa2\"\n[microbench]\nformats = [\"bf16\"]\n"
     "policies = [\"x\"]\ndevices = [\"cpu\", \"cuda\"]\n", 5, "microbench.policies",
     "do not run policy \"x\" (they run the readings pure, eager, fa2, fa3 and mixed)"},
    {"microbench_cuda_stochastic", "[microbench]\nformats = [\"bf16\"]\nroundings = [\"stochastic\"]\n"
     "devices = [\"cpu\", \"cuda\"]\n", 3, "microbench.roundings", "round to nearest only"},
    {"microbench_framework_fp32", "[microbench]\nformats = [\"fp32\", \"bf16\"]\nframework = [\"sdpa_flash\"]\n", 2,
     "microbench.formats", "framework kernels on the GPU (sdpa_flash) run at fp16 and bf16"},
    {"microbench_torch_fp8", "[microbench]\nformats = [\"bf16\", \"fp8_e4m3\"]\nframework = [\"torch_baseline\"]\n", 3,
     "microbench.framework", "has no fp8_e4m3 tensors on the CPU"},
    {"microbench_torch_flash_no_q_outer", "[microbench]\nformats = [\"bf16\"]\nloop_orders = [\"kv_outer\"]\nframework = [\"torch_flash\"]\n", 4,
     "microbench.framework", "no q_outer to put it beside"},
    // launch = "pytorch" and sm_count (kernels/fa2_launch.hpp).
    {"microbench_unknown_launch", "[microbench]\nlaunch = \"cutlass\"\n", 2, "microbench.launch",
     "allowed: blocks, pytorch"},
    {"microbench_launch_and_blocks", "[microbench]\nlaunch = \"pytorch\"\nblocks = [[64, 64]]\n", 3,
     "microbench.blocks", "blocks and launch = \"pytorch\" both set the tiles"},
    {"microbench_launch_and_sram", "[microbench]\nsram = [16384]\nlaunch = \"pytorch\"\n", 2, "microbench.sram",
     "sram and launch = \"pytorch\" both set the tiles"},
    {"microbench_sweep_blocks_inherited_launch", "[microbench]\nlaunch = \"pytorch\"\n[[microbench.sweeps]]\n"
     "name = \"t\"\nblocks = [[16, 16]]\n", 5, "microbench.sweeps.blocks", "inherited from [microbench]"},
    {"microbench_launch_kv_outer", "[microbench]\nlaunch = \"pytorch\"\nloop_orders = [\"kv_outer\"]\n", 3,
     "microbench.loop_orders", "runs FlashAttention-2's loop order (q_outer)"},
    {"microbench_sm_count_without_launch", "[microbench]\nsm_count = 114\n", 2, "microbench.sm_count",
     "read only by launch = \"pytorch\""},
    {"microbench_sm_count_zero", "[microbench]\nlaunch = \"pytorch\"\nsm_count = 0\n", 3, "microbench.sm_count",
     "must be >= 1"},
    {"microbench_launch_fp32", "[microbench]\nlaunch = \"pytorch\"\nformats = [\"fp32\"]\npolicies = [\"fa2\"]\n", 3,
     "microbench.formats", "which takes fp16 and bf16"},
    {"microbench_launch_stochastic", "[microbench]\nlaunch = \"pytorch\"\nformats = [\"bf16\"]\npolicies = [\"fa2\"]\n"
     "roundings = [\"zero\"]\n", 5, "microbench.roundings", "rounds to nearest"},
    {"microbench_launch_head_dim", "[microbench]\nlaunch = \"pytorch\"\nformats = [\"bf16\"]\nhead_dims = [320]\n", 4,
     "microbench.head_dims", "head dims up to 256"},
    {"microbench_launch_cuda", "[microbench]\nlaunch = \"pytorch\"\nformats = [\"bf16\"]\ndevices = [\"cpu\", \"cuda\"]\n",
     4, "microbench.devices", "runs on the CPU"},
    {"microbench_file_without_input_file", "[microbench]\ndistribution = \"file\"\n", 2, "microbench.distribution",
     "needs input_file"},
    {"microbench_input_file_without_file", "[microbench]\ninput_file = \"qkv.safetensors\"\n", 2,
     "microbench.input_file", "read only by distribution = \"file\""},
    {"microbench_sweep_inherits_cuda", "[microbench]\ndevices = [\"cpu\", \"cuda\"]\n[[microbench.sweeps]]\n"
     "name = \"low\"\nformats = [\"fp8_e4m3\"]\n", 5, "microbench.sweeps.formats", "'low': devices lists \"cuda\""},
    {"microbench_duplicate_sweep", "[[microbench.sweeps]]\nname = \"a\"\n[[microbench.sweeps]]\nname = \"a\"\n", 4,
     "microbench.sweeps.name", "used twice"},
    {"reduce_unknown_metric", "[reduce]\nmetrics = [\"w1\", \"wasserstein\"]\n", 2, "reduce.metrics",
     "unknown value \"wasserstein\""},
    {"reduce_without_w1", "[reduce]\nmetrics = [\"max_abs\"]\n", 2, "reduce.metrics", "must include \"w1\""},
    {"reduce_nothing", "[reduce]\nper_tensor = false\nwhole_model = false\n", 2, "reduce.per_tensor", "cannot both be false"},
    {"reduce_pairs_word", "[reduce]\npairs = \"some\"\n", 2, "reduce.pairs", "must be \"verdict\"", "pairs = \"all\""},
    {"reduce_pairs_self", "[reduce]\npairs = [[\"a\", \"a\"]]\n", 2, "reduce.pairs", "with itself"},
    {"reduce_pairs_not_a_pair", "[reduce]\npairs = [\"a\"]\n", 2, "reduce.pairs", "a pair of variant ids"},
    {"reduce_pairs_unknown_variant", "[reduce]\npairs = [[\"nope\", \"other\"]]\n", 2, "reduce.pairs",
     "\"nope\", which the grid does not have", "fastudy plan GRID.toml lists them"},
    {"study_name_with_slash", "[study]\nname = \"a/b\"\n", 2, "study.name", "holds '/' at character 2"},
    {"section_not_table", "model = 3\n", 1, "model", "must be a table"},
    {"bool_wrong_type", "[train]\nshadow_attention = \"yes\"\n", 2, "train.shadow_attention", "true or false"},
    // [numerics] and its grid axes
    {"numerics_unknown_matmul", "[numerics]\nmatmul = \"bf61\"\n", 2, "numerics.matmul",
     "allowed: fp32, tf32, bf16, bf16x3"},
    {"numerics_unknown_layernorm", "[numerics]\nlayernorm = \"welfort\"\n", 2, "numerics.layernorm",
     "did you mean `welford`?"},
    {"numerics_unknown_gelu", "[numerics]\ngelu = \"tan\"\n", 2, "numerics.gelu", "did you mean `tanh`?"},
    {"numerics_recompute_boolean", "[numerics]\nrecompute = true\n", 2, "numerics.recompute", "recompute = \"on\""},
    {"numerics_split_k_zero", "[numerics]\nsplit_k = 0\n", 2, "numerics.split_k", "must be >= 1"},
    {"numerics_split_k_too_large", "[model]\nd_model = 16\nheads = 2\n[numerics]\nsplit_k = 32\n", 5,
     "numerics.split_k", "use split_k <= 16"},
    {"numerics_unknown_key", "[numerics]\nsplitk = 2\n", 2, "numerics.splitk", "did you mean `split_k`?"},
    {"grid_unknown_matmul", "[grid]\nmatmul = [\"fp32\", \"bf32\"]\n", 2, "grid.matmul", "allowed: fp32, tf32, bf16, bf16x3"},
    {"grid_split_k_zero", "[grid]\nsplit_k = [0, 2]\n", 2, "grid.split_k", "must be >= 1"},
    {"grid_split_k_too_large", "[model]\nd_model = 8\nheads = 2\n[grid]\nsplit_k = [1, 16]\n", 5, "grid.split_k",
     "larger than the shortest reduction"},
    {"grid_unknown_recompute", "[grid]\nrecompute = [\"no\"]\n", 2, "grid.recompute", "allowed: off, on"},
    // [[grid.vary]] tables
    {"vary_axis_also_in_grid", "[grid]\nseed = [1]\n[[grid.vary]]\nseed = [2]\n", 4, "grid.vary.seed",
     "is in [grid] and in a [[grid.vary]]"},
    {"vary_not_tables", "[grid]\nvary = [1]\n", 2, "grid.vary", "`grid.vary` must be a list of tables"},
    {"vary_empty_table", "[[grid.vary]]\n", 1, "grid.vary.", "a [[grid.vary]] table is empty"},
    {"vary_unknown_value", "[[grid.vary]]\nattention = [\"flesh\"]\n", 2, "grid.vary.attention",
     "`grid.vary.attention` has unknown value \"flesh\""},
    // Left-out baseline tokens make `flash` (attention) and `flash` (a custom policy) the same id.
    {"vary_twin_ids",
     "[attention.policies.flash]\npreset = \"eager\"\n[[grid.vary]]\nattention = [\"flash\"]\n"
     "[[grid.vary]]\npolicy = [\"mixed\", \"flash\"]\n",
     0, "grid", "two variants get the id `flash`"},
    {"vary_unknown_axis", "[[grid.vary]]\nattentoin = [\"flash\"]\n", 2, "grid.vary.attentoin",
     "bad.toml:2:1: unknown grid axis `attentoin` in a [[grid.vary]] table", "did you mean `attention`?"},
    // Per-kind custom policies and the structural keys of issue 26.
    {"custom_policy_input_step_per_kind", "[attention.policies.x.flash]\nq = \"fp32\"\n", 2,
     "attention.policies.x.flash.q", "an input both attention kinds share", "in the policy's own table"},
    {"custom_policy_bad_scale_for_flash", "[attention.policies.x.flash]\nscale = \"inside\"\n", 2,
     "attention.policies.x.flash.scale", "allowed: fused, after, before"},
    {"custom_policy_bad_scale", "[attention.policies.x]\nscale = \"afterwards\"\n", 2, "attention.policies.x.scale",
     "allowed: fused, after, before", "did you mean `after`?"},
    {"custom_policy_bad_quantization", "[attention.policies.x]\nquantization = \"blocks\"\n", 2,
     "attention.policies.x.quantization", "allowed: none, head, block"},
    {"custom_policy_quantization_per_kind", "[attention.policies.x.baseline]\nquantization = \"head\"\n", 2,
     "attention.policies.x.baseline.quantization", "the inputs both kinds share"},
    {"custom_policy_max_offset_not_above_one", "[attention.policies.x]\nmax_offset = 1\n", 2,
     "attention.policies.x.max_offset", "max_offset must be > 1", "max_offset = 2"},
    {"custom_policy_max_offset_not_a_number", "[attention.policies.x]\nmax_offset = \"2\"\n", 2,
     "attention.policies.x.max_offset", "must be a number (got a string)"},
    {"custom_policy_max_offset_per_kind", "[attention.policies.x.flash]\nmax_offset = 0.5\n", 2,
     "attention.policies.x.flash.max_offset", "max_offset must be > 1"},
    {"custom_policy_kind_not_table", "[attention.policies.x]\nflash = 1\n", 2, "attention.policies.x.flash",
     "must be a table"},
    {"custom_policy_unknown_key_per_kind", "[attention.policies.x.baseline]\nsoftmx = \"fp32\"\n", 2,
     "attention.policies.x.baseline.softmx", "did you mean `softmax`?"},
    {"microbench_fp8_backward",
     "[microbench]\nformats = [\"fp8_e4m3\"]\npolicies = [\"fa3\"]\npasses = [\"forward\", \"backward\"]\n", 4,
     "microbench.passes", "policy \"fa3\" at fp8_e4m3 quantizes Q, K, V", "passes = [\"forward\"]"},
    {"microbench_incoherent_head_dim",
     "[microbench]\nformats = [\"fp8_e4m3\"]\npolicies = [\"fa3\"]\npasses = [\"forward\"]\nhead_dims = [48]\n", 5,
     "microbench.head_dims", "needs a head dim that is a power of two, not 48"},
    {"training_quantized_policy",
     "[attention]\npolicy = \"q\"\n[attention.policies.q]\npreset = \"fa2\"\nquantization = \"block\"\n", 2,
     "attention.policy", "which has no backward pass to train with"},
};

}  // namespace

class BadConfig : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadConfig, NamesFileLineAndKey) {
  const BadCase& c = GetParam();
  try {
    parse_study(c.toml, "bad.toml");
    FAIL() << "no error for case " << c.name;
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.file(), "bad.toml");
    EXPECT_EQ(e.key(), c.key) << msg;
    if (c.line > 0) {
      EXPECT_EQ(e.line(), c.line) << msg;
      EXPECT_NE(msg.find("bad.toml:" + std::to_string(c.line) + ":"), std::string::npos) << msg;
    }
    EXPECT_NE(msg.find(c.fragment), std::string::npos) << "message: " << msg << "\nexpected: " << c.fragment;
    if (*c.also) {
      EXPECT_NE(msg.find(c.also), std::string::npos) << "message: " << msg << "\nexpected: " << c.also;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, BadConfig, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

TEST(BadConfigFile, MissingFileIsAConfigError) {
  try {
    load_study("/nonexistent/grid.toml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/grid.toml"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("cannot be opened"), std::string::npos);
  }
}

// What this build cannot run is refused at load (exit 2), naming the key; what it can run loads, and a
// grid without the keys keeps its hash.
TEST(RealKernelKeys, RefusedAtLoadWhereTheBuildLacksThem) {
  const std::string fw = "[microbench]\nformats = [\"fp16\", \"bf16\"]\nframework = [\"sdpa_flash\", \"sdpa_math\"]\n";
  if (!FASTUDY_TORCH_SDPA || !FASTUDY_TORCH_CUDA) {
    try {
      parse_study(fw, "bad.toml");
      FAIL() << "framework kernels loaded in a build without a CUDA LibTorch with SDPA";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key(), "microbench.framework") << e.what();
      EXPECT_EQ(e.line(), 3) << e.what();
      EXPECT_NE(std::string(e.what()).find(FASTUDY_TORCH_SDPA ? "has no CUDA" : "LibTorch >= 2.3"), std::string::npos)
          << e.what();
    }
  } else {
    const Study st = parse_study(fw, "ok.toml");
    EXPECT_EQ(st.microbench.sweeps.at(0).framework, (std::vector<std::string>{"sdpa_flash", "sdpa_math"}));
  }
  const std::string cuda = "[microbench]\nformats = [\"bf16\"]\ndevices = [\"cpu\", \"cuda\"]\n";
  if (!FASTUDY_CUDA_KERNELS) {
    try {
      parse_study(cuda, "bad.toml");
      FAIL() << "devices = cuda loaded in a build without the CUDA kernels";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key(), "microbench.devices") << e.what();
      EXPECT_NE(std::string(e.what()).find("no CUDA kernels"), std::string::npos) << e.what();
    }
  } else {
    const Study with = parse_study(cuda, "ok.toml");
    EXPECT_EQ(with.microbench.sweeps.at(0).devices, (std::vector<std::string>{"cpu", "cuda"}));
    const Study plain = parse_study("[microbench]\nformats = [\"bf16\"]\n", "ok.toml");
    const Study cpu = parse_study("[microbench]\nformats = [\"bf16\"]\ndevices = [\"cpu\"]\n", "ok.toml");
    EXPECT_EQ(plain.hash, cpu.hash);  // the default, spelled out: the same grid
    EXPECT_NE(plain.hash, with.hash);
    const Study again = parse_study(with.resolved_toml, "study.toml");  // the resolved TOML keeps the key
    EXPECT_EQ(again.hash, with.hash);
    EXPECT_EQ(again.microbench.sweeps.at(0).devices, (std::vector<std::string>{"cpu", "cuda"}));
  }
}

// configs/gpu-microbench.toml (what scripts/gpu-check.sh runs): the comparison of docs/microbench.md "Real kernels",
// loadable where the build has the CUDA kernels and a CUDA LibTorch with SDPA, refused at load otherwise.
TEST(RealKernelKeys, GpuMicrobenchConfig) {
  const std::string path = std::string(FASTUDY_CONFIGS) + "/gpu-microbench.toml";
  if (FASTUDY_CUDA_KERNELS && FASTUDY_TORCH_SDPA && FASTUDY_TORCH_CUDA) {
    const Study st = load_study(path);
    // Shapes where PyTorch's flash forward splits the keys (B 1, H 4) and where it does not (H 64:
    // B*H*ceil(N/64) = 256 >= 0.8 * 2 * 132 SMs), with the kernel readings fa2 and fa3 in both.
    ASSERT_EQ(st.microbench.sweeps.size(), 2u);
    const MicrobenchSweep& sw = st.microbench.sweeps[0];
    EXPECT_EQ(sw.name, "split_kv");
    EXPECT_EQ(sw.formats, (std::vector<Format>{Format::fp16, Format::bf16}));
    EXPECT_EQ(sw.head_dims, (std::vector<int>{64, 128}));
    EXPECT_EQ(sw.heads * sw.batch, 4);
    EXPECT_EQ(sw.devices, (std::vector<std::string>{"cpu", "cuda"}));
    EXPECT_EQ(sw.framework.size(), 4u);
    const MicrobenchSweep& full = st.microbench.sweeps[1];
    EXPECT_EQ(full.name, "full_sms");
    EXPECT_EQ(full.heads * full.batch * ((full.seq_lens.at(0) + 63) / 64), 256);
    for (const MicrobenchSweep* s : {&sw, &full}) {
      for (const char* reading : {"fa2", "fa3"}) {
        EXPECT_NE(std::find(s->policies.begin(), s->policies.end(), reading), s->policies.end()) << s->name << " " << reading;
      }
    }
    return;
  }
  try {
    load_study(path);
    FAIL() << path << " loaded in a build without the CUDA kernels and a CUDA LibTorch with SDPA";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), FASTUDY_CUDA_KERNELS ? "microbench.framework" : "microbench.devices") << e.what();
  }
}
