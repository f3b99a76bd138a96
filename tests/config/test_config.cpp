// grid.toml happy paths: defaults, the shipped configs, grid expansion, ids, hashes, round trip.
#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>

#include "src/core/config.hpp"

using namespace fastudy;

namespace {
const char* kMinimal = R"(
[study]
name = "t"
[grid]
attention = ["baseline", "flash"]
precision = ["fp32", "bf16"]
seed = [1, 2]
init = ["normal"]
)";
}

TEST(Config, EmptyFileGivesDefaultsAndOneVariant) {
  Study st = parse_study("", "empty.toml");
  EXPECT_EQ(st.variants.size(), 1u);
  EXPECT_EQ(st.variants[0].id, "default");
  EXPECT_EQ(st.model.d_model, 64);
  EXPECT_EQ(st.microbench.sweeps.size(), 1u);
  EXPECT_EQ(st.phases.size(), 4u);
}

TEST(Config, GridExpandsToCrossProductWithReadableIds) {
  Study st = parse_study(kMinimal, "g.toml");
  ASSERT_EQ(st.variants.size(), 8u);
  // First axis slowest, last fastest.
  EXPECT_EQ(st.variants[0].id, "baseline-fp32-s1-normal");
  EXPECT_EQ(st.variants[1].id, "baseline-fp32-s2-normal");
  EXPECT_EQ(st.variants[2].id, "baseline-bf16-s1-normal");
  EXPECT_EQ(st.variants[7].id, "flash-bf16-s2-normal");
  const Variant& v = st.variants[7];
  EXPECT_EQ(v.attention, AttentionKind::flash);
  EXPECT_EQ(v.precision, Format::bf16);
  EXPECT_EQ(v.seed, 2u);
  EXPECT_EQ(v.axis("precision"), "bf16");
  EXPECT_EQ(v.axis("nope"), "");
}

TEST(Config, HashesAreStableAndDistinguishVariants) {
  Study a = parse_study(kMinimal, "a.toml");
  Study b = parse_study(std::string(kMinimal) + "\n# a comment changes nothing\n", "b.toml");
  ASSERT_EQ(a.variants.size(), b.variants.size());
  for (std::size_t i = 0; i < a.variants.size(); ++i) EXPECT_EQ(a.variants[i].hash, b.variants[i].hash);
  EXPECT_EQ(a.hash, b.hash);
  for (std::size_t i = 1; i < a.variants.size(); ++i) EXPECT_NE(a.variants[i].hash, a.variants[0].hash);
  Study c = parse_study(std::string(kMinimal) + "[train]\nsteps = 70\n", "c.toml");
  EXPECT_NE(c.variants[0].hash, a.variants[0].hash);
  EXPECT_EQ(a.variants[0].hash.size(), 16u);
}

TEST(Config, ResolvedConfigRoundTrips) {
  Study a = parse_study(std::string(kMinimal) + R"(
[attention.policies.bf16acc]
accum = "bf16"
[microbench]
blocks = [[8, 16]]
[[microbench.sweeps]]
name = "x"
seq_lens = [64, 128]
[[microbench.sweeps]]
name = "y"
formats = ["fp8_e4m3"]
[reduce]
steps = [10, 20]
)",
                        "a.toml");
  Study b = parse_study(a.resolved_toml, "study.toml");
  EXPECT_EQ(a.hash, b.hash);
  ASSERT_EQ(a.variants.size(), b.variants.size());
  for (std::size_t i = 0; i < a.variants.size(); ++i) EXPECT_EQ(a.variants[i].hash, b.variants[i].hash);
  ASSERT_EQ(b.microbench.sweeps.size(), 2u);
  EXPECT_EQ(b.microbench.sweeps[0].name, "x");
  EXPECT_EQ(b.microbench.sweeps[0].seq_lens, (std::vector<int>{64, 128}));
  EXPECT_EQ(b.microbench.sweeps[0].blocks[0], std::make_pair(8, 16));  // inherited from [microbench]
  EXPECT_EQ(b.microbench.sweeps[1].formats[0], Format::fp8_e4m3);
  EXPECT_EQ(b.reduce.steps, (std::vector<std::int64_t>{10, 20}));
}

