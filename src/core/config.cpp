// grid.toml -> Study: strict parsing (toml++), validation with file:line:col messages, defaults, and
// expansion of [grid] into variants with stable ids and content hashes.
//
// Every section is read through a Section, which remembers the keys it consumed; whatever is left is
// an unknown key, reported with a "did you mean" suggestion. Validation that spans keys (d_model vs
// heads, block sizes vs seq_len) runs after all sections are read, pointing at the offending key.
#include "src/core/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "base/hash.hpp"
#include "base/number.hpp"
#include "fastudy/version.hpp"  // FASTUDY_TORCH_SDPA, FASTUDY_TORCH_VERSION
#include "src/core/capabilities.hpp"

namespace fastudy {

namespace {

std::string format_location(const std::string& file, int line, int column) {
  std::ostringstream os;
  os << file;
  if (line > 0) {
    os << ':' << line;
    if (column > 0) os << ':' << column;
  }
  return os.str();
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string join(const std::vector<std::string>& items, const std::string& sep = ", ") {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

// "did you mean `d_model`?" when a known word is close enough to be a typo.
std::string suggestion(const std::string& word, const std::vector<std::string>& known) {
  for (const auto& k : known)  // a truncated or extended word ("accumulator" for "accum")
    if (k.size() >= 3 && word.size() >= 3 && (word.rfind(k, 0) == 0 || k.rfind(word, 0) == 0))
      return "did you mean `" + k + "`?";
  std::string best;
  std::size_t best_d = std::string::npos;
  for (const auto& k : known) {
    std::size_t d = edit_distance(word, k);
    if (d < best_d) best_d = d, best = k;
  }
  if (!best.empty() && best_d <= std::max<std::size_t>(2, word.size() / 3)) return "did you mean `" + best + "`?";
  return "";
}

// The words of an enum's values, in order (its name table read through to_string).
template <class E, std::size_t N>
std::vector<std::string> words(const E (&all)[N]) {
  std::vector<std::string> out;
  for (E e : all) out.emplace_back(to_string(e));
  return out;
}

const std::vector<std::string> kSdpaWords = words(kSdpaKinds);
// fastudy's kernels, and LibTorch's SDPA backends where this build's LibTorch has them.
const std::vector<std::string> kAttentionKinds = [] {
  std::vector<std::string> kinds{"baseline", "flash"};
  if (FASTUDY_TORCH_SDPA) kinds.insert(kinds.end(), kSdpaWords.begin(), kSdpaWords.end());
  return kinds;
}();
const std::vector<std::string> kDevices = words(kAllDevices);
const std::vector<std::string> kArithmetics = words(kAllArithmetics);
const std::vector<std::string> kInits = words(kAllInitSchemes);
const std::vector<std::string> kTrainFormats{"fp64", "fp32", "tf32", "bf16", "fp16"};
const std::vector<std::string> kLoopOrders{"kv_outer", "q_outer"};
const std::vector<std::string> kDataKinds = words(kAllDataKinds);
const std::vector<std::string> kSchedules = words(kAllSchedules);
const std::vector<std::string> kAllreduceOrders = words(kAllReduceOrders);
const std::vector<std::string> kTileRules{"paper", "swapped", "square"};
const std::vector<std::string> kMatmuls = words(kAllMatmulArithmetics);
const std::vector<std::string> kLayerNorms = words(kAllLayerNormAlgorithms);
const std::vector<std::string> kGelus = words(kAllGeluApproximations);
const std::vector<std::string> kOnOff{"off", "on"};
template <class E>
E word_to_enum(const std::vector<std::string>& words, const std::string& w) {  // w is one of words
  return static_cast<E>(std::find(words.begin(), words.end(), w) - words.begin());
}
const std::vector<std::string> kMicrobenchDevices{"cpu", "cuda"};  // [microbench] devices
const std::vector<std::string> kMetrics{"w1", "w2", "max_abs", "mean_abs", "rel_l2"};
std::vector<std::string> policy_step_names() {
  std::vector<std::string> out;
  for (const auto& step : kPolicySteps) out.emplace_back(step.name);
  return out;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& preset : kPolicyPresets) names.emplace_back(preset.name);
  return names;
}

std::vector<std::string> all_format_names() {
  std::vector<std::string> out;
  for (Format f : kAllFormats) out.emplace_back(to_string(f));
  return out;
}

// Reads one TOML table, tracks which keys were used, and turns every problem into a ConfigError.
class Section {
 public:
  Section(const std::string& file, std::string name, const toml::table* table, const toml::source_region& where)
      : file_(file), name_(std::move(name)), table_(table), where_(where) {}

  const std::string& name() const { return name_; }
  bool present() const { return table_ != nullptr; }
  const toml::table* table() const { return table_; }

  [[noreturn]] void fail(const std::string& key, const std::string& message, const std::string& hint = {}) const {
    const toml::node* n = node(key);
    const auto& src = n ? n->source() : where_;
    throw ConfigError(file_, static_cast<int>(src.begin.line), static_cast<int>(src.begin.column), qualified(key),
                      message, hint);
  }

  std::string qualified(const std::string& key) const { return name_.empty() ? key : name_ + "." + key; }

  const toml::node* node(const std::string& key) const { return table_ ? table_->get(key) : nullptr; }

  bool has(const std::string& key) {
    used_.insert(key);
    return node(key) != nullptr;
  }

  void get(const std::string& key, std::string& out) {
    if (!has(key)) return;
    auto v = node(key)->value<std::string>();
    if (!node(key)->is_string() || !v) fail(key, "`" + qualified(key) + "` must be a string", "write it in quotes: " + key + " = \"...\"");
    out = *v;
  }
  void get(const std::string& key, bool& out) {
    if (!has(key)) return;
    if (!node(key)->is_boolean()) fail(key, "`" + qualified(key) + "` must be true or false");
    out = *node(key)->value<bool>();
  }
  void get(const std::string& key, std::int64_t& out) {
    if (!has(key)) return;
    if (!node(key)->is_integer()) fail(key, "`" + qualified(key) + "` must be an integer (got " + type_name(*node(key)) + ")");
    out = *node(key)->value<std::int64_t>();
  }
  void get(const std::string& key, int& out) {
    std::int64_t v = out;
    get(key, v);
    if (v < INT32_MIN || v > INT32_MAX) fail(key, "`" + qualified(key) + "` = " + std::to_string(v) + " is out of range");
    out = static_cast<int>(v);
  }
  void get(const std::string& key, std::uint64_t& out) {
    std::int64_t v = static_cast<std::int64_t>(out);
    get(key, v);
    if (v < 0) fail(key, "`" + qualified(key) + "` must be >= 0 (got " + std::to_string(v) + ")");
    out = static_cast<std::uint64_t>(v);
  }
  void get(const std::string& key, double& out) {
    if (!has(key)) return;
    const toml::node* n = node(key);
    if (!n->is_number()) fail(key, "`" + qualified(key) + "` must be a number (got " + type_name(*n) + ")");
    out = *n->value<double>();
    if (!std::isfinite(out)) fail(key, "`" + qualified(key) + "` must be finite");
  }

  const toml::array* array(const std::string& key) {
    if (!has(key)) return nullptr;
    const toml::array* a = node(key)->as_array();
    if (!a) fail(key, "`" + qualified(key) + "` must be an array (got " + type_name(*node(key)) + ")",
                 "write it as " + key + " = [ ... ]");
    if (a->empty()) fail(key, "`" + qualified(key) + "` is empty", "give at least one value");
    return a;
  }

  // An array of strings, each one of `allowed` (if given), without duplicates.
  void get_words(const std::string& key, std::vector<std::string>& out, const std::vector<std::string>& allowed) {
    const toml::array* a = array(key);
    if (!a) return;
    out.clear();
    for (const auto& el : *a) {
      auto s = el.value<std::string>();
      if (!el.is_string() || !s) fail_at(el, key, "`" + qualified(key) + "` must hold strings (got " + type_name(el) + ")");
      if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), *s) == allowed.end())
        fail_at(el, key, "`" + qualified(key) + "` has unknown value \"" + *s + "\"; allowed: " + join(allowed),
                suggestion(*s, allowed));
      if (std::find(out.begin(), out.end(), *s) != out.end())
        fail_at(el, key, "`" + qualified(key) + "` lists \"" + *s + "\" twice", "remove the duplicate");
      out.push_back(*s);
    }
  }

