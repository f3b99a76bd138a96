// grid.toml -> Study: the strict reading of every section (one function per section of grid.toml),
// the validation that spans keys, and parse_study/load_study, which run them in order and then expand
// the grid (grid.cpp) and resolve the study (resolved.cpp).
//
// Validation that spans keys (d_model vs heads, block sizes vs seq_len) runs after a section's keys
// are read, pointing at the offending key; the training-loop keys of every variant are checked after
// the expansion (check_loop_axes). What this build cannot run is refused here too, at load, through
// capabilities.hpp.
#include "src/core/config.hpp"

#include <algorithm>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "base/read_file.hpp"
#include "src/core/capabilities.hpp"
#include "src/core/config_section.hpp"
#include "src/core/grid.hpp"
#include "src/core/import.hpp"
#include "src/core/resolved.hpp"
#include "src/core/toml_bounds.hpp"

namespace fastudy {

using namespace config_detail;

namespace {

const std::vector<std::string> kTileRules{"paper", "swapped", "square"};
const std::vector<std::string> kMicrobenchDevices{"cpu", "cuda"};  // [microbench] devices

std::vector<std::string> policy_step_names() {
  std::vector<std::string> out;
  for (const auto& step : kPolicySteps) out.emplace_back(step.name);
  return out;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Reading& r : kReadings) names.emplace_back(r.name);
  return names;
}

void check_top_level(const toml::table& root, const std::string& file) {
  const std::vector<std::string> sections{"study",   "grid",      "model",      "data",  "train",
                                          "attention", "numerics", "microbench", "reduce", "import", "axes"};
  for (auto&& [k, v] : root) {
    std::string key(k.str());
    if (std::find(sections.begin(), sections.end(), key) == sections.end()) {
      std::string hint = suggestion(key, sections);
      if (hint.empty()) hint = "known sections: " + join(sections);
      throw ConfigError(file, static_cast<int>(k.source().begin.line), static_cast<int>(k.source().begin.column), key,
                        "unknown section or key `" + key + "` at the top level", hint);
    }
  }
}

void read_study(Section study, Study& st) {
  study.get("name", st.name);
  study.get("out", st.out);
  study.get_words("phases", st.phases, known_phases());
  study.get("memory_check", st.memory_check);
  study.get("max_variants", st.max_variants);
  require(st.max_variants >= 1, study, "max_variants", "[study] max_variants must be >= 1",
          "the most variants the grid may list; the default is " + std::to_string(kDefaultMaxVariants));
  require_name(study, "name", "[study] name", st.name);
  require(!st.out.empty(), study, "out", "[study] out must not be empty", "name the output directory, e.g. out = \"out/quick\"");
  study.finish();
}

void read_model(Section model, ModelConfig& m) {
  model.get("vocab", m.vocab);
  model.get("d_model", m.d_model);
  model.get("heads", m.heads);
  model.get("layers", m.layers);
  model.get("seq_len", m.seq_len);
  model.get("mlp_ratio", m.mlp_ratio);
  require(m.vocab >= 2, model, "vocab", "[model] vocab = " + std::to_string(m.vocab) + " must be >= 2");
  require(m.d_model >= 1, model, "d_model", "[model] d_model must be >= 1");
  require(m.heads >= 1, model, "heads", "[model] heads must be >= 1");
  require(m.layers >= 1, model, "layers", "[model] layers must be >= 1");
  require(m.seq_len >= 2, model, "seq_len", "[model] seq_len must be >= 2");
  require(m.mlp_ratio >= 1, model, "mlp_ratio", "[model] mlp_ratio must be >= 1");
  require(m.d_model % m.heads == 0, model, "d_model",
          "[model] d_model = " + std::to_string(m.d_model) + " is not divisible by heads = " + std::to_string(m.heads),
          "choose d_model a multiple of heads (head dim = d_model / heads)");
  model.finish();
}

void read_data(Section data, DataConfig& d, const ModelConfig& m) {
  std::string kind(to_string(d.kind));
  data.get("kind", kind);
  data.get("path", d.path);
  data.get("seed", d.seed);
  data.get("span_len", d.span_len);
  data.get("token_bytes", d.token_bytes);
  require(d.token_bytes == 2 || d.token_bytes == 4, data, "token_bytes",
          "[data] token_bytes = " + std::to_string(d.token_bytes) + " is not a token width",
          "use 2 for uint16 ids (nanoGPT's train.bin) or 4 for uint32 ids");
  require(parse_data_kind(kind) == DataKind::tokens || d.token_bytes == 2, data, "token_bytes",
          "[data] token_bytes applies to kind = \"tokens\" only", "remove token_bytes, or set kind = \"tokens\"");
  d.kind = require_word(data, "kind", kAllDataKinds, kind, "[data] kind = \"" + kind + "\" is unknown");
  require(d.kind == DataKind::synthetic || !d.path.empty(), data, "kind",
          "[data] kind = \"" + kind + "\" needs a path", "add path = \"/path/to/file\"");
  require(d.kind != DataKind::synthetic || d.path.empty(), data, "path",
          "[data] path is set but kind = \"synthetic\" reads no file", "remove path, or set kind = \"text\" or \"tokens\"");
  require(d.kind != DataKind::text || m.vocab >= 256, data, "kind",
          "[data] kind = \"text\" uses byte tokens, which need [model] vocab >= 256 (got " + std::to_string(m.vocab) + ")",
          "set vocab = 256");
  require(d.span_len >= 1 && d.span_len < m.seq_len, data, "span_len",
          "[data] span_len = " + std::to_string(d.span_len) + " must be in [1, seq_len)");
  data.finish();
}

void read_train(Section train, TrainConfig& t) {
  train.get("steps", t.steps);
  train.get("batch", t.batch);
  train.get("lr", t.lr);
  train.get("min_lr", t.min_lr);
  train.get("warmup", t.warmup);
  std::string schedule(to_string(t.schedule));
  train.get("schedule", schedule);
  train.get("weight_decay", t.weight_decay);
  train.get("beta1", t.beta1);
  train.get("beta2", t.beta2);
  train.get("eps", t.eps);
  train.get("grad_clip", t.grad_clip);
  train.get("checkpoint_every", t.checkpoint_every);
  train.get("ranks_per_variant", t.ranks_per_variant);
  train.get("shadow_attention", t.shadow_attention);
  train.get("log_every", t.log_every);
  train.get("spike_window", t.spike_window);
  train.get("spike_threshold", t.spike_threshold);
  train.get("loss_scale", t.loss_scale);
  train.get("loss_scale_window", t.loss_scale_window);
  const bool dp_given = train.node("dp_width") != nullptr;
  train.get("dp_width", t.dp_width);
  std::string allreduce(to_string(t.allreduce));
  train.get("allreduce", allreduce);
  train.get("grad_accum", t.grad_accum);
  train.get("repeat", t.repeat);
  t.device = read_word(train, "device", kAllDevices, t.device);
  t.arithmetic = read_word(train, "arithmetic", kAllArithmetics, t.arithmetic);
  require(t.steps >= 1, train, "steps", "[train] steps = " + std::to_string(t.steps) + " must be >= 1");
  require(t.batch >= 1, train, "batch", "[train] batch must be >= 1");
  require(t.lr > 0, train, "lr", "[train] lr must be > 0");
  require(t.min_lr >= 0 && t.min_lr <= t.lr, train, "min_lr", "[train] min_lr must be in [0, lr]");
  require(t.warmup >= 0 && t.warmup <= t.steps, train, "warmup", "[train] warmup must be in [0, steps]");
  t.schedule =
      require_word(train, "schedule", kAllSchedules, schedule, "[train] schedule = \"" + schedule + "\" is unknown");
  require(t.weight_decay >= 0, train, "weight_decay", "[train] weight_decay must be >= 0");
  require(t.beta1 >= 0 && t.beta1 < 1, train, "beta1", "[train] beta1 must be in [0, 1)");
  require(t.beta2 >= 0 && t.beta2 < 1, train, "beta2", "[train] beta2 must be in [0, 1)");
  require(t.eps > 0, train, "eps", "[train] eps must be > 0");
  require(t.grad_clip >= 0, train, "grad_clip", "[train] grad_clip must be >= 0 (0 disables clipping)");
  require(t.checkpoint_every >= 1, train, "checkpoint_every", "[train] checkpoint_every must be >= 1");
  require(t.ranks_per_variant >= 1, train, "ranks_per_variant", "[train] ranks_per_variant must be >= 1");
  require(t.batch % t.ranks_per_variant == 0, train, "batch",
          "[train] batch = " + std::to_string(t.batch) + " is not divisible by ranks_per_variant = " +
              std::to_string(t.ranks_per_variant),
          "the global batch is sharded evenly over a variant's ranks");
  require(t.log_every >= 1, train, "log_every", "[train] log_every must be >= 1");
  require(t.spike_window >= 2, train, "spike_window", "[train] spike_window must be >= 2");
  require(t.spike_threshold > 1, train, "spike_threshold", "[train] spike_threshold must be > 1");
  require(t.loss_scale >= 1, train, "loss_scale", "[train] loss_scale must be >= 1");
  require(t.loss_scale_window >= 1, train, "loss_scale_window", "[train] loss_scale_window must be >= 1");
  require(!dp_given || t.dp_width >= 1, train, "dp_width",
          "[train] dp_width = " + std::to_string(t.dp_width) + " must be >= 1 (the modelled data-parallel width)",
          "e.g. dp_width = 4; remove the key to average over the ranks_per_variant ranks as they are");
  t.allreduce = require_word(train, "allreduce", kAllReduceOrders, allreduce,
                             "[train] allreduce = \"" + allreduce + "\" is not a reduction order");
  require(t.grad_accum >= 1, train, "grad_accum",
          "[train] grad_accum = " + std::to_string(t.grad_accum) + " must be >= 1 (micro-batches per shard)",
          "1 computes each shard's gradient in one pass");
  require(t.repeat >= 0, train, "repeat", "[train] repeat = " + std::to_string(t.repeat) + " must be >= 0",
          "repeat only labels a copy of the variant: 0, 1, 2, ...");
  train.finish();
}

// The keys of a custom policy's table that are not step formats.
const std::vector<std::string> kPolicyOptionKeys{"preset", "rounding", "scale", "quantization", "incoherent_processing",
                                                 "max_offset", "flash", "baseline"};

// The overrides of one table of a custom policy: step = "format" keys, scale, quantization,
// incoherent_processing and max_offset. `kind` is "" for the policy's own table (both kinds), else the sub-table's
// kind ("flash", "baseline"), where what both kinds must share is refused: the inputs Q, K, V and dO
// (q, k, v, grad and quantization) and, for flash, the baseline's scale placement.
void read_overrides(Section& ps, PolicyOverrides& o, const std::string& kind) {
  const std::string where = "[" + ps.name() + "] ";
  for (const auto& step : policy_step_names()) {
    std::string fmt;
    ps.get(step, fmt);
    if (fmt.empty()) continue;
    auto f = parse_format(fmt);
    if (!f) ps.fail(step, "unknown format \"" + fmt + "\"; allowed: " + format_names(), suggestion(fmt, words(kAllFormats)));
    if (!kind.empty() && (step == "q" || step == "k" || step == "v" || step == "grad"))
      ps.fail(step, where + step + " is the storage of an input both attention kinds share (Q, K, V, dO)",
              "set " + step + " in the policy's own table, not in its " + kind + " table");
    o.steps[step] = *f;
  }
  // The policy's own table places the baseline's scale; the flash table the framework flash loops'
  // (fa2/fa3 fold it into exp2 whatever it says).
  if (ps.has("scale")) o.scale = read_word(ps, "scale", kAllScalePlacements, ScalePlacement::fused);
  if (ps.has("quantization")) {
    if (!kind.empty())
      ps.fail("quantization", where + "quantization decides how the inputs both kinds share enter their formats",
              "set quantization in the policy's own table");
    o.quantization = read_word(ps, "quantization", kAllQuantizations, Quantization::none);
  }
  if (ps.has("incoherent_processing")) {
    bool on = false;
    ps.get("incoherent_processing", on);
    o.incoherent = on;
  }
  if (ps.has("max_offset")) {
    double beta = 0;
    ps.get("max_offset", beta);
    if (!(beta > 1))
      ps.fail("max_offset",
              where + "max_offset must be > 1: the factor beta a tile's repeated row maximum is multiplied by "
                      "(Qiu & Yao)",
              "their code uses max_offset = 2; remove the key to subtract the plain maximum");
    o.max_offset = beta;
  }
}

// Returns the names a `policy` may take: the presets and the custom policies.
std::vector<std::string> read_attention(Section att, AttentionConfig& a, const ModelConfig& m, const std::string& file) {
  att.get("block_q", a.block_q);
  att.get("block_kv", a.block_kv);
  std::string loop = std::string(to_string(a.loop_order));
  att.get("loop_order", loop);
  if (auto lo = parse_loop_order(loop)) a.loop_order = *lo;
  else att.fail("loop_order", "[attention] loop_order = \"" + loop + "\" is unknown; allowed: " + join(kLoopOrders),
                suggestion(loop, kLoopOrders));
  att.get("policy", a.policy);
  if (att.has("policies")) {
    const toml::node* pn = att.node("policies");
    if (!pn->is_table()) att.fail("policies", "[attention] policies must be a table of policies",
                                  "write [attention.policies.NAME] with step = \"format\" lines");
    for (auto&& [pk, pv] : *pn->as_table()) {
      std::string pname(pk.str());
      require_name(file, pk.source(), "attention.policies", "the custom policy", pname);
      if (is_policy_preset(pname))
        throw ConfigError(file, static_cast<int>(pk.source().begin.line), static_cast<int>(pk.source().begin.column),
                          "attention.policies." + pname, "a custom policy cannot be named \"" + pname + "\" (a preset)",
                          "choose another name");
      if (!pv.is_table())
        throw ConfigError(file, static_cast<int>(pv.source().begin.line), static_cast<int>(pv.source().begin.column),
                          "attention.policies." + pname, "policy `" + pname + "` must be a table of step = \"format\"");
      Section ps(file, "attention.policies." + pname, pv.as_table(), pv.source());
      CustomPolicy& custom = a.custom_policies[pname];
      std::vector<std::string> keys = policy_step_names();
      read_overrides(ps, custom.both, "");
      for (const char* kind : {"flash", "baseline"}) {
        if (!ps.has(kind)) continue;
        const toml::node* kn = ps.node(kind);
        if (!kn->is_table())
          ps.fail(kind, "[" + ps.name() + "] " + kind + " must be a table of what the " + kind + " kind changes",
                  "write [attention.policies." + pname + "." + kind + "] with step = \"format\" lines");
        Section ks(file, "attention.policies." + pname + "." + kind, kn->as_table(), kn->source());
        read_overrides(ks, std::string(kind) == "flash" ? custom.flash : custom.baseline, kind);
        std::vector<std::string> kind_keys = policy_step_names();
        kind_keys.insert(kind_keys.end(), {"scale", "quantization", "incoherent_processing", "max_offset"});
        ks.finish(kind_keys);
      }
      ps.get("preset", custom.preset);
      if (!is_policy_preset(custom.preset))
        ps.fail("preset", "unknown preset \"" + custom.preset + "\"; allowed: " + policy_preset_names(),
                suggestion(custom.preset, preset_names()));
      std::string rounding(to_string(custom.rounding));
      ps.get("rounding", rounding);
      if (auto r = parse_rounding(rounding)) custom.rounding = *r;
      else ps.fail("rounding", "unknown rounding \"" + rounding + "\"; allowed: " + rounding_names(),
                   suggestion(rounding, {"nearest", "zero", "stochastic"}));
      keys.insert(keys.end(), kPolicyOptionKeys.begin(), kPolicyOptionKeys.end());
      ps.finish(keys);
    }
  }
  require(a.block_q >= 1, att, "block_q", "[attention] block_q must be >= 1");
  require(a.block_kv >= 1, att, "block_kv", "[attention] block_kv must be >= 1");
  require(a.block_q <= m.seq_len, att, "block_q",
          "[attention] block_q = " + std::to_string(a.block_q) + " is larger than [model] seq_len = " + std::to_string(m.seq_len),
          "use a block size <= seq_len");
  require(a.block_kv <= m.seq_len, att, "block_kv",
          "[attention] block_kv = " + std::to_string(a.block_kv) + " is larger than [model] seq_len = " + std::to_string(m.seq_len),
          "use a block size <= seq_len");
  auto policy_known = [&](const std::string& p) { return is_policy_preset(p) || a.custom_policies.count(p); };
  std::vector<std::string> policy_names = preset_names();
  for (const auto& [k, v] : a.custom_policies) policy_names.push_back(k);
  require(policy_known(a.policy), att, "policy",
          "[attention] policy = \"" + a.policy + "\" is neither a preset nor a [attention.policies." + a.policy + "] table; known: " +
              join(policy_names),
          suggestion(a.policy, policy_names));
  att.finish();
  return policy_names;
}

// [numerics]: every value a word of its axis (recompute too: "off" | "on", as in [grid]); split_k
// between 1 and the model's shortest linear-layer reduction.
void read_numerics(Section num, NumericsConfig& n, const ModelConfig& m) {
  // Each value a word, not a boolean (recompute = true is a likely slip), checked key by key.
  auto not_boolean = [&](const std::string& key) {
    if (num.has(key) && num.node(key)->is_boolean())
      num.fail(key, "`[numerics] " + key + "` must be a word, not a boolean", "write " + key + " = \"on\" or \"off\"");
  };
  not_boolean("matmul");
  n.matmul = read_word(num, "matmul", kAllMatmulArithmetics, n.matmul);
  not_boolean("layernorm");
  n.layernorm = read_word(num, "layernorm", kAllLayerNormAlgorithms, n.layernorm);
  not_boolean("gelu");
  n.gelu = read_word(num, "gelu", kAllGeluApproximations, n.gelu);
  not_boolean("recompute");
  n.recompute = read_word(num, "recompute", kOnOff, n.recompute ? "on" : "off") == "on";
  num.get("split_k", n.split_k);
  require(n.split_k >= 1, num, "split_k", "[numerics] split_k = " + std::to_string(n.split_k) + " must be >= 1",
          "1 is one matmul over the whole reduction");
  require(n.split_k <= max_split_k(m), num, "split_k",
          "[numerics] split_k = " + std::to_string(n.split_k) +
              " is larger than the shortest reduction of the model's linear layers (" + std::to_string(max_split_k(m)) +
              " = the smallest of [model] d_model, vocab and seq_len)",
          "use split_k <= " + std::to_string(max_split_k(m)));
  num.finish();
}

// The fields of one microbenchmark sweep, from [microbench] or one [[microbench.sweeps]] table.
void read_sweep(Section& mb, MicrobenchSweep& mc, const std::vector<std::string>& policy_names) {
  const std::string sec = "[" + mb.name() + "] ";
  std::vector<std::string> formats;
  mb.get_words("formats", formats, words(kAllFormats));
  if (!formats.empty()) {
    mc.formats.clear();
    for (const auto& f : formats) mc.formats.push_back(*parse_format(f));
  }
  mb.get_words("policies", mc.policies, policy_names);
  std::vector<std::string> roundings;
  mb.get_words("roundings", roundings, words(kAllRoundings));
  if (!roundings.empty()) {
    mc.roundings.clear();
    for (const auto& r : roundings) mc.roundings.push_back(*parse_rounding(r));
  }
  mb.get_ints("seq_lens", mc.seq_lens, 1);
  mb.get_ints("head_dims", mc.head_dims, 1);
  if (const toml::array* blocks = mb.array("blocks")) {
    mc.blocks.clear();
    std::set<std::pair<int, int>> seen;
    for (const auto& el : *blocks) {
      const toml::array* pair = el.as_array();
      if (!pair || pair->size() != 2 || !(*pair)[0].is_integer() || !(*pair)[1].is_integer())
        mb.fail_at(el, "blocks", sec + "blocks must be a list of [block_q, block_kv] integer pairs",
                   "e.g. blocks = [[16, 16], [32, 64]]");
      const std::int64_t q = *(*pair)[0].value<std::int64_t>(), kv = *(*pair)[1].value<std::int64_t>();
      if (q < 1 || kv < 1) mb.fail_at(el, "blocks", sec + "block sizes must be >= 1");
      if (q > INT32_MAX || kv > INT32_MAX)
        mb.fail_at(el, "blocks", sec + "block sizes must be at most " + std::to_string(INT32_MAX));
      const int bq = static_cast<int>(q), bkv = static_cast<int>(kv);
      if (!seen.emplace(bq, bkv).second)
        mb.fail_at(el, "blocks", sec + "blocks lists [" + std::to_string(bq) + ", " + std::to_string(bkv) + "] twice",
                   "remove the duplicate");
      mc.blocks.emplace_back(bq, bkv);
    }
    if (mb.has("sram"))
      mb.fail("sram", sec + "sets both blocks and sram",
              "give the tiles directly (blocks) or derive them from an SRAM size (sram, tile_rules), not both");
    mc.sram.clear();  // tiles given here override SRAM sizes inherited from [microbench]
    mc.tile_rules = {"paper"};
  }
  mb.get_ints("sram", mc.sram, 4);
  mb.get_words("tile_rules", mc.tile_rules, kTileRules);
  if (mb.has("tile_rules") && mc.sram.empty())
    mb.fail("tile_rules", sec + "tile_rules derive tiles from an SRAM size, and this sweep has no sram",
            "add sram = [M, ...] (elements), e.g. sram = [16384], or drop tile_rules and give blocks");
  std::vector<std::string> orders;
  mb.get_words("loop_orders", orders, kLoopOrders);
  if (!orders.empty()) {
    mc.loop_orders.clear();
    for (const auto& o : orders) mc.loop_orders.push_back(*parse_loop_order(o));
  }
  // launch = "pytorch": the launch picks the tiles and the order, so blocks, sram, tile_rules and a
  // kv_outer loop order are refused beside it (inherited ones are replaced); sm_count only with it.
  mc.launch = read_word(mb, "launch", kAllLaunches, mc.launch);
  if (mc.launch == Launch::pytorch) {
    for (const char* key : {"blocks", "sram", "tile_rules"})
      if (mb.has(key))
        mb.fail(key, sec + key + " and launch = \"pytorch\" both set the tiles" +
                         (mb.has("launch") ? "" : " (launch = \"pytorch\" is inherited from [microbench])"),
                "remove " + std::string(key) + " (PyTorch's launch picks the tiles for each shape), or set "
                "launch = \"blocks\" to sweep tiles");
    if (mb.has("loop_orders") &&
        std::find(mc.loop_orders.begin(), mc.loop_orders.end(), LoopOrder::kv_outer) != mc.loop_orders.end())
      mb.fail("loop_orders", sec + "loop_orders lists \"kv_outer\", and launch = \"pytorch\" runs FlashAttention-2's "
                             "loop order (q_outer)",
              "remove loop_orders, or set launch = \"blocks\"");
    mc.loop_orders = {LoopOrder::q_outer};
    mc.blocks = {{32, 32}};  // unused: the launch's tiles replace them point by point
    mc.sram.clear();
    mc.tile_rules = {"paper"};
  }
  if (mb.has("sm_count")) {
    int sm = 0;
    mb.get("sm_count", sm);
    if (mc.launch != Launch::pytorch)
      mb.fail("sm_count", sec + "sm_count is read only by launch = \"pytorch\", and this sweep's launch is \"blocks\"",
              "set launch = \"pytorch\", or remove sm_count");
    if (sm < 1)
      mb.fail("sm_count", sec + "sm_count = " + std::to_string(sm) + " must be >= 1",
              "the GPU's number of SMs: 132 on an H100 SXM or H200, 114 on an H100 PCIe");
    mc.sm_count = sm;
  }
  if (const toml::array* causal = mb.array("causal")) {
    mc.causal.clear();
    for (const auto& el : *causal) {
      if (!el.is_boolean()) mb.fail_at(el, "causal", sec + "causal must hold booleans, e.g. causal = [false, true]");
      bool c = *el.value<bool>();
      if (std::find(mc.causal.begin(), mc.causal.end(), c) != mc.causal.end())
        mb.fail_at(el, "causal", sec + "causal lists a value twice", "remove the duplicate");
      mc.causal.push_back(c);
    }
  }
  std::vector<std::string> passes;
  mb.get_words("passes", passes, words(kAllPasses));
  if (!passes.empty()) {
    mc.passes.clear();
    for (const auto& p : passes) mc.passes.push_back(*parse_pass(p));
  }
  mb.get("trials", mc.trials);
  mb.get("batch", mc.batch);
  mb.get("heads", mc.heads);
  std::string distribution(to_string(mc.distribution));
  mb.get("distribution", distribution);
  mb.get("outlier_fraction", mc.outlier_fraction);
  mb.get("outlier_scale", mc.outlier_scale);
  mb.get("sink_logit", mc.sink_logit);
  mb.get("repeated_keys", mc.repeated_keys);
  mb.get("captured_variant", mc.captured_variant);
  mb.get("captured_step", mc.captured_step);
  mb.get("captured_layer", mc.captured_layer);
  mb.get("captured_batch", mc.captured_batch);
  mb.get("seed", mc.seed);
  mb.get_words("devices", mc.devices, kMicrobenchDevices);
  std::vector<std::string> real_code;
  for (const auto& c : kRealCode) real_code.emplace_back(c.algorithm);
  mb.get_words("framework", mc.framework, real_code);
  mb.get("input_file", mc.input_file);
  mb.get("save_outputs", mc.save_outputs);
  require(mc.trials >= 1, mb, "trials", sec + "trials must be >= 1");
  require(mc.batch >= 1, mb, "batch", sec + "batch must be >= 1");
  require(mc.heads >= 1, mb, "heads", sec + "heads must be >= 1");
  mc.distribution = require_word(mb, "distribution", kAllInputDistributions, distribution,
                                sec + "distribution = \"" + distribution + "\" is unknown");
  require(mc.outlier_fraction >= 0 && mc.outlier_fraction <= 1, mb, "outlier_fraction",
          sec + "outlier_fraction must be in [0, 1]");
  require(mc.outlier_scale > 0, mb, "outlier_scale", sec + "outlier_scale must be > 0");
  require(mc.sink_logit > 0, mb, "sink_logit", sec + "sink_logit must be > 0",
          "the logit of the sink key for every query, e.g. sink_logit = 10");
  require(mc.repeated_keys >= 2, mb, "repeated_keys", sec + "repeated_keys must be >= 2",
          "the number of keys that share each row's largest logit under distribution = \"repeated_max\", e.g. 4");
  require(mc.distribution != InputDistribution::captured || !mc.captured_variant.empty(), mb, "distribution",
          sec + "distribution = \"captured\" needs captured_variant (the variant whose checkpoint to read)",
          "add captured_variant = \"ID\" (and captured_step, captured_layer, captured_batch)");
  require(mc.distribution != InputDistribution::file || !mc.input_file.empty(), mb, "distribution",
          sec + "distribution = \"file\" needs input_file (the tensor file of q, k, v and do)",
          "add input_file = \"PATH\": a safetensors, h5py or torch.save file of tensors q, k, v (and do for the "
          "backward pass), each [B, H, N, d]");
  require(mc.input_file.empty() || mc.distribution == InputDistribution::file, mb, "input_file",
          sec + "input_file is read only by distribution = \"file\", and this sweep's distribution is \"" +
              std::string(to_string(mc.distribution)) + "\"",
          "set distribution = \"file\", or remove input_file");
  require(mc.captured_step >= 0, mb, "captured_step", sec + "captured_step must be >= 0 (0: the last step)");
  require(mc.captured_layer >= 0, mb, "captured_layer", sec + "captured_layer must be >= 0");
  require(mc.captured_batch >= 0, mb, "captured_batch", sec + "captured_batch must be >= 0");
}

// The real-kernel keys of a finished sweep (devices, framework; docs/microbench.md "Real kernels"): what the kernels
// or this build cannot run (capabilities.hpp), refused at load. `own` is the sweep's table, `base`
// [microbench] (a key the sweep inherits is reported where it was written).
void check_real_kernels(Section& own, Section& base, const MicrobenchSweep& mc) {
  const std::optional<SweepProblem> problem = real_kernel_problem(mc);
  if (!problem) return;
  Section& at = own.node(problem->key) || !base.node(problem->key) ? own : base;
  const std::string sec = "[" + own.name() + "] " + (own.name() == "microbench" ? "" : "'" + mc.name + "': ");
  at.fail(problem->key, sec + problem->message, problem->hint);
}

// What the readings of a finished sweep cannot run, refused at load: a policy that quantizes Q, K, V
// (FlashAttention-3's FP8 path: the fa3 reading at fp8_e4m3, or a custom policy) has no backward pass,
// and incoherent processing needs head dims that are powers of two (its Hadamard transform). `own` and
// `base` as in check_real_kernels.
void check_sweep_readings(Section& own, Section& base, const MicrobenchSweep& mc, const AttentionConfig& att,
                          const ModelConfig& m) {
  const std::string sec = "[" + own.name() + "] " + (own.name() == "microbench" ? "" : "'" + mc.name + "': ");
  auto fail = [&](const std::string& key, const std::string& message, const std::string& hint) {
    Section& at = own.node(key) || !base.node(key) ? own : base;
    at.fail(key, sec + message, hint);
  };
  const bool backward = std::find(mc.passes.begin(), mc.passes.end(), Pass::backward) != mc.passes.end();
  const bool captured = mc.distribution == InputDistribution::captured;
  const std::vector<int> dims = captured ? std::vector<int>{m.d_model / m.heads} : mc.head_dims;
  for (const auto& name : mc.policies)
    for (Format f : mc.formats) {
      const ReadingPolicies r = resolve_reading(att, name, f);
      const std::string what = "policy \"" + name + "\" at " + std::string(to_string(f));
      const bool quantized = r.flash.quantization != Quantization::none ||
                             r.baseline.quantization != Quantization::none || r.flash.incoherent ||
                             r.baseline.incoherent;
      if (quantized && backward)
        fail("passes", what + " quantizes Q, K, V (FlashAttention-3's FP8 path), which has no backward pass",
             "run the backward pass in a sweep of its own without this policy and format, passes = [\"forward\"] here");
      if (!r.flash.incoherent && !r.baseline.incoherent) continue;
      for (int d : dims)
        if ((d & (d - 1)) != 0)
          fail(captured ? "distribution" : "head_dims",
               what + " uses incoherent processing (a Hadamard transform), which needs a head dim that is a power of "
                      "two, not " + std::to_string(d),
               "use head dims 64, 128, ..., or a custom policy with incoherent_processing = false");
    }
}

// What launch = "pytorch" cannot run, refused at load: it models the fa2 reading's kernel (PyTorch's
// FlashAttention-2), which takes fp16 and bf16, rounds to nearest and runs head dims up to 256, on the CPU
// (our CUDA kernels run their own tiles); a custom policy with the fa2 kernel is not that kernel.
// `own` and `base` as in check_real_kernels.
void check_sweep_launch(Section& own, Section& base, const MicrobenchSweep& mc, const AttentionConfig& att) {
  if (mc.launch != Launch::pytorch) return;
  const std::string sec = "[" + own.name() + "] " + (own.name() == "microbench" ? "" : "'" + mc.name + "': ");
  auto fail = [&](const std::string& key, const std::string& message, const std::string& hint) {
    Section& at = own.node(key) || !base.node(key) ? own : base;
    at.fail(key, sec + message, hint);
  };
  const bool fa2 = std::find(mc.policies.begin(), mc.policies.end(), "fa2") != mc.policies.end();
  for (const auto& name : mc.policies) {
    if (name == "fa2" || !att.custom_policies.count(name)) continue;
    if (resolve_reading(att, name, mc.formats.front()).flash.kernel == FlashKernel::fa2)
      fail("policies", "policy \"" + name + "\" uses the fa2 kernel, and launch = \"pytorch\" models the fa2 reading "
                       "itself (PyTorch's FlashAttention-2 with its fp16/bf16 arithmetic)",
           "use policy \"fa2\" with launch = \"pytorch\", or launch = \"blocks\" for the custom policy");
  }
  if (fa2)
    for (Format f : mc.formats)
      if (f != Format::fp16 && f != Format::bf16)
        fail("formats", "launch = \"pytorch\" runs the fa2 reading as PyTorch's FlashAttention-2 kernel, which takes "
                        "fp16 and bf16, and formats lists " + std::string(to_string(f)),
             "use formats = [\"fp16\", \"bf16\"] in this sweep, and another sweep (launch = \"blocks\") for the rest");
  if (fa2)
    for (Rounding r : mc.roundings)
      if (r != Rounding::nearest)
        fail("roundings", "launch = \"pytorch\" models FlashAttention-2's kernel, which rounds to nearest, and "
                          "roundings lists \"" + std::string(to_string(r)) + "\"",
             "remove roundings, or use launch = \"blocks\"");
  for (int d : mc.head_dims)
    if (d > kFa2MaxHeadDim && mc.distribution != InputDistribution::captured && mc.distribution != InputDistribution::file)
      fail("head_dims", "launch = \"pytorch\": PyTorch's FlashAttention-2 runs head dims up to 256, and head_dims lists " +
                            std::to_string(d),
           "use head dims <= 256, or launch = \"blocks\"");
  if (std::find(mc.devices.begin(), mc.devices.end(), "cuda") != mc.devices.end())
    fail("devices", "launch = \"pytorch\" runs on the CPU (our CUDA kernels run the sweep's own tiles)",
         "remove \"cuda\" from devices in this sweep, or set launch = \"blocks\"");
}

void read_microbench(Section mb, MicrobenchConfig& mbc, const std::vector<std::string>& policy_names,
                     const AttentionConfig& att, const ModelConfig& model, const std::string& file) {
  MicrobenchSweep base;
  read_sweep(mb, base, policy_names);
  if (mb.has("sweeps")) {
    const toml::node* sn = mb.node("sweeps");
    const toml::array* arr = sn->as_array();
    if (!arr || arr->empty() || !arr->is_array_of_tables())
      mb.fail("sweeps", "[microbench] sweeps must be an array of tables", "write each sweep as [[microbench.sweeps]]");
    std::set<std::string> names;
    for (std::size_t i = 0; i < arr->size(); ++i) {
      const toml::node& el = *arr->get(i);
      MicrobenchSweep sw = base;
      sw.name = "sweep" + std::to_string(i + 1);
      Section ss(file, "microbench.sweeps", el.as_table(), el.source());
      ss.get("name", sw.name);
      require_name(ss, "name", "[[microbench.sweeps]] name", sw.name);
      read_sweep(ss, sw, policy_names);
      check_sweep_launch(ss, mb, sw, att);
      check_real_kernels(ss, mb, sw);
      check_sweep_readings(ss, mb, sw, att, model);
      if (!names.insert(sw.name).second)
        ss.fail("name", "[[microbench.sweeps]] name \"" + sw.name + "\" is used twice", "give every sweep its own name");
      ss.finish();
      mbc.sweeps.push_back(std::move(sw));
    }
  } else {
    check_sweep_launch(mb, mb, base, att);
    check_real_kernels(mb, mb, base);
    check_sweep_readings(mb, mb, base, att, model);
    mbc.sweeps.push_back(base);
  }
  mb.finish();
}

// [reduce] pairs: "verdict", "all", or a list of two-id arrays (the variants are checked against the
// grid after its expansion: check_reduce_pairs).
void read_reduce_pairs(Section& red, ReduceConfig& rc) {
  const std::string what = "[reduce] pairs must be \"verdict\" (the pairs the ranking and the verdict use), \"all\", or "
                           "a list of pairs of variant ids";
  const std::string hint = "pairs = \"all\", or pairs = [[\"flash-bf16-s1\", \"baseline-fp32-s2\"]] to add pairs to the verdict's";
  if (!red.has("pairs")) return;
  const toml::node& n = *red.node("pairs");
  if (const auto word = n.value<std::string>()) {
    if (*word != "verdict" && *word != "all") red.fail("pairs", what + " (got \"" + *word + "\")", hint);
    rc.pairs = *word;
    return;
  }
  const toml::array* list = n.as_array();
  if (!list) red.fail("pairs", what + " (got " + Section::type_name(n) + ")", hint);
  if (list->empty()) red.fail("pairs", "[reduce] pairs is an empty list", "leave the key out: reduce computes the verdict's pairs");
  rc.pairs = "verdict";
  for (const auto& el : *list) {
    const toml::array* pair = el.as_array();
    const auto a = pair && pair->size() == 2 ? pair->get(0)->value<std::string>() : std::nullopt;
    const auto b = pair && pair->size() == 2 ? pair->get(1)->value<std::string>() : std::nullopt;
    if (!a || !b) red.fail_at(el, "pairs", "each entry of [reduce] pairs is a pair of variant ids (got " + Section::type_name(el) + ")", hint);
    if (*a == *b) red.fail_at(el, "pairs", "[reduce] pairs lists \"" + *a + "\" with itself", "a pair names two different variants");
    const auto p = std::make_pair(std::min(*a, *b), std::max(*a, *b));
    if (std::find(rc.pair_list.begin(), rc.pair_list.end(), p) == rc.pair_list.end()) rc.pair_list.push_back(p);
  }
}

void read_reduce(Section red, ReduceConfig& rc) {
  red.get_words("metrics", rc.metrics, pair_metric_names());
  if (const toml::array* steps = red.array("steps")) {
    rc.steps.clear();
    for (const auto& el : *steps) {
      if (!el.is_integer() || *el.value<std::int64_t>() < 0)
        red.fail_at(el, "steps", "[reduce] steps must hold non-negative integers (checkpoint steps)");
      rc.steps.push_back(*el.value<std::int64_t>());
    }
  }
  red.get("per_tensor", rc.per_tensor);
  red.get("whole_model", rc.whole_model);
  read_reduce_pairs(red, rc);
  require(std::find(rc.metrics.begin(), rc.metrics.end(), "w1") != rc.metrics.end(), red, "metrics",
          "[reduce] metrics must include \"w1\" (the ranking is built on it)");
  require(rc.per_tensor || rc.whole_model, red, "per_tensor", "[reduce] per_tensor and whole_model cannot both be false");
  red.finish();
}

// Every variant [reduce] pairs names is one of the grid's.
void check_reduce_pairs(const Study& st, const toml::table& root, const std::string& file) {
  for (const auto& [a, b] : st.reduce.pair_list)
    for (const std::string& id : {a, b})
      if (!st.find_variant(id)) {
        std::string ids;
        for (std::size_t i = 0; i < st.variants.size() && i < 4; ++i) ids += (i ? ", " : "") + st.variants[i].id;
        if (st.variants.size() > 4) ids += ", ...";
        Section red = open_section(root, file, "reduce");
        red.fail("pairs", "[reduce] pairs names variant \"" + id + "\", which the grid does not have",
                 "the grid's variants: " + ids + " (fastudy plan GRID.toml lists them all)");
      }
}

// The training-loop keys of every variant against each other and the batch (they may come from [train]
// or from grid axes): W = dp_width (or ranks_per_variant when unset) divides the global batch, the
// ranks of a group each take W / ranks_per_variant shards, grad_accum divides a shard, and an
// allreduce order needs shards that fastudy sums itself. Errors point at the grid axis when the
// variant's value comes from one, else at the [train] key.
void check_loop_axes(const Study& st, const toml::table& root, const std::string& file) {
  for (const Variant& v : st.variants) {
    const TrainConfig& t = v.train;
    auto fail = [&](const std::string& key, const std::string& message, const std::string& hint) {
      const bool from_grid = !v.axis(key).empty();
      Section sec = open_section(root, file, from_grid ? "grid" : "train");
      const std::string where = from_grid ? " (variant " + v.id + ")" : "";
      sec.fail(key, message + where, hint);
    };
    const int ranks = t.ranks_per_variant;
    const int width = t.dp_width > 0 ? t.dp_width : ranks;
    if (t.dp_width > 0) {
      if (t.batch % width != 0)
        fail("dp_width", "dp_width = " + std::to_string(width) + " does not divide [train] batch = " + std::to_string(t.batch),
             "the global batch is cut into dp_width equal shards: choose a dp_width that divides batch, or change batch");
      if (width % ranks != 0)
        fail("dp_width", "dp_width = " + std::to_string(width) + " is not a multiple of [train] ranks_per_variant = " +
                             std::to_string(ranks),
             "each of a group's ranks computes dp_width / ranks_per_variant shards: set ranks_per_variant to a divisor "
             "of every dp_width (1 always works, and the scheduler still trains variants side by side)");
    } else if (t.allreduce != ReduceOrder::rank && ranks > 1) {
      fail("allreduce", "allreduce = \"" + std::string(to_string(t.allreduce)) + "\" orders the shards of dp_width, but dp_width is unset and the " +
                            std::to_string(ranks) + " ranks of a group average through the MPI/NCCL allreduce (its own order)",
           "set [train] dp_width = " + std::to_string(ranks) + " (or a multiple) to model the data-parallel width and its order");
    }
    const int shard = t.batch / width;
    if (shard % t.grad_accum != 0)
      fail("grad_accum", "grad_accum = " + std::to_string(t.grad_accum) + " does not divide the per-shard batch " +
                             std::to_string(shard) + " ([train] batch = " + std::to_string(t.batch) + " over " +
                             (t.dp_width > 0 ? "dp_width" : "ranks_per_variant") + " = " + std::to_string(width) + ")",
           "each shard is cut into grad_accum equal micro-batches: choose a divisor of " + std::to_string(shard) +
               ", or change batch");
  }
}

// The variants the grid lists, refused above [study] max_variants before any is expanded.
void check_variant_count(const Study& st, const toml::table& root, const std::string& file) {
  const std::uint64_t n = listed_variants(st);
  if (n <= st.max_variants) return;
  const toml::node* grid = root.get("grid");  // there is one: a grid without axes lists one variant
  throw ConfigError(file, grid ? static_cast<int>(grid->source().begin.line) : 0,
                    grid ? static_cast<int>(grid->source().begin.column) : 0, "grid",
                    "the grid lists " + (n == UINT64_MAX ? std::string("more than 18446744073709551615") : std::to_string(n)) +
                        " variants (" + grid_shape(st) + "), more than [study] max_variants = " +
                        std::to_string(st.max_variants),
                    "each variant trains a model: list fewer values, or vary each optimisation from its baseline in "
                    "[[grid.vary]] tables instead of crossing every axis; [study] max_variants = N allows more "
                    "(expanding 100000 variants takes about 3 s and 360 MB)");
}

// Every variant's attention policy can train: one that quantizes Q, K, V (FlashAttention-3's FP8 path)
// has no backward pass. The error points at the grid axis `policy` when the variant's value comes from
// it, else at [attention] policy.
void check_training_policies(const Study& st, const toml::table& root, const std::string& file) {
  for (const Variant& v : st.variants) {
    if (v.sdpa != SdpaBackend::none) continue;
    const PrecisionPolicy p = resolve_policy(v.attention_cfg, v.attention_cfg.policy, v.precision, v.attention);
    if (p.quantization == Quantization::none && !p.incoherent) continue;
    const bool from_grid = !v.axis("policy").empty();
    Section sec = open_section(root, file, from_grid ? "grid" : "attention");
    sec.fail("policy",
             "policy \"" + v.attention_cfg.policy + "\" quantizes Q, K, V (FlashAttention-3's FP8 path), which has no "
                 "backward pass to train with (variant " + v.id + ")",
             "train with a policy without quantization or incoherent processing");
  }
}

// An imported study runs reduce and report (the default); [study] phases may list only those.
void imported_phases(Section study, Study& st, const std::string& file) {
  if (!study.node("phases")) {
    st.phases = import_phases();
    return;
  }
  for (std::size_t i = 0; i < st.phases.size(); ++i)
    if (std::find(import_phases().begin(), import_phases().end(), st.phases[i]) == import_phases().end())
      study.fail_at(*study.node("phases")->as_array()->get(i), "phases",
                    "[study] phases lists \"" + st.phases[i] + "\", and this study imports its runs ([import] in " + file + ")",
                    "an imported study runs " + join(import_phases()) + "; remove phases to run both");
}

}  // namespace