TEST(Config, AxesOverrideTheResolvedConfig) {
  Study st = parse_study(R"(
[model]
seq_len = 64
[grid]
block_kv = [16, 64]
loop_order = ["kv_outer"]
data_seed = [5]
lr = [0.001]
policy = ["pure"]
)",
                         "a.toml");
  ASSERT_EQ(st.variants.size(), 2u);
  EXPECT_EQ(st.variants[0].id, "bkv16-kv_outer-d5-lr0.001-pure");
  EXPECT_EQ(st.variants[1].attention_cfg.block_kv, 64);
  EXPECT_EQ(st.variants[1].attention_cfg.loop_order, LoopOrder::kv_outer);
  EXPECT_EQ(st.variants[1].data.seed, 5u);
  EXPECT_DOUBLE_EQ(st.variants[1].train.lr, 0.001);
  EXPECT_EQ(st.variants[1].attention_cfg.policy, "pure");
}

TEST(Config, CustomPolicyResolvesOverPure) {
  Study st = parse_study(R"(
[attention]
policy = "acc32"
[attention.policies.acc32]
accum = "fp32"
stats = "fp32"
o_running = "fp32"
)",
                         "a.toml");
  PrecisionPolicy p = resolve_policy(st.attention, "acc32", Format::bf16, AttentionKind::flash);
  EXPECT_EQ(p.name, "acc32");
  EXPECT_EQ(p.accum, Format::fp32);
  EXPECT_EQ(p.stats, Format::fp32);
  EXPECT_EQ(p.o_running, Format::fp32);
  EXPECT_EQ(p.o, Format::bf16);
  EXPECT_EQ(p.q, Format::bf16);
  EXPECT_EQ(p.p, Format::bf16);
}

// The microbenchmark's rounding, tile-rule and input keys reach the sweeps, survive the resolved
// study.toml, and each changes the study hash.
TEST(Config, MicrobenchRoundingsTileRulesAndSink) {
  const std::string base = std::string(kMinimal) + R"(
[microbench]
roundings = ["nearest", "stochastic"]
sram = [4096, 16384]
tile_rules = ["paper", "swapped"]
distribution = "sink"
sink_logit = 12.0
[[microbench.sweeps]]
name = "derived"
[[microbench.sweeps]]
name = "direct"
blocks = [[8, 16]]
)";
  Study st = parse_study(base, "a.toml");
  ASSERT_EQ(st.microbench.sweeps.size(), 2u);
  const MicrobenchSweep& derived = st.microbench.sweeps[0];
  EXPECT_EQ(derived.roundings, (std::vector<Rounding>{Rounding::nearest, Rounding::stochastic}));
  EXPECT_EQ(derived.sram, (std::vector<int>{4096, 16384}));
  EXPECT_EQ(derived.tile_rules, (std::vector<std::string>{"paper", "swapped"}));
  EXPECT_EQ(derived.distribution, InputDistribution::sink);
  EXPECT_EQ(derived.sink_logit, 12.0);
  const MicrobenchSweep& direct = st.microbench.sweeps[1];  // blocks here replace the inherited SRAM sizes
  EXPECT_TRUE(direct.sram.empty());
  EXPECT_EQ(direct.blocks, (std::vector<std::pair<int, int>>{{8, 16}}));
  Study again = parse_study(st.resolved_toml, "study.toml");
  EXPECT_EQ(again.hash, st.hash);
  EXPECT_EQ(again.microbench.sweeps[0].sram, derived.sram);
  EXPECT_EQ(again.microbench.sweeps[0].roundings, derived.roundings);
  EXPECT_TRUE(again.microbench.sweeps[1].sram.empty());
  // Defaults: each policy's own rounding, FA3's outlier recipe.
  const MicrobenchSweep def = parse_study(kMinimal, "a.toml").microbench.sweeps[0];
  EXPECT_TRUE(def.roundings.empty());
  EXPECT_EQ(def.outlier_fraction, 0.001);
  EXPECT_EQ(def.outlier_scale, 10.0);
  for (auto [from, to] : {std::pair<std::string, std::string>{"\"stochastic\"]", "\"zero\"]"},
                          {"16384]", "32768]"}, {"\"swapped\"]", "\"square\"]"}, {"12.0", "11.0"}}) {
    std::string changed = base;
    changed.replace(changed.find(from), from.size(), to);
    EXPECT_NE(parse_study(changed, "a.toml").hash, st.hash) << from << " -> " << to;
  }
}