  void get_ints(const std::string& key, std::vector<int>& out, std::int64_t min_value) {
    const toml::array* a = array(key);
    if (!a) return;
    out.clear();
    for (const auto& el : *a) {
      if (!el.is_integer()) fail_at(el, key, "`" + qualified(key) + "` must hold integers (got " + type_name(el) + ")");
      std::int64_t v = *el.value<std::int64_t>();
      if (v < min_value || v > INT32_MAX)
        fail_at(el, key, "`" + qualified(key) + "` value " + std::to_string(v) + " must be >= " + std::to_string(min_value));
      if (std::find(out.begin(), out.end(), static_cast<int>(v)) != out.end())
        fail_at(el, key, "`" + qualified(key) + "` lists " + std::to_string(v) + " twice", "remove the duplicate");
      out.push_back(static_cast<int>(v));
    }
  }

  // Every key that was not consumed is an error.
  void finish(const std::vector<std::string>& known_hint = {}) const {
    if (!table_) return;
    for (auto&& [k, v] : *table_) {
      std::string key(k.str());
      if (used_.count(key)) continue;
      std::set<std::string> known_set(used_.begin(), used_.end());
      known_set.insert(known_hint.begin(), known_hint.end());
      std::vector<std::string> known(known_set.begin(), known_set.end());
      std::string hint = suggestion(key, known);
      if (hint.empty()) hint = "known keys in [" + name_ + "]: " + join(known);
      throw ConfigError(file_, static_cast<int>(k.source().begin.line), static_cast<int>(k.source().begin.column),
                        qualified(key), "unknown key `" + key + "` in [" + name_ + "]", hint);
    }
  }

  [[noreturn]] void fail_at(const toml::node& n, const std::string& key, const std::string& message,
                            const std::string& hint = {}) const {
    throw ConfigError(file_, static_cast<int>(n.source().begin.line), static_cast<int>(n.source().begin.column),
                      qualified(key), message, hint);
  }

  static std::string type_name(const toml::node& n) {
    switch (n.type()) {
      case toml::node_type::string: return "a string";
      case toml::node_type::integer: return "an integer";
      case toml::node_type::floating_point: return "a float";
      case toml::node_type::boolean: return "a boolean";
      case toml::node_type::array: return "an array";
      case toml::node_type::table: return "a table";
      default: return "a date/time";
    }
  }

 private:
  const std::string& file_;
  std::string name_;
  const toml::table* table_;
  toml::source_region where_;
  std::set<std::string> used_;
};

void require(bool ok, Section& s, const std::string& key, const std::string& message, const std::string& hint = {}) {
  if (!ok) s.fail(key, message, hint);
}

// A word-valued key of a section (`current` when absent): one of `allowed`, else a ConfigError naming
// the key with the allowed words and the nearest one.
std::string read_word(Section& s, const std::string& key, const std::vector<std::string>& allowed,
                      const std::string& current) {
  std::string w = current;
  s.get(key, w);
  require(std::find(allowed.begin(), allowed.end(), w) != allowed.end(), s, key,
          "[" + s.name() + "] " + key + " = \"" + w + "\" is unknown; allowed: " + join(allowed), suggestion(w, allowed));
  return w;
}