Study load_study(const std::string& path) {
  std::string problem;
  const std::optional<std::string> text = read_regular_file(path, kMaxGridBytes, &problem);
  if (!text) {
    const bool missing = problem.rfind("cannot be opened", 0) == 0;
    throw ConfigError(path, 0, 0, "", "the grid file " + problem,
                      missing ? "check the path; `fastudy --help` shows the usage"
                              : "pass a grid file (a regular file of at most " + std::to_string(kMaxGridBytes) +
                                    " bytes), e.g. configs/quick.toml");
  }
  // A grid file that sets nothing (empty, blanks, comments only) is a mistake (/dev/null, a file
  // truncated to nothing), not a request for the default study.
  bool sets_nothing = true;
  for (std::size_t at = 0; at < text->size() && sets_nothing;) {
    const std::size_t eol = std::min(text->find('\n', at), text->size());
    const std::size_t first = text->find_first_not_of(" \t\r", at);
    sets_nothing = first >= eol || (*text)[first] == '#';
    at = eol + 1;
  }
  if (sets_nothing)
    throw ConfigError(path, 0, 0, "", std::string("the grid file ") + (text->empty() ? "is empty" : "sets nothing (blanks and comments only)"),
                      "a grid sets at least [study] name and its axes; start from configs/quick.toml");
  return parse_study(*text, path);
}