// A custom policy may start from another reading and set a rounding mode; both survive the resolved
// study.toml (its hash changes with them).
TEST(Config, CustomPolicyPresetAndRounding) {
  const std::string text = R"(
[attention]
policy = "sr"
[attention.policies.sr]
preset = "eager"
rounding = "stochastic"
o = "fp32"
)";
  Study st = parse_study(text, "a.toml");
  for (AttentionKind kind : {AttentionKind::flash, AttentionKind::baseline}) {
    PrecisionPolicy p = resolve_policy(st.attention, "sr", Format::bf16, kind);
    PrecisionPolicy eager = make_policy("eager", Format::bf16, kind);
    eager.name = "sr";
    eager.o = Format::fp32;
    eager.rounding = Rounding::stochastic;
    for (const auto& step : kPolicySteps) EXPECT_EQ(p.*(step.member), eager.*(step.member)) << step.name;
    EXPECT_EQ(p.rounding, Rounding::stochastic);
    EXPECT_EQ(p.scale, eager.scale);
  }
  Study again = parse_study(st.resolved_toml, "study.toml");
  EXPECT_EQ(again.hash, st.hash);
  EXPECT_EQ(resolve_policy(again.attention, "sr", Format::bf16, AttentionKind::flash).rounding, Rounding::stochastic);
  Study nearest = parse_study(text.substr(0, text.find("rounding")) + "o = \"fp32\"\n", "a.toml");
  EXPECT_NE(nearest.hash, st.hash);
  EXPECT_EQ(resolve_policy(nearest.attention, "sr", Format::bf16, AttentionKind::flash).rounding, Rounding::nearest);
}