// ---- the grid axes: one row each ------------------------------------------------------------------
// A row says everything fastudy does with an axis: its name in [grid]; the type of its values; the
// values it allows (word axes; from the study, since `policy` allows the study's custom policies);
// the smallest value (integer axes) and whether a value may not exceed [model] seq_len; the fragment
// it adds to a variant id (prefix + value: "s1"; no prefix: the value itself); and how a value
// applies to a variant. Validation (read_grid), expansion and ids (expand_variants), the resolved
// TOML with typed values (resolved_study_toml) and through it the content hash, and the checkpoint
// attributes (Variant::axes) all read this table: a new axis is one row here plus its test.
enum class AxisType { word, integer, real };
struct GridAxis {
  const char* name;
  const char* example;       // two allowed values, as TOML (for --help, the README and the table's test)
  AxisType type;
  AxisRole role;
  const char* baseline;      // the declared baseline value ("": the first value the grid lists)
  bool replicate;            // a replicate axis: not part of the condition other axes are compared under
  const char* id_prefix;
  std::vector<std::string> (*allowed)(const std::vector<std::string>& policy_names);  // word axes
  std::int64_t min_value;    // integer axes (real axes: values must be > 0)
  bool at_most_seq_len;      // integer axes: a block size
  std::string (*unknown_hint)(const std::string& value);  // word axes: a hint for a value not allowed (null: none)
  void (*apply)(Variant& var, const std::string& value);
};

const GridAxis kGridAxes[] = {
    {"attention", R"(["baseline", "flash"])", AxisType::word, AxisRole::optimisation, "baseline", false, "", [](const auto&) { return kAttentionKinds; }, 0, false,
     [](const std::string& x) {
       return !parse_sdpa_backend(x)
                  ? std::string()
                  : x + " is LibTorch's scaled_dot_product_attention, which needs LibTorch >= 2.3; this build links LibTorch " +
                        FASTUDY_TORCH_VERSION + " (build against a newer LibTorch: README \"GPU\")";
     },
     [](Variant& v, const std::string& x) {
       v.sdpa = parse_sdpa_backend(x).value_or(SdpaBackend::none);
       if (v.sdpa == SdpaBackend::none) v.attention = *parse_attention_kind(x);
     }},
    {"arithmetic", R"(["emulated", "native"])", AxisType::word, AxisRole::optimisation, "emulated", false, "", [](const auto&) { return kArithmetics; }, 0, false, nullptr,
     [](Variant& v, const std::string& x) { v.train.arithmetic = word_to_enum<Arithmetic>(kArithmetics, x); }},
    {"precision", R"(["fp32", "bf16"])", AxisType::word, AxisRole::reference, "fp32", false, "", [](const auto&) { return kTrainFormats; }, 0, false,
     [](const std::string& x) {
       return x.rfind("fp8", 0) == 0 ? std::string("fp8 formats are for the microbenchmark only ([microbench] formats)")
                                     : std::string();
     },
     [](Variant& v, const std::string& x) { v.precision = *parse_format(x); }},
    {"seed", R"([1, 2])", AxisType::integer, AxisRole::reference, "", true, "s", nullptr, 0, false, nullptr,
     [](Variant& v, const std::string& x) { v.seed = std::stoull(x); }},
    {"init", R"(["normal", "scaled"])", AxisType::word, AxisRole::setting, "", false, "", [](const auto&) { return kInits; }, 0, false, nullptr,
     [](Variant& v, const std::string& x) { v.init = word_to_enum<InitScheme>(kInits, x); }},
    {"data_seed", R"([3, 4])", AxisType::integer, AxisRole::setting, "", true, "d", nullptr, 0, false, nullptr,
     [](Variant& v, const std::string& x) { v.data.seed = std::stoull(x); }},
    {"policy", R"(["eager", "mixed"])", AxisType::word, AxisRole::optimisation, "", false, "", [](const auto& policies) { return policies; }, 0, false, nullptr,
     [](Variant& v, const std::string& x) { v.attention_cfg.policy = x; }},
    {"block_q", R"([8, 16])", AxisType::integer, AxisRole::optimisation, "", false, "bq", nullptr, 1, true, nullptr,
     [](Variant& v, const std::string& x) { v.attention_cfg.block_q = std::stoi(x); }},
    {"block_kv", R"([8, 16])", AxisType::integer, AxisRole::optimisation, "", false, "bkv", nullptr, 1, true, nullptr,
     [](Variant& v, const std::string& x) { v.attention_cfg.block_kv = std::stoi(x); }},
    {"loop_order", R"(["kv_outer", "q_outer"])", AxisType::word, AxisRole::optimisation, "", false, "", [](const auto&) { return kLoopOrders; }, 0, false, nullptr,
     [](Variant& v, const std::string& x) { v.attention_cfg.loop_order = *parse_loop_order(x); }},
    // [numerics]: the arithmetic optimisations of the training model (src/train/model.hpp); each baseline
    // is the [numerics] default, the arithmetic the trainer always ran. split_k is checked against the
    // model's shortest reduction in read_grid.
    {"matmul", R"(["fp32", "bf16x3"])", AxisType::word, AxisRole::optimisation, "fp32", false, "mm_", [](const auto&) { return kMatmuls; }, 0, false, nullptr,
     [](Variant& v, const std::string& x) { v.numerics.matmul = word_to_enum<MatmulArithmetic>(kMatmuls, x); }},
    {"split_k", R"([1, 2])", AxisType::integer, AxisRole::optimisation, "1", false, "sk", nullptr, 1, false, nullptr,
     [](Variant& v, const std::string& x) { v.numerics.split_k = std::stoi(x); }},
    {"layernorm", R"(["torch", "welford"])", AxisType::word, AxisRole::optimisation, "torch", false, "ln_", [](const auto&) { return kLayerNorms; }, 0, false, nullptr,
     [](Variant& v, const std::string& x) { v.numerics.layernorm = word_to_enum<LayerNormAlgorithm>(kLayerNorms, x); }},
    {"gelu", R"(["erf", "tanh"])", AxisType::word, AxisRole::optimisation, "erf", false, "gelu_", [](const auto&) { return kGelus; }, 0, false, nullptr,
     [](Variant& v, const std::string& x) { v.numerics.gelu = word_to_enum<GeluApproximation>(kGelus, x); }},
    {"recompute", R"(["off", "on"])", AxisType::word, AxisRole::optimisation, "off", false, "recompute_", [](const auto&) { return kOnOff; }, 0, false, nullptr,
     [](Variant& v, const std::string& x) { v.numerics.recompute = x == "on"; }},
    {"lr", R"([0.001, 0.002])", AxisType::real, AxisRole::setting, "", false, "lr", nullptr, 0, false, nullptr,
     [](Variant& v, const std::string& x) {
       v.train.lr = std::stod(x);
       v.train.min_lr = std::min(v.train.min_lr, v.train.lr);
     }},
    // The training-loop axes (README "Training-loop axes"; cross-checked per variant by check_loop_axes).
    {"dp_width", R"([1, 4])", AxisType::integer, AxisRole::optimisation, "1", false, "dp", nullptr, 1, false, nullptr,
     [](Variant& v, const std::string& x) { v.train.dp_width = std::stoi(x); }},
    {"allreduce", R"(["rank", "tree"])", AxisType::word, AxisRole::optimisation, "rank", false, "", [](const auto&) { return kAllreduceOrders; }, 0, false, nullptr,
     [](Variant& v, const std::string& x) { v.train.allreduce = word_to_enum<ReduceOrder>(kAllreduceOrders, x); }},
    {"grad_accum", R"([1, 2])", AxisType::integer, AxisRole::optimisation, "1", false, "ga", nullptr, 1, false, nullptr,
     [](Variant& v, const std::string& x) { v.train.grad_accum = std::stoi(x); }},
    {"repeat", R"([0, 1])", AxisType::integer, AxisRole::noise, "0", true, "r", nullptr, 0, false, nullptr,
     [](Variant& v, const std::string& x) { v.train.repeat = std::stoi(x); }},
};

}  // namespace

