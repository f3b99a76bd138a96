// The resolved configuration as TOML: every section with its defaults filled in, for each variant
// (its content hash identifies the variant: checkpoints, resume) and for the whole study (study.toml,
// the study's hash). Keys added after a study format existed are written only where they differ from
// their default, so that older studies keep their text and hashes.
#include "src/core/resolved.hpp"

#include <cstdio>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include <toml++/toml.h>

#include "base/hash.hpp"
#include "src/core/grid.hpp"
#include "src/core/import.hpp"

namespace fastudy {
namespace {

toml::array to_array(const std::vector<std::string>& v) {
  toml::array a;
  for (const auto& s : v) a.push_back(s);
  return a;
}
toml::array to_array(const std::vector<int>& v) {
  toml::array a;
  for (int s : v) a.push_back(static_cast<std::int64_t>(s));
  return a;
}

toml::table model_table(const ModelConfig& m) {
  return toml::table{{"vocab", m.vocab},   {"d_model", m.d_model}, {"heads", m.heads},
                     {"layers", m.layers}, {"seq_len", m.seq_len}, {"mlp_ratio", m.mlp_ratio}};
}
toml::table study_table(const Study& st) {
  toml::table t{{"name", st.name}, {"out", st.out}, {"phases", to_array(st.phases)}};
  if (!st.memory_check) t.insert("memory_check", false);  // the override only: other studies' text unchanged
  if (st.max_variants != kDefaultMaxVariants) t.insert("max_variants", static_cast<std::int64_t>(st.max_variants));
  return t;
}
toml::table data_table(const DataConfig& d) {
  toml::table t{{"kind", std::string(to_string(d.kind))},
                {"path", d.path},
                {"seed", static_cast<std::int64_t>(d.seed)},
                {"span_len", d.span_len}};
  if (d.kind == DataKind::tokens) t.insert("token_bytes", d.token_bytes);  // only where it applies: other hashes unchanged
  return t;
}
toml::table train_table(const TrainConfig& t) {
  toml::table out{{"steps", t.steps},
                     {"batch", t.batch},
                     {"lr", t.lr},
                     {"min_lr", t.min_lr},
                     {"warmup", t.warmup},
                     {"schedule", std::string(to_string(t.schedule))},
                     {"weight_decay", t.weight_decay},
                     {"beta1", t.beta1},
                     {"beta2", t.beta2},
                     {"eps", t.eps},
                     {"grad_clip", t.grad_clip},
                     {"checkpoint_every", t.checkpoint_every},
                     {"ranks_per_variant", t.ranks_per_variant},
                     {"shadow_attention", t.shadow_attention},
                     {"log_every", t.log_every},
                     {"spike_window", t.spike_window},
                     {"spike_threshold", t.spike_threshold},
                     {"loss_scale", t.loss_scale},
                     {"loss_scale_window", t.loss_scale_window}};
  // The training-loop keys only where they differ from the default: other studies' text (and hashes,
  // and so their resume) unchanged.
  if (t.dp_width != 0) out.insert("dp_width", t.dp_width);
  if (t.allreduce != ReduceOrder::rank) out.insert("allreduce", std::string(to_string(t.allreduce)));
  if (t.grad_accum != 1) out.insert("grad_accum", t.grad_accum);
  if (t.repeat != 0) out.insert("repeat", t.repeat);
  if (t.arithmetic != Arithmetic::emulated) out.insert("arithmetic", std::string(to_string(t.arithmetic)));
  // [train] device is where a variant runs, not what it computes: not in the resolved text or the hash.
  return out;
}
toml::table attention_table(const AttentionConfig& a) {
  toml::table t{{"block_q", a.block_q},
                {"block_kv", a.block_kv},
                {"loop_order", std::string(to_string(a.loop_order))},
                {"policy", a.policy}};
  if (!a.custom_policies.empty()) {
    toml::table pols;
    // The keys of issue 26 (scale, quantization, incoherent_processing, the flash and baseline tables)
    // only where a policy sets them, so that the resolved text and hash of every older policy stay.
    auto overrides = [](const PolicyOverrides& o, toml::table& t) {
      for (const auto& [step, f] : o.steps) t.insert(step, std::string(to_string(f)));
      if (o.scale) t.insert("scale", std::string(to_string(*o.scale)));
      if (o.quantization) t.insert("quantization", std::string(to_string(*o.quantization)));
      if (o.incoherent) t.insert("incoherent_processing", *o.incoherent);
      if (o.max_offset) t.insert("max_offset", *o.max_offset);  // issue 29, likewise only where set
    };
    for (const auto& [name, custom] : a.custom_policies) {
      toml::table p{{"preset", custom.preset}, {"rounding", std::string(to_string(custom.rounding))}};
      overrides(custom.both, p);
      for (const auto& [kind, o] : {std::pair<const char*, const PolicyOverrides&>{"flash", custom.flash},
                                    std::pair<const char*, const PolicyOverrides&>{"baseline", custom.baseline}}) {
        if (o.empty()) continue;
        toml::table k;
        overrides(o, k);
        p.insert(kind, std::move(k));
      }
      pols.insert(name, std::move(p));
    }
    t.insert("policies", std::move(pols));
  }
  return t;
}

toml::table numerics_table(const NumericsConfig& n) {
  return toml::table{{"matmul", std::string(to_string(n.matmul))},
                     {"split_k", n.split_k},
                     {"layernorm", std::string(to_string(n.layernorm))},
                     {"gelu", std::string(to_string(n.gelu))},
                     {"recompute", std::string(n.recompute ? "on" : "off")}};
}

toml::table sweep_table(const MicrobenchSweep& mc) {
  std::vector<std::string> fnames;
  for (Format f : mc.formats) fnames.emplace_back(to_string(f));
  std::vector<std::string> onames;
  for (LoopOrder o : mc.loop_orders) onames.emplace_back(to_string(o));
  toml::array blocks, causal;
  for (const auto& [bq, bkv] : mc.blocks) blocks.push_back(toml::array{bq, bkv});
  for (bool c : mc.causal) causal.push_back(c);
  std::vector<std::string> rnames;  // empty: each policy's own rounding
  for (Rounding r : mc.roundings) rnames.emplace_back(to_string(r));
  toml::table t{{"name", mc.name},
                {"formats", to_array(fnames)},
                {"policies", to_array(mc.policies)},
                {"seq_lens", to_array(mc.seq_lens)},
                {"head_dims", to_array(mc.head_dims)}};
  t.insert("loop_orders", to_array(onames));
  t.insert("causal", causal);
  std::vector<std::string> pnames;
  for (Pass p : mc.passes) pnames.emplace_back(to_string(p));
  t.insert("passes", to_array(pnames));
  t.insert("trials", mc.trials);
  t.insert("batch", mc.batch);
  t.insert("heads", mc.heads);
  t.insert("distribution", std::string(to_string(mc.distribution)));
  t.insert("outlier_fraction", mc.outlier_fraction);
  t.insert("outlier_scale", mc.outlier_scale);
  t.insert("sink_logit", mc.sink_logit);
  if (mc.repeated_keys != MicrobenchSweep{}.repeated_keys) t.insert("repeated_keys", mc.repeated_keys);
  if (!mc.captured_variant.empty()) {
    t.insert("captured_variant", mc.captured_variant);
    t.insert("captured_step", mc.captured_step);
    t.insert("captured_layer", mc.captured_layer);
    t.insert("captured_batch", mc.captured_batch);
  }
  t.insert("seed", static_cast<std::int64_t>(mc.seed));
  // Keys whose default is "none" appear only when set (an empty array does not parse back).
  if (!rnames.empty()) t.insert("roundings", to_array(rnames));
  // The real-kernel keys only when set, so a grid without them keeps its hash.
  if (mc.devices != std::vector<std::string>{"cpu"}) t.insert("devices", to_array(mc.devices));
  if (!mc.framework.empty()) t.insert("framework", to_array(mc.framework));
  if (!mc.input_file.empty()) t.insert("input_file", mc.input_file);
  if (mc.save_outputs) t.insert("save_outputs", true);
  if (mc.launch == Launch::pytorch) {
    t.insert("launch", std::string(to_string(mc.launch)));
    t.insert("sm_count", mc.sm_count);
  } else if (mc.sram.empty()) {
    t.insert("blocks", blocks);
  } else {
    t.insert("sram", to_array(mc.sram));
    t.insert("tile_rules", to_array(mc.tile_rules));
  }
  return t;
}

std::string to_toml_text(const toml::table& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

// Every value of a resolved configuration by its place ("train.lr", "grid.vary[1].matmul",
// "microbench.sweeps[0].formats"), as TOML text, in the order of the text: tables and arrays of
// tables are walked, any other array is one value.
void flatten(const toml::table& t, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
  for (auto&& [k, v] : t) {
    const std::string key = prefix + std::string(k.str());
    if (const toml::table* sub = v.as_table()) {
      flatten(*sub, key + ".", out);
    } else if (const toml::array* arr = v.as_array(); arr && !arr->empty() && arr->is_array_of_tables()) {
      for (std::size_t i = 0; i < arr->size(); ++i)
        flatten(*arr->get(i)->as_table(), key + "[" + std::to_string(i) + "].", out);
    } else {
      std::ostringstream os;
      v.visit([&](const auto& value) { os << value; });
      out.emplace_back(key, os.str());
    }
  }
}

}  // namespace

std::vector<std::string> configuration_differences(const Study& before, const Study& after) {
  std::vector<std::pair<std::string, std::string>> a, b;
  flatten(toml::parse(before.resolved_toml), "", a);
  flatten(toml::parse(after.resolved_toml), "", b);
  const std::map<std::string, std::string> old_values(a.begin(), a.end()), new_values(b.begin(), b.end());
  std::vector<std::string> out;
  auto describe = [](const std::string& key, const std::string* was, const std::string* now) {
    return key + ": " + (was ? *was : std::string("(unset)")) + " -> " + (now ? *now : std::string("(unset)"));
  };
  for (const auto& [key, now] : b) {
    if (key == "study.out") continue;  // where the grid said the study lives, not what it computes
    const auto it = old_values.find(key);
    if (it == old_values.end() || it->second != now) out.push_back(describe(key, it == old_values.end() ? nullptr : &it->second, &now));
  }
  for (const auto& [key, was] : a)
    if (key != "study.out" && !new_values.count(key)) out.push_back(describe(key, &was, nullptr));
  return out;
}

std::string content_hash(const std::string& text) {
  const std::uint64_t h = fnv1a64(text);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

namespace config_detail {

std::string variant_toml(const Variant& var) {
  toml::table vt{{"variant", toml::table{{"id", var.id},
                                         {"attention", var.attention_name()},
                                         {"precision", std::string(to_string(var.precision))},
                                         {"seed", static_cast<std::int64_t>(var.seed)},
                                         {"init", std::string(to_string(var.init))}}},
                 {"model", model_table(var.model)},
                 {"data", data_table(var.data)},
                 {"train", train_table(var.train)},
                 {"attention", attention_table(var.attention_cfg)}};
  // Only where it differs from the arithmetic the trainer always ran: other variants' hashes unchanged.
  if (!var.numerics.is_default()) vt.insert("numerics", numerics_table(var.numerics));
  return to_toml_text(vt);
}

namespace {

// [reduce] pairs, only where it is not the default (the verdict's): other studies' hashes unchanged.
void add_reduce_pairs(const ReduceConfig& rc, toml::table& resolved) {
  toml::table& red = *resolved["reduce"].as_table();
  if (!rc.pair_list.empty()) {
    toml::array list;
    for (const auto& [a, b] : rc.pair_list) list.push_back(toml::array{a, b});
    red.insert("pairs", list);
  } else if (rc.pairs != "verdict") {
    red.insert("pairs", rc.pairs);
  }
}

}  // namespace

std::string resolved_study_toml(const Study& st) {
  const ReduceConfig& rc = st.reduce;
  toml::array steps;
  for (auto s : rc.steps) steps.push_back(s);
  toml::array sweeps;
  for (const auto& sw : st.microbench.sweeps) sweeps.push_back(sweep_table(sw));
  if (st.imported()) {
    toml::table resolved{{"study", study_table(st)},
                         {"reduce", toml::table{{"metrics", to_array(rc.metrics)},
                                                {"per_tensor", rc.per_tensor},
                                                {"whole_model", rc.whole_model}}}};
    if (!steps.empty()) resolved["reduce"].as_table()->insert("steps", steps);
    add_reduce_pairs(rc, resolved);
    add_import_tables(st, resolved);
    return to_toml_text(resolved) + grid_toml(st);
  }
  toml::table resolved{
      {"study", study_table(st)},
      {"model", model_table(st.model)},
      {"data", data_table(st.data)},
      {"train", train_table(st.train)},
      {"attention", attention_table(st.attention)},
      {"microbench", toml::table{{"sweeps", sweeps}}},
      {"reduce", toml::table{{"metrics", to_array(rc.metrics)},
                             {"per_tensor", rc.per_tensor},
                             {"whole_model", rc.whole_model}}}};
  if (!steps.empty()) resolved["reduce"].as_table()->insert("steps", steps);
  add_reduce_pairs(rc, resolved);
  if (!st.numerics.is_default()) resolved.insert("numerics", numerics_table(st.numerics));
  // [grid] after the rest, in the file's order (grid_toml).
  return to_toml_text(resolved) + grid_toml(st);
}

}  // namespace config_detail
}  // namespace fastudy