// A custom policy says what each kind materialises: its own keys set both kinds, its `flash` and
// `baseline` tables one kind each (after the own keys); scale, quantization and incoherent_processing
// set the structural choices; each key reaches the resolved study.toml (and the hash), and a policy
// without the new keys resolves to the text it always had.
TEST(Config, CustomPolicyPerKindAndItsStructuralKeys) {
  const std::string text = R"(
[attention]
[attention.policies.k]
preset = "fa2"
p = "fp32"
scale = "before"
[attention.policies.k.baseline]
s = "fp32"
softmax = "bf16"
[attention.policies.k.flash]
o_running = "bf16"
incoherent_processing = true
)";
  Study st = parse_study(text, "k.toml");
  const PrecisionPolicy flash = resolve_policy(st.attention, "k", Format::bf16, AttentionKind::flash);
  const PrecisionPolicy base = resolve_policy(st.attention, "k", Format::bf16, AttentionKind::baseline);
  EXPECT_EQ(flash.kernel, FlashKernel::fa2);
  EXPECT_EQ(flash.p, Format::fp32);
  EXPECT_EQ(flash.o_running, Format::bf16);
  EXPECT_TRUE(flash.incoherent);
  EXPECT_EQ(flash.s, Format::fp32);
  EXPECT_EQ(base.kernel, FlashKernel::framework);
  EXPECT_EQ(base.p, Format::fp32);
  EXPECT_EQ(base.s, Format::fp32);
  EXPECT_EQ(base.softmax, Format::bf16);
  EXPECT_EQ(base.o_running, Format::bf16);  // the framework baseline's (unused) state steps stay in the format
  EXPECT_FALSE(base.incoherent);
  EXPECT_EQ(base.scale, ScalePlacement::before);
  EXPECT_EQ(flash.scale, ScalePlacement::fused);  // the own table's scale is the baseline's only
  const std::string flash_scale = "[attention.policies.e]\npreset = \"eager\"\n[attention.policies.e.flash]\n"
                                  "scale = \"fused\"\n";
  const Study placed = parse_study(flash_scale, "e.toml");
  EXPECT_EQ(make_policy("eager", Format::bf16, AttentionKind::flash).scale, ScalePlacement::after);
  EXPECT_EQ(resolve_policy(placed.attention, "e", Format::bf16, AttentionKind::flash).scale, ScalePlacement::fused);
  EXPECT_EQ(resolve_policy(placed.attention, "e", Format::bf16, AttentionKind::baseline).scale, ScalePlacement::after);
  const ReadingPolicies both = resolve_reading(st.attention, "k", Format::bf16);
  EXPECT_EQ(both.flash.o_running, flash.o_running);
  EXPECT_EQ(both.baseline.softmax, base.softmax);
  Study again = parse_study(st.resolved_toml, "study.toml");
  EXPECT_EQ(again.hash, st.hash);
  EXPECT_EQ(resolve_policy(again.attention, "k", Format::bf16, AttentionKind::baseline).softmax, Format::bf16);
  EXPECT_TRUE(resolve_policy(again.attention, "k", Format::bf16, AttentionKind::flash).incoherent);
  const std::string quant = "[attention.policies.nb]\npreset = \"fa3\"\nquantization = \"head\"\n";
  EXPECT_EQ(resolve_policy(parse_study(quant, "q.toml").attention, "nb", Format::fp8_e4m3, AttentionKind::flash)
                .quantization,
            Quantization::head);
  // Without the new keys the resolved policy table is the one older studies wrote: the same text, so the
  // same hash as before per-kind policies existed (8966c48bf9b82d1f, computed by the build before them).
  Study plain = parse_study("[study]\nname = \"h\"\nout = \"/tmp/hh\"\n[attention.policies.old]\npreset = "
                            "\"eager\"\no = \"fp32\"\n", "o.toml");
  EXPECT_EQ(plain.hash, "8966c48bf9b82d1f") << plain.resolved_toml;
  const std::size_t table = plain.resolved_toml.find("[attention.policies.old]");
  ASSERT_NE(table, std::string::npos);
  const std::string old_table = plain.resolved_toml.substr(table, plain.resolved_toml.find("\n\n", table) - table);
  for (const char* key : {"flash", "baseline", "scale", "quantization", "incoherent_processing", "max_offset"})
    EXPECT_EQ(old_table.find(std::string(" ") + key + " ="), std::string::npos) << key << " in " << old_table;
}