std::vector<GridAxisInfo> grid_axes() {
  std::vector<GridAxisInfo> out;
  for (const auto& axis : kGridAxes) out.push_back({axis.name, axis.example, axis.role, axis.baseline, axis.replicate});
  return out;
}

const GridAxisInfo* find_grid_axis(const std::string& name) {
  static const std::vector<GridAxisInfo> table = grid_axes();
  for (const auto& axis : table)
    if (axis.name == name) return &axis;
  return nullptr;
}

const char* axis_role_name(AxisRole role) {
  switch (role) {
    case AxisRole::optimisation: return "optimisation";
    case AxisRole::reference: return "reference";
    case AxisRole::setting: return "setting";
    case AxisRole::noise: return "noise";
  }
  return "setting";
}

namespace {

const GridAxis* find_axis(const std::string& name) {
  for (const auto& axis : kGridAxes)
    if (axis.name == name) return &axis;
  return nullptr;
}

// The token an axis value contributes to a variant id.
std::string id_token(const std::string& axis, const std::string& value) { return find_axis(axis)->id_prefix + value; }

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
    for (const auto& [name, custom] : a.custom_policies) {
      toml::table p{{"preset", custom.preset}, {"rounding", std::string(to_string(custom.rounding))}};
      for (const auto& [step, f] : custom.steps) p.insert(step, std::string(to_string(f)));
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

// The fields of one microbenchmark sweep, from [microbench] or one [[microbench.sweeps]] table.
void read_sweep(Section& mb, MicrobenchSweep& mc, const std::vector<std::string>& policy_names) {
  const std::string sec = "[" + mb.name() + "] ";
  std::vector<std::string> formats;
  mb.get_words("formats", formats, all_format_names());
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
    for (const auto& el : *blocks) {
      const toml::array* pair = el.as_array();
      if (!pair || pair->size() != 2 || !(*pair)[0].is_integer() || !(*pair)[1].is_integer())
        mb.fail_at(el, "blocks", sec + "blocks must be a list of [block_q, block_kv] integer pairs",
                   "e.g. blocks = [[16, 16], [32, 64]]");
      int bq = static_cast<int>(*(*pair)[0].value<std::int64_t>());
      int bkv = static_cast<int>(*(*pair)[1].value<std::int64_t>());
      if (bq < 1 || bkv < 1) mb.fail_at(el, "blocks", sec + "block sizes must be >= 1");
      if (std::find(mc.blocks.begin(), mc.blocks.end(), std::make_pair(bq, bkv)) != mc.blocks.end())
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
  mb.get("captured_variant", mc.captured_variant);
  mb.get("captured_step", mc.captured_step);
  mb.get("captured_layer", mc.captured_layer);
  mb.get("captured_batch", mc.captured_batch);
  mb.get("seed", mc.seed);
  mb.get_words("devices", mc.devices, kMicrobenchDevices);
  mb.get_words("framework", mc.framework, kSdpaWords);
  require(mc.trials >= 1, mb, "trials", sec + "trials must be >= 1");
  require(mc.batch >= 1, mb, "batch", sec + "batch must be >= 1");
  require(mc.heads >= 1, mb, "heads", sec + "heads must be >= 1");
  const std::vector<std::string> distributions = words(kAllInputDistributions);
  require(std::find(distributions.begin(), distributions.end(), distribution) != distributions.end(), mb,
          "distribution", sec + "distribution = \"" + distribution + "\" is unknown; allowed: " + join(distributions),
          suggestion(distribution, distributions));
  mc.distribution = *parse_input_distribution(distribution);
  require(mc.outlier_fraction >= 0 && mc.outlier_fraction <= 1, mb, "outlier_fraction",
          sec + "outlier_fraction must be in [0, 1]");
  require(mc.outlier_scale > 0, mb, "outlier_scale", sec + "outlier_scale must be > 0");
  require(mc.sink_logit > 0, mb, "sink_logit", sec + "sink_logit must be > 0",
          "the logit of the sink key for every query, e.g. sink_logit = 10");
  require(mc.distribution != InputDistribution::captured || !mc.captured_variant.empty(), mb, "distribution",
          sec + "distribution = \"captured\" needs captured_variant (the variant whose checkpoint to read)",
          "add captured_variant = \"ID\" (and captured_step, captured_layer, captured_batch)");
  require(mc.captured_step >= 0, mb, "captured_step", sec + "captured_step must be >= 0 (0: the last step)");
  require(mc.captured_layer >= 0, mb, "captured_layer", sec + "captured_layer must be >= 0");
  require(mc.captured_batch >= 0, mb, "captured_batch", sec + "captured_batch must be >= 0");
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
  if (mc.sram.empty()) {
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

}  // namespace

ConfigError::ConfigError(std::string file, int line, int column, std::string key, const std::string& message,
                         std::string hint)
    : std::runtime_error(format_location(file, line, column) + ": " + message + (hint.empty() ? "" : "\nhint: " + hint)),
      file_(std::move(file)),
      line_(line),
      column_(column),
      key_(std::move(key)) {}

const std::string& Variant::axis(const std::string& name) const {
  static const std::string empty;
  for (const auto& [k, v] : axes)
    if (k == name) return v;
  return empty;
}

bool Study::has_phase(const std::string& p) const { return std::find(phases.begin(), phases.end(), p) != phases.end(); }

const Variant* Study::find_variant(const std::string& id) const {
  for (const auto& v : variants)
    if (v.id == id) return &v;
  return nullptr;
}

const std::vector<std::string>& known_axes() {
  static const std::vector<std::string> axes = [] {
    std::vector<std::string> names;
    for (const auto& axis : kGridAxes) names.emplace_back(axis.name);
    return names;
  }();
  return axes;
}

std::string Variant::attention_name() const {
  return sdpa == SdpaBackend::none ? std::string(fastudy::to_string(attention)) : std::string(fastudy::to_string(sdpa));
}

bool NumericsConfig::is_default() const {
  const NumericsConfig d;
  return matmul == d.matmul && split_k == d.split_k && layernorm == d.layernorm && gelu == d.gelu &&
         recompute == d.recompute;
}

int max_split_k(const ModelConfig& m) { return std::min({m.d_model, m.vocab, m.seq_len}); }

const std::vector<std::string>& known_phases() {
  static const std::vector<std::string> phases{"microbench", "train", "reduce", "report"};
  return phases;
}

std::string content_hash(const std::string& text) {
  const std::uint64_t h = fnv1a64(text);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

PrecisionPolicy resolve_policy(const AttentionConfig& cfg, const std::string& name, Format f) {
  auto it = cfg.custom_policies.find(name);
  if (it == cfg.custom_policies.end()) return make_policy(name, f);
  // A custom policy starts from its preset in the variant's format and overrides the steps it names.
  PrecisionPolicy p = make_policy(it->second.preset, f);
  p.name = name;
  p.rounding = it->second.rounding;
  for (const auto& [step, fmt] : it->second.steps) p.*(find_policy_step(step)->member) = fmt;  // names checked on parse
  return p;
}

Study load_study(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path, 0, 0, "", "cannot open the grid file", "check the path; `fastudy --help` shows the usage");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ConfigError(path, 0, 0, "", "cannot read the grid file");
  return parse_study(ss.str(), path);
}

namespace {

// ---- parse_study, one function per section of grid.toml ---------------------------------------

// The table [name] of the file (an absent one reads as empty; anything but a table is an error).
Section open_section(const toml::table& root, const std::string& file, const std::string& name) {
  static const toml::source_region top{};
  const toml::node* n = root.get(name);
  if (n && !n->is_table())
    throw ConfigError(file, static_cast<int>(n->source().begin.line), static_cast<int>(n->source().begin.column),
                      name, "`" + name + "` must be a table: write [" + name + "] on its own line");
  return Section(file, name, n ? n->as_table() : nullptr, n ? n->source() : top);
}

void check_top_level(const toml::table& root, const std::string& file) {
  const std::vector<std::string> sections{"study",   "grid",      "model",      "data",  "train",
                                          "attention", "numerics", "microbench", "reduce"};
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
  require(!st.name.empty() && st.name.find_first_of("/\\ \t") == std::string::npos, study, "name",
          "[study] name \"" + st.name + "\" must be non-empty, without spaces or slashes", "use e.g. name = \"quick\"");
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
  require(std::find(kDataKinds.begin(), kDataKinds.end(), kind) != kDataKinds.end(), data, "kind",
          "[data] kind = \"" + kind + "\" is unknown; allowed: " + join(kDataKinds), suggestion(kind, kDataKinds));
  d.kind = word_to_enum<DataKind>(kDataKinds, kind);
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
  t.device = word_to_enum<Device>(kDevices, read_word(train, "device", kDevices, to_string(t.device)));
  t.arithmetic = word_to_enum<Arithmetic>(kArithmetics, read_word(train, "arithmetic", kArithmetics, to_string(t.arithmetic)));
  require(t.steps >= 1, train, "steps", "[train] steps = " + std::to_string(t.steps) + " must be >= 1");
  require(t.batch >= 1, train, "batch", "[train] batch must be >= 1");
  require(t.lr > 0, train, "lr", "[train] lr must be > 0");
  require(t.min_lr >= 0 && t.min_lr <= t.lr, train, "min_lr", "[train] min_lr must be in [0, lr]");
  require(t.warmup >= 0 && t.warmup <= t.steps, train, "warmup", "[train] warmup must be in [0, steps]");
  require(std::find(kSchedules.begin(), kSchedules.end(), schedule) != kSchedules.end(), train, "schedule",
          "[train] schedule = \"" + schedule + "\" is unknown; allowed: " + join(kSchedules), suggestion(schedule, kSchedules));
  t.schedule = word_to_enum<Schedule>(kSchedules, schedule);
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
  require(std::find(kAllreduceOrders.begin(), kAllreduceOrders.end(), allreduce) != kAllreduceOrders.end(), train,
          "allreduce", "[train] allreduce = \"" + allreduce + "\" is not a reduction order; allowed: " + join(kAllreduceOrders),
          suggestion(allreduce, kAllreduceOrders));
  t.allreduce = word_to_enum<ReduceOrder>(kAllreduceOrders, allreduce);
  require(t.grad_accum >= 1, train, "grad_accum",
          "[train] grad_accum = " + std::to_string(t.grad_accum) + " must be >= 1 (micro-batches per shard)",
          "1 computes each shard's gradient in one pass");
  require(t.repeat >= 0, train, "repeat", "[train] repeat = " + std::to_string(t.repeat) + " must be >= 0",
          "repeat only labels a copy of the variant: 0, 1, 2, ...");
  train.finish();
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
      for (const auto& step : keys) {
        std::string fmt;
        ps.get(step, fmt);
        if (fmt.empty()) continue;
        auto f = parse_format(fmt);
        if (!f) ps.fail(step, "unknown format \"" + fmt + "\"; allowed: " + format_names(), suggestion(fmt, all_format_names()));
        custom.steps[step] = *f;
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
      keys.push_back("preset");
      keys.push_back("rounding");
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
  auto word = [&](const std::string& key, const std::vector<std::string>& allowed, const std::string& current) {
    if (num.has(key) && num.node(key)->is_boolean())
      num.fail(key, "`[numerics] " + key + "` must be a word, not a boolean", "write " + key + " = \"on\" or \"off\"");
    return read_word(num, key, allowed, current);
  };
  n.matmul = word_to_enum<MatmulArithmetic>(kMatmuls, word("matmul", kMatmuls, to_string(n.matmul)));
  n.layernorm = word_to_enum<LayerNormAlgorithm>(kLayerNorms, word("layernorm", kLayerNorms, to_string(n.layernorm)));
  n.gelu = word_to_enum<GeluApproximation>(kGelus, word("gelu", kGelus, to_string(n.gelu)));
  n.recompute = word("recompute", kOnOff, n.recompute ? "on" : "off") == "on";
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

// The real-kernel keys of a finished sweep (devices, framework; README "Real kernels"): what the kernels
// or this build cannot run (capabilities.hpp), refused at load. `own` is the sweep's table, `base`
// [microbench] (a key the sweep inherits is reported where it was written).
void check_real_kernels(Section& own, Section& base, const MicrobenchSweep& mc) {
  const std::optional<SweepProblem> problem = real_kernel_problem(mc);
  if (!problem) return;
  Section& at = own.node(problem->key) || !base.node(problem->key) ? own : base;
  const std::string sec = "[" + own.name() + "] " + (own.name() == "microbench" ? "" : "'" + mc.name + "': ");
  at.fail(problem->key, sec + problem->message, problem->hint);
}

void read_microbench(Section mb, MicrobenchConfig& mbc, const std::vector<std::string>& policy_names,
                     const std::string& file) {
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
      read_sweep(ss, sw, policy_names);
      check_real_kernels(ss, mb, sw);
      if (!names.insert(sw.name).second)
        ss.fail("name", "[[microbench.sweeps]] name \"" + sw.name + "\" is used twice", "give every sweep its own name");
      ss.finish();
      mbc.sweeps.push_back(std::move(sw));
    }
  } else {
    check_real_kernels(mb, mb, base);
    mbc.sweeps.push_back(base);
  }
  mb.finish();
}

void read_reduce(Section red, ReduceConfig& rc) {
  red.get_words("metrics", rc.metrics, kMetrics);
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
  require(std::find(rc.metrics.begin(), rc.metrics.end(), "w1") != rc.metrics.end(), red, "metrics",
          "[reduce] metrics must include \"w1\" (the ranking is built on it)");
  require(rc.per_tensor || rc.whole_model, red, "per_tensor", "[reduce] per_tensor and whole_model cannot both be false");
  red.finish();
}

// The values one grid axis lists (in `sec`, the [grid] table or one [[grid.vary]] table), validated
// against the axis's row.
std::vector<std::string> read_axis_values(Section& sec, const std::string& axis, const toml::node& v,
                                          const std::vector<std::string>& policy_names, const ModelConfig& m) {
  const GridAxis& row = *find_axis(axis);
  std::vector<std::string> values;
  switch (row.type) {
    case AxisType::word: {
      const std::vector<std::string> allowed = row.allowed(policy_names);
      sec.get_words(axis, values, {});
      for (std::size_t i = 0; i < values.size(); ++i) {
        if (std::find(allowed.begin(), allowed.end(), values[i]) != allowed.end()) continue;
        std::string hint = row.unknown_hint ? row.unknown_hint(values[i]) : std::string();
        if (hint.empty()) hint = suggestion(values[i], allowed);
        sec.fail_at(*v.as_array()->get(i), axis,
                    "`" + sec.qualified(axis) + "` has unknown value \"" + values[i] + "\"; allowed: " + join(allowed),
                    hint);
      }
      break;
    }
    case AxisType::integer: {
      std::vector<int> ints;
      sec.get_ints(axis, ints, row.min_value);
      for (std::size_t i = 0; i < ints.size(); ++i) {
        if (axis == "split_k" && ints[i] > max_split_k(m))
          sec.fail_at(*v.as_array()->get(i), axis,
                      "[" + sec.name() + "] split_k = " + std::to_string(ints[i]) +
                          " is larger than the shortest reduction of the model's linear layers (" +
                          std::to_string(max_split_k(m)) + " = the smallest of [model] d_model, vocab and seq_len)",
                      "use split_k values <= " + std::to_string(max_split_k(m)));
        if (row.at_most_seq_len && ints[i] > m.seq_len)
          sec.fail_at(*v.as_array()->get(i), axis,
                      "[" + sec.name() + "] " + axis + " = " + std::to_string(ints[i]) + " is larger than [model] seq_len = " +
                          std::to_string(m.seq_len),
                      "use block sizes <= seq_len");
        values.push_back(std::to_string(ints[i]));
      }
      break;
    }
    case AxisType::real: {
      const toml::array* arr = sec.array(axis);
      for (const auto& el : *arr) {
        if (!el.is_number() || *el.value<double>() <= 0)
          sec.fail_at(el, axis, "[" + sec.name() + "] " + axis + " must hold positive numbers");
        std::string s = shortest_number_text(*el.value<double>());
        if (std::find(values.begin(), values.end(), s) != values.end())
          sec.fail_at(el, axis, "[" + sec.name() + "] " + axis + " lists " + s + " twice", "remove the duplicate");
        values.push_back(s);
      }
      break;
    }
  }
  return values;
}

// The entries of a table in the order of the file (toml++ tables are ordered by key).
std::vector<std::pair<const toml::key*, const toml::node*>> in_file_order(const toml::table& t) {
  std::vector<std::pair<const toml::key*, const toml::node*>> entries;
  for (auto&& [k, v] : t) entries.emplace_back(&k, &v);
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    const auto& pa = a.first->source().begin;
    const auto& pb = b.first->source().begin;
    return pa.line != pb.line ? pa.line < pb.line : pa.column < pb.column;
  });
  return entries;
}

[[noreturn]] void unknown_axis(const std::string& file, const toml::key& k, const std::string& qualified) {
  const auto& known = known_axes();
  std::string hint = suggestion(std::string(k.str()), known);
  if (hint.empty()) hint = "known axes: " + join(known);
  throw ConfigError(file, static_cast<int>(k.source().begin.line), static_cast<int>(k.source().begin.column),
                    qualified,
                    "unknown grid axis `" + std::string(k.str()) + "`" +
                        (qualified.rfind("grid.vary.", 0) == 0 ? " in a [[grid.vary]] table" : ""),
                    hint);
}

bool is_known_axis(const std::string& axis) {
  const auto& known = known_axes();
  return std::find(known.begin(), known.end(), axis) != known.end();
}

// The axes of [grid], in the order of the file, and its [[grid.vary]] tables. Study::axes gets the
// [grid] axes first, then every vary axis (in order of first appearance) with its baseline first and
// then the values the tables list.
void read_grid(Section grid, Study& st, const std::vector<std::string>& policy_names, const std::string& file) {
  if (!grid.present()) return;
  const toml::node* vary_node = nullptr;
  for (const auto& [kp, vp] : in_file_order(*grid.table())) {
    const std::string axis(kp->str());
    if (axis == "vary") {
      vary_node = vp;
      continue;
    }
    if (!is_known_axis(axis)) unknown_axis(file, *kp, "grid." + axis);
    st.axes.emplace_back(axis, read_axis_values(grid, axis, *vp, policy_names, st.model));
  }
  st.crossed_axes = st.axes.size();
  if (!vary_node) return;
  grid.has("vary");
  const toml::array* tables = vary_node->as_array();
  if (!tables || tables->empty() || !tables->is_array_of_tables())
    grid.fail("vary", "`grid.vary` must be a list of tables: write each as [[grid.vary]] followed by its axes",
              "see README \"Grids\"");
  std::map<std::string, std::size_t> where;  // vary axis -> index in st.axes
  for (std::size_t t = 0; t < tables->size(); ++t) {
    const toml::table& table = *tables->get(t)->as_table();
    Section sec(file, "grid.vary", &table, table.source());
    if (table.empty()) sec.fail("", "a [[grid.vary]] table is empty", "list the axes it varies, e.g. matmul = [\"tf32\"]");
    std::vector<std::pair<std::string, std::vector<std::string>>> arm;
    for (const auto& [kp, vp] : in_file_order(table)) {
      const std::string axis(kp->str());
      if (!is_known_axis(axis)) unknown_axis(file, *kp, "grid.vary." + axis);
      for (std::size_t a = 0; a < st.crossed_axes; ++a)
        if (st.axes[a].first == axis)
          sec.fail(axis, "axis `" + axis + "` is in [grid] and in a [[grid.vary]] table",
                   "an axis is either crossed with everything ([grid]) or varied from its baseline ([[grid.vary]])");
      std::vector<std::string> values = read_axis_values(sec, axis, *vp, policy_names, st.model);
      auto [it, fresh] = where.emplace(axis, st.axes.size());
      if (fresh) {
        const std::string declared = find_axis(axis)->baseline;
        st.axes.emplace_back(axis, std::vector<std::string>{declared.empty() ? values.front() : declared});
      }
      auto& all = st.axes[it->second].second;
      for (const auto& value : values)
        if (std::find(all.begin(), all.end(), value) == all.end()) all.push_back(value);
      arm.emplace_back(axis, std::move(values));
    }
    st.vary.push_back(std::move(arm));
  }
}

// The value lists one cross product runs over, an entry per axis of Study::axes: without [[grid.vary]]
// every axis's values; with it, one list per vary table: [grid]'s axes with all their values, the
// table's axes with the values it lists, every other vary axis at its baseline (its first value).
std::vector<std::vector<std::vector<std::string>>> grid_products(const Study& st) {
  std::vector<std::vector<std::string>> all;
  for (const auto& axis : st.axes) all.push_back(axis.second);
  if (st.vary.empty()) return {all};
  std::vector<std::vector<std::vector<std::string>>> out;
  for (const auto& arm : st.vary) {
    std::vector<std::vector<std::string>> lists;
    for (std::size_t a = 0; a < st.axes.size(); ++a) {
      if (a < st.crossed_axes) {
        lists.push_back(st.axes[a].second);
        continue;
      }
      auto it = std::find_if(arm.begin(), arm.end(), [&](const auto& e) { return e.first == st.axes[a].first; });
      lists.push_back(it != arm.end() ? it->second : std::vector<std::string>{st.axes[a].second.front()});
    }
    out.push_back(std::move(lists));
  }
  return out;
}

// The variants: the cross product of the axes (of each [[grid.vary]] table's lists), first axis
// slowest; a variant two vary tables both produce (e.g. the all-baseline one) is kept once. Ids hold
// a token per [grid] axis and one per [[grid.vary]] axis whose value is not its baseline
// ("fp32-s1", "fp32-s1-flash", "fp32-s1-dp4-tree"); two variants with the same id are an error.
void expand_variants(Study& st) {
  std::set<std::string> seen;
  std::map<std::string, std::string> ids;  // id -> the axis values it stands for
  for (const auto& lists : grid_products(st)) {
  std::vector<std::size_t> idx(st.axes.size(), 0);
  bool done = false;
  while (!done) {
    Variant var;
    var.model = st.model;
    var.data = st.data;
    var.train = st.train;
    var.attention_cfg = st.attention;
    var.numerics = st.numerics;
    std::vector<std::string> tokens;
    for (std::size_t a = 0; a < st.axes.size(); ++a) {
      const std::string& axis = st.axes[a].first;
      const std::string& value = lists[a][idx[a]];
      var.axes.emplace_back(axis, value);
      if (a < st.crossed_axes || value != st.axes[a].second.front()) tokens.push_back(id_token(axis, value));
      find_axis(axis)->apply(var, value);
    }
    var.id = tokens.empty() ? "default" : join(tokens, "-");
    std::string values;
    for (const auto& [axis, value] : var.axes) values += axis + "=" + value + " ";
    // The same variant again (from another [[grid.vary]] table) is kept once, as first produced.
    const bool fresh_variant = seen.insert(values).second;
    if (fresh_variant) {
      if (auto [it, fresh] = ids.emplace(var.id, values); !fresh)
        throw ConfigError(st.file, 0, 0, "grid",
                          "two variants get the id `" + var.id + "`: " + it->second + "and " + values,
                          "axis values that are words of another axis make ids ambiguous; rename a custom policy");
    }
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
    var.resolved_toml = to_toml_text(vt);
    var.hash = content_hash(var.resolved_toml);
    if (fresh_variant) st.variants.push_back(std::move(var));

    // Advance the odometer, last axis fastest.
    done = true;
    for (std::size_t a = st.axes.size(); a-- > 0;) {
      if (++idx[a] < lists[a].size()) {
        done = false;
        break;
      }
      idx[a] = 0;
    }
  }
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

// The whole resolved study, as TOML (its content hash is the study's hash).
std::string resolved_study_toml(const Study& st) {
  const ReduceConfig& rc = st.reduce;
  // [grid] is written by hand after the rest: toml++ orders keys, the grid keeps the file's order.
  std::ostringstream grid_text;
  grid_text << "\n[grid]\n";
  auto write_axis = [&](const std::string& axis, const std::vector<std::string>& values) {
    toml::array arr;
    const AxisType type = find_axis(axis)->type;
    for (const auto& value : values) {
      if (type == AxisType::integer) arr.push_back(std::stoll(value));
      else if (type == AxisType::real) arr.push_back(std::stod(value));
      else arr.push_back(value);
    }
    grid_text << axis << " = " << arr << "\n";
  };
  for (std::size_t a = 0; a < st.crossed_axes; ++a) write_axis(st.axes[a].first, st.axes[a].second);
  for (const auto& arm : st.vary) {
    grid_text << "\n[[grid.vary]]\n";
    for (const auto& [axis, values] : arm) write_axis(axis, values);
  }
  toml::array steps;
  for (auto s : rc.steps) steps.push_back(s);
  toml::array sweeps;
  for (const auto& sw : st.microbench.sweeps) sweeps.push_back(sweep_table(sw));
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
  if (!st.numerics.is_default()) resolved.insert("numerics", numerics_table(st.numerics));
  return to_toml_text(resolved) + grid_text.str();
}

}  // namespace

std::string grid_shape(const Study& st) {
  auto product = [](auto begin, auto end) {
    std::string out;
    for (auto it = begin; it != end; ++it)
      out += (out.empty() ? "" : " x ") + it->first + "[" + std::to_string(it->second.size()) + "]";
    return out;
  };
  std::string out = product(st.axes.begin(), st.axes.begin() + static_cast<std::ptrdiff_t>(st.crossed_axes));
  if (st.vary.empty()) return out.empty() ? "no axes" : out;
  std::string arms;
  for (const auto& arm : st.vary) arms += (arms.empty() ? "" : " | ") + product(arm.begin(), arm.end());
  return (out.empty() ? "" : out + " x ") + "(" + arms + ")";
}

Study parse_study(const std::string& text, const std::string& file) {
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
  read_model(open_section(root, file, "model"), st.model);
  read_data(open_section(root, file, "data"), st.data, st.model);
  read_train(open_section(root, file, "train"), st.train);
  const std::vector<std::string> policy_names =
      read_attention(open_section(root, file, "attention"), st.attention, st.model, file);
  read_numerics(open_section(root, file, "numerics"), st.numerics, st.model);
  read_microbench(open_section(root, file, "microbench"), st.microbench, policy_names, file);
  read_reduce(open_section(root, file, "reduce"), st.reduce);
  read_grid(open_section(root, file, "grid"), st, policy_names, file);
  expand_variants(st);
  check_loop_axes(st, root, file);
  st.resolved_toml = resolved_study_toml(st);
  st.hash = content_hash(st.resolved_toml);
  return st;
}

}  // namespace fastudy