Study parse_study(const std::string& text, const std::string& file) {
  check_toml_bounds(text, file);
  toml::table root;
  try {
    root = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    throw ConfigError(file, static_cast<int>(e.source().begin.line), static_cast<int>(e.source().begin.column), "",
                      "TOML syntax error: " + std::string(e.description()));
  }
  check_top_level(root, file);
  Study st;
  st.file = file;
  read_study(open_section(root, file, "study"), st);
  read_import(open_section(root, file, "import"), st, file);
  if (st.imported()) imported_phases(open_section(root, file, "study"), st, file);
  if (st.imported()) refuse_training_sections(root, file);
  read_declared_axes(open_section(root, file, "axes"), st, file);
  read_model(open_section(root, file, "model"), st.model);
  read_data(open_section(root, file, "data"), st.data, st.model);
  read_train(open_section(root, file, "train"), st.train);
  const std::vector<std::string> policy_names =
      read_attention(open_section(root, file, "attention"), st.attention, st.model, file);
  read_numerics(open_section(root, file, "numerics"), st.numerics, st.model);
  read_microbench(open_section(root, file, "microbench"), st.microbench, policy_names, st.attention, st.model, file);
  read_reduce(open_section(root, file, "reduce"), st.reduce);
  read_grid(open_section(root, file, "grid"), st, policy_names, file);
  check_variant_count(st, root, file);
  expand_variants(st);
  check_reduce_pairs(st, root, file);
  if (st.imported()) {
    check_import_against_grid(st, root, file);
  } else {
    check_loop_axes(st, root, file);
    check_training_policies(st, root, file);
  }
  st.resolved_toml = resolved_study_toml(st);
  st.hash = content_hash(st.resolved_toml);
  return st;
}

}  // namespace fastudy