// max_offset (issue 29, Qiu & Yao's fix) in a policy's own table reaches both kinds, in a kind's table
// that kind only; it is in the resolved study.toml and the hash, and a policy without it keeps its
// hash (the pinned one above).
TEST(Config, CustomPolicyMaxOffsetReachesItsKindsAndTheHash) {
  const std::string both = "[attention]\npolicy = \"qy\"\n[attention.policies.qy]\npreset = \"fa2\"\nmax_offset = 2\n";
  Study st = parse_study(both, "qy.toml");
  EXPECT_EQ(resolve_policy(st.attention, "qy", Format::bf16, AttentionKind::flash).max_offset, 2.0);
  EXPECT_EQ(resolve_policy(st.attention, "qy", Format::bf16, AttentionKind::baseline).max_offset, 2.0);
  EXPECT_NE(st.resolved_toml.find("max_offset = 2"), std::string::npos) << st.resolved_toml;
  Study again = parse_study(st.resolved_toml, "study.toml");
  EXPECT_EQ(again.hash, st.hash);
  EXPECT_EQ(resolve_policy(again.attention, "qy", Format::bf16, AttentionKind::flash).max_offset, 2.0);
  Study off = parse_study("[attention]\npolicy = \"qy\"\n[attention.policies.qy]\npreset = \"fa2\"\n", "qy.toml");
  EXPECT_NE(off.hash, st.hash);
  EXPECT_EQ(resolve_policy(off.attention, "qy", Format::bf16, AttentionKind::flash).max_offset, 0.0);
  Study flash_only = parse_study("[attention.policies.qy]\npreset = \"eager\"\n[attention.policies.qy.flash]\n"
                                 "max_offset = 1.5\n", "qy.toml");
  EXPECT_EQ(resolve_policy(flash_only.attention, "qy", Format::bf16, AttentionKind::flash).max_offset, 1.5);
  EXPECT_EQ(resolve_policy(flash_only.attention, "qy", Format::bf16, AttentionKind::baseline).max_offset, 0.0);
  EXPECT_EQ(parse_study(flash_only.resolved_toml, "study.toml").hash, flash_only.hash);
}

TEST(Config, ShippedConfigsLoad) {
  for (const char* name :
       {"quick.toml", "ci.toml", "microbench.toml", "paper.toml", "paper-profile.toml", "repeated_max.toml"}) {
    SCOPED_TRACE(name);
    Study st = load_study(std::string(FASTUDY_CONFIGS) + "/" + name);
    EXPECT_FALSE(st.variants.empty());
  }
  // The demo (issue 30): attention x 3 precisions x 3 seeds (3 seeds: intervals against precision), and in
  // miniature the sweeps the report draws: readings at bf16 over 4 to 512 KV tiles, seq_len (Fig. 5),
  // block_area (Fig. 6).
  Study quick = load_study(std::string(FASTUDY_CONFIGS) + "/quick.toml");
  EXPECT_EQ(quick.variants.size(), 18u);
  const auto tile_range = [](const MicrobenchSweep& sw) {
    int fewest = INT32_MAX, most = 0;
    for (int n : sw.seq_lens)
      for (const auto& [bq, bkv] : sw.blocks) {
        fewest = std::min(fewest, (n + bkv - 1) / bkv);
        most = std::max(most, (n + bkv - 1) / bkv);
      }
    return std::make_pair(fewest, most);
  };
  const auto sweep = [](const Study& st, const std::string& name) -> const MicrobenchSweep* {
    for (const auto& sw : st.microbench.sweeps)
      if (sw.name == name) return &sw;
    return nullptr;
  };
  const MicrobenchSweep* demo_readings = sweep(quick, "readings");
  ASSERT_NE(demo_readings, nullptr);
  EXPECT_EQ(demo_readings->formats, (std::vector<Format>{Format::bf16}));
  EXPECT_EQ(demo_readings->policies, (std::vector<std::string>{"pure", "eager", "fa2", "mixed"}));
  EXPECT_EQ(tile_range(*demo_readings), std::make_pair(4, 512));
  ASSERT_NE(sweep(quick, "seq_len"), nullptr);
  EXPECT_GE(sweep(quick, "seq_len")->seq_lens.size(), 3u);
  ASSERT_NE(sweep(quick, "block_area"), nullptr);
  EXPECT_GE(sweep(quick, "block_area")->blocks.size(), 3u);
  Study mb = load_study(std::string(FASTUDY_CONFIGS) + "/microbench.toml");
  EXPECT_EQ(mb.microbench.sweeps.size(), 10u);
  // The readings sweep answers issue 12's question: the readings, bf16 and fp16, 4 to 256 KV tiles.
  const MicrobenchSweep* readings = sweep(mb, "readings");
  ASSERT_NE(readings, nullptr);
  EXPECT_EQ(readings->policies, (std::vector<std::string>{"pure", "eager", "fa2", "mixed"}));
  EXPECT_LE(tile_range(*readings).first, 4);
  EXPECT_GE(tile_range(*readings).second, 256);
}

// The word-valued settings: each enum's words read back to their values, nothing else reads as one, and
// the words are the ones grid.toml, the resolved TOML and the checkpoints have always written.
namespace {
template <class E, std::size_t N>
void expect_words_round_trip(const E (&all)[N], std::optional<E> (*parse)(std::string_view)) {
  for (E e : all) EXPECT_EQ(parse(to_string(e)), e) << to_string(e);
  EXPECT_FALSE(parse("nonsense").has_value());
  EXPECT_FALSE(parse("").has_value());
}
}  // namespace

TEST(Settings, EveryWordReadsBackToItsValue) {
  expect_words_round_trip(kAllDevices, parse_device);
  expect_words_round_trip(kAllArithmetics, parse_arithmetic);
  expect_words_round_trip(kAllSchedules, parse_schedule);
  expect_words_round_trip(kAllReduceOrders, parse_reduce_order);
  expect_words_round_trip(kAllDataKinds, parse_data_kind);
  expect_words_round_trip(kAllInitSchemes, parse_init_scheme);
  expect_words_round_trip(kAllMatmulArithmetics, parse_matmul_arithmetic);
  expect_words_round_trip(kAllLayerNormAlgorithms, parse_layernorm_algorithm);
  expect_words_round_trip(kAllGeluApproximations, parse_gelu_approximation);
  expect_words_round_trip(kSdpaKinds, parse_sdpa_backend);
  EXPECT_EQ(to_string(Device::auto_), "auto");
  EXPECT_EQ(to_string(Schedule::constant), "constant");
  EXPECT_EQ(to_string(ReduceOrder::tree), "tree");
  EXPECT_EQ(to_string(DataKind::tokens), "tokens");
  EXPECT_EQ(to_string(InitScheme::xavier_uniform), "xavier_uniform");
  EXPECT_EQ(to_string(InitScheme::kaiming_normal), "kaiming_normal");
  EXPECT_EQ(to_string(LayerNormAlgorithm::two_pass), "two_pass");
  EXPECT_EQ(to_string(SdpaBackend::efficient), "sdpa_efficient");
  EXPECT_EQ(to_string(SdpaBackend::none), "");
  EXPECT_FALSE(parse_sdpa_backend("").has_value());  // none is not a kind
}

TEST(Config, ContentHashIsFnv1a) {
  // FNV-1a 64 of "" is the offset basis; of "a" a published test vector.
  EXPECT_EQ(content_hash(""), "cbf29ce484222325");
  EXPECT_EQ(content_hash("a"), "af63dc4c8601ec8c");
}

// The policy-step table: each row sets its own member and no other, from the grid's custom policy
// table, and the configuration reference (docs/configuration.md) names every step.
TEST(PolicySteps, EachRowSetsExactlyItsMemberFromTheGrid) {
  for (const auto& step : kPolicySteps) {
    SCOPED_TRACE(std::string(step.name));
    const std::string text = "[attention.policies.one]\n" + std::string(step.name) + " = \"fp16\"\n";
    Study st = parse_study(text, "g.toml");
    const PrecisionPolicy got = resolve_policy(st.attention, "one", Format::fp32, AttentionKind::flash);
    const PrecisionPolicy pure = make_policy("pure", Format::fp32, AttentionKind::flash);
    for (const auto& other : kPolicySteps) {
      const Format want = other.member == step.member ? Format::fp16 : pure.*(other.member);
      EXPECT_EQ(got.*(other.member), want) << other.name;
    }
    EXPECT_EQ(find_policy_step(step.name), &step);
  }
  EXPECT_EQ(find_policy_step("accumulator"), nullptr);
}

TEST(PolicySteps, ConfigurationReferenceNamesEveryStep) {
  std::ifstream in(std::string(FASTUDY_CONFIGS) + "/../docs/configuration.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string reference = ss.str();
  ASSERT_FALSE(reference.empty());
  for (const auto& step : kPolicySteps)
    EXPECT_NE(reference.find("`" + std::string(step.name) + "`"), std::string::npos) << step.name;
}

// [numerics] sets every variant, a grid axis overrides its field, and only a value other than the
// default reaches the resolved configuration (so studies without it keep their hashes).
TEST(Numerics, SectionSetsVariantsAxesOverrideAndDefaultsKeepHashes) {
  Study st = parse_study("[numerics]\nsplit_k = 2\ngelu = \"tanh\"\nrecompute = \"on\"\n"
                         "[grid]\nmatmul = [\"fp32\", \"bf16x3\"]\nlayernorm = [\"welford\"]\n",
                         "n.toml");
  ASSERT_EQ(st.variants.size(), 2u);
  EXPECT_EQ(st.variants[1].id, "mm_bf16x3-ln_welford");
  for (const Variant& v : st.variants) {
    EXPECT_EQ(v.numerics.split_k, 2);
    EXPECT_EQ(v.numerics.gelu, GeluApproximation::tanh);
    EXPECT_TRUE(v.numerics.recompute);
    EXPECT_EQ(v.numerics.layernorm, LayerNormAlgorithm::welford);
    EXPECT_NE(v.resolved_toml.find("[numerics]"), std::string::npos);
  }
  EXPECT_EQ(st.variants[0].numerics.matmul, MatmulArithmetic::fp32);
  EXPECT_EQ(st.variants[1].numerics.matmul, MatmulArithmetic::bf16x3);
  Study again = parse_study(st.resolved_toml, "study.toml");
  EXPECT_EQ(again.hash, st.hash);
  EXPECT_EQ(again.variants[1].hash, st.variants[1].hash);

  const Study plain = parse_study("", "a.toml");
  const Study defaults = parse_study(
      "[numerics]\nmatmul = \"fp32\"\nsplit_k = 1\nlayernorm = \"torch\"\ngelu = \"erf\"\nrecompute = \"off\"\n",
      "b.toml");
  EXPECT_EQ(defaults.hash, plain.hash);
  EXPECT_EQ(defaults.variants[0].hash, plain.variants[0].hash);
  EXPECT_EQ(plain.resolved_toml.find("numerics"), std::string::npos);
  EXPECT_NE(parse_study("[numerics]\nsplit_k = 2\n", "c.toml").variants[0].hash, plain.variants[0].hash);
}

// The grid-axis table: every row expands, names its variants, applies its value and hashes, so a new
// axis (one row) is covered here without a new line of test.
TEST(GridAxes, EveryAxisExpandsIdsHashesAndRoundTrips) {
  ASSERT_EQ(grid_axes().size(), known_axes().size());
  for (const auto& axis : grid_axes()) {
    SCOPED_TRACE(axis.name);
    const std::string text = "[model]\nseq_len = 32\n[grid]\n" + axis.name + " = " + axis.example + "\n";
    Study st = parse_study(text, "g.toml");
    ASSERT_EQ(st.variants.size(), 2u);
    const Variant& a = st.variants[0];
    const Variant& b = st.variants[1];
    EXPECT_NE(a.id, b.id);
    EXPECT_NE(a.hash, b.hash) << "the axis does not change the variant's resolved configuration";
    EXPECT_NE(a.resolved_toml, b.resolved_toml);
    EXPECT_NE(a.axis(axis.name), b.axis(axis.name));
    EXPECT_NE(a.id.find(a.axis(axis.name)), std::string::npos) << a.id;
    // The resolved study parses back to the same study.
    const GridAxisInfo* row = find_grid_axis(axis.name);
    ASSERT_NE(row, nullptr);
    EXPECT_EQ(row->role, axis.role);
    if (!row->baseline.empty()) {
      // A declared baseline is a value the axis accepts.
      const bool quoted = axis.example.find('"') != std::string::npos;
      const std::string value = quoted ? "\"" + row->baseline + "\"" : row->baseline;
      Study base = parse_study("[model]\nseq_len = 32\n[grid]\n" + axis.name + " = [" + value + "]\n", "g.toml");
      EXPECT_EQ(base.variants.at(0).axis(axis.name), row->baseline);
    }
    Study again = parse_study(st.resolved_toml, "study.toml");
    EXPECT_EQ(again.hash, st.hash);
    ASSERT_EQ(again.variants.size(), 2u);
    EXPECT_EQ(again.variants[1].id, b.id);
    EXPECT_EQ(again.variants[1].hash, b.hash);
  }
}

// [[grid.vary]]: each table's axes vary from their baseline, crossed with [grid]'s own axes; the
// all-baseline variant that every table produces is kept once.
TEST(GridVary, VariesEachTableFromTheBaselineCrossedWithTheGrid) {
  const std::string text =
      "[model]\nseq_len = 32\n[grid]\nseed = [1, 2]\n"
      "[[grid.vary]]\nattention = [\"baseline\", \"flash\"]\n"
      "[[grid.vary]]\nloop_order = [\"kv_outer\", \"q_outer\"]\nblock_q = [8, 16]\n";
  Study st = parse_study(text, "g.toml");
  ASSERT_EQ(st.crossed_axes, 1u);
  ASSERT_EQ(st.axes.size(), 4u);
  EXPECT_EQ(st.axes[1].first, "attention");
  // attention's declared baseline is "baseline"; loop_order and block_q have none: the first value listed.
  EXPECT_EQ(st.axes[1].second, (std::vector<std::string>{"baseline", "flash"}));
  EXPECT_EQ(st.axes[2].second, (std::vector<std::string>{"kv_outer", "q_outer"}));
  EXPECT_EQ(st.axes[3].second, (std::vector<std::string>{"8", "16"}));
  // seed x (attention: 2) + seed x (loop_order x block_q: 4) - seed x the shared all-baseline variant.
  ASSERT_EQ(st.variants.size(), 2u * 2 + 2u * 4 - 2u);
  std::set<std::string> ids;
  for (const auto& v : st.variants) {
    ids.insert(v.id);
    ASSERT_EQ(v.axes.size(), 4u);
    // No variant changes attention together with a loop_order/block_q away from their baselines.
    const bool off_attention = v.axis("attention") != "baseline";
    const bool off_tiles = v.axis("loop_order") != "kv_outer" || v.axis("block_q") != "8";
    EXPECT_FALSE(off_attention && off_tiles) << v.id;
  }
  EXPECT_EQ(ids.size(), st.variants.size());
  EXPECT_EQ(grid_shape(st), "seed[2] x (attention[2] | loop_order[2] x block_q[2])");
  // Ids: [grid]'s tokens, then the vary axes away from their baseline.
  EXPECT_NE(st.find_variant("s1"), nullptr);
  EXPECT_NE(st.find_variant("s1-q_outer-bq16"), nullptr);
  EXPECT_EQ(st.find_variant("s1-baseline-kv_outer-bq8"), nullptr);
  const Variant* flash = st.find_variant("s2-flash");
  ASSERT_NE(flash, nullptr);
  EXPECT_EQ(flash->attention, AttentionKind::flash);
  EXPECT_EQ(flash->attention_cfg.block_q, 8);
  // The resolved study keeps the design and parses back to the same variants.
  EXPECT_NE(st.resolved_toml.find("[[grid.vary]]"), std::string::npos);
  Study again = parse_study(st.resolved_toml, "study.toml");
  EXPECT_EQ(again.hash, st.hash);
  ASSERT_EQ(again.variants.size(), st.variants.size());
  for (std::size_t i = 0; i < st.variants.size(); ++i) EXPECT_EQ(again.variants[i].hash, st.variants[i].hash);
}
