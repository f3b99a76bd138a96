// The grid axes and the expansion of [grid] into variants: the axis table (one row per axis), the
// reading of [grid] and [[grid.vary]] against it, the cross products with their variant ids, and the
// [grid] text of the resolved study.
#include "src/core/grid.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "base/error.hpp"
#include "base/number.hpp"
#include "fastudy/version.hpp"  // FASTUDY_TORCH_SDPA, FASTUDY_TORCH_VERSION
#include "src/core/import.hpp"
#include "src/core/names.hpp"
#include "src/core/resolved.hpp"

namespace fastudy {

using config_detail::join;
using config_detail::kLoopOrders;
using config_detail::kOnOff;
using config_detail::Section;
using config_detail::suggestion;
using config_detail::words;

namespace {

// fastudy's kernels, and LibTorch's SDPA backends where this build's LibTorch has them.
std::vector<std::string> attention_kinds() {
  std::vector<std::string> kinds{"baseline", "flash"};
  if (FASTUDY_TORCH_SDPA)
    for (const auto& kind : words(kSdpaKinds)) kinds.push_back(kind);
  return kinds;
}
const std::vector<std::string> kTrainFormats{"fp64", "fp32", "tf32", "bf16", "fp16"};

// ---- the grid axes: one row each ------------------------------------------------------------------
// A row says everything fastudy does with an axis: its name in [grid]; the type of its values; the
// values it allows (word axes; from the study, since `policy` allows the study's custom policies);
// the smallest value (integer axes) and whether a value may not exceed [model] seq_len; the fragment
// it adds to a variant id (prefix + value: "s1"; no prefix: the value itself); and how a value
// applies to a variant. Validation (read_grid), expansion and ids (expand_variants), the resolved
// TOML with typed values (grid_toml) and through it the content hash, and the checkpoint attributes
// (Variant::axes) all read this table: a new axis is one row here plus its test. A row names its
// fields (designated initializers, GCC's extension in C++17) and leaves out those at their default.
enum class AxisType { word, integer, real };
struct GridAxis {
  const char* name;
  const char* example;                    // two allowed values, as TOML (for --help, the docs and the table's test)
  AxisType type = AxisType::word;
  AxisRole role = AxisRole::setting;
  const char* baseline = "";              // the declared baseline value ("": the first value the grid lists)
  bool replicate = false;                 // a replicate axis: not part of the condition other axes are compared under
  const char* id_prefix = "";
  std::vector<std::string> (*allowed)(const std::vector<std::string>& policy_names) = nullptr;  // word axes
  std::int64_t min_value = 0;             // integer axes (real axes: values must be > 0)
  bool at_most_seq_len = false;           // integer axes: a block size
  std::string (*unknown_hint)(const std::string& value) = nullptr;  // word axes: a hint for a value not allowed
  void (*apply)(Variant& var, const std::string& value) = nullptr;
};

const GridAxis kGridAxes[] = {
    {.name = "attention",
     .example = R"(["baseline", "flash"])",
     .role = AxisRole::optimisation,
     .baseline = "baseline",
     .allowed = [](const auto&) { return attention_kinds(); },
     .unknown_hint =
         [](const std::string& x) {
           if (!parse_sdpa_backend(x)) return std::string();
           return x + " is LibTorch's scaled_dot_product_attention, which needs LibTorch >= 2.3; this build "
                      "links LibTorch " + FASTUDY_TORCH_VERSION + " (build against a newer LibTorch: docs/gpu.md)";
         },
     .apply =
         [](Variant& v, const std::string& x) {
           v.sdpa = parse_sdpa_backend(x).value_or(SdpaBackend::none);
           if (v.sdpa == SdpaBackend::none) v.attention = *parse_attention_kind(x);
         }},
    {.name = "arithmetic",
     .example = R"(["emulated", "native"])",
     .role = AxisRole::optimisation,
     .baseline = "emulated",
     .allowed = [](const auto&) { return words(kAllArithmetics); },
     .apply = [](Variant& v, const std::string& x) { v.train.arithmetic = *parse_arithmetic(x); }},
    {.name = "precision",
     .example = R"(["fp32", "bf16"])",
     .role = AxisRole::reference,
     .baseline = "fp32",
     .allowed = [](const auto&) { return kTrainFormats; },
     .unknown_hint =
         [](const std::string& x) {
           if (x.rfind("fp8", 0) != 0) return std::string();
           return std::string("fp8 formats are for the microbenchmark only ([microbench] formats)");
         },
     .apply = [](Variant& v, const std::string& x) { v.precision = *parse_format(x); }},
    {.name = "seed",
     .example = R"([1, 2])",
     .type = AxisType::integer,
     .role = AxisRole::reference,
     .replicate = true,
     .id_prefix = "s",
     .apply = [](Variant& v, const std::string& x) { v.seed = std::stoull(x); }},
    {.name = "init",
     .example = R"(["normal", "scaled"])",
     .role = AxisRole::setting,
     .allowed = [](const auto&) { return words(kAllInitSchemes); },
     .apply = [](Variant& v, const std::string& x) { v.init = *parse_init_scheme(x); }},
    {.name = "data_seed",
     .example = R"([3, 4])",
     .type = AxisType::integer,
     .role = AxisRole::setting,
     .replicate = true,
     .id_prefix = "d",
     .apply = [](Variant& v, const std::string& x) { v.data.seed = std::stoull(x); }},
    {.name = "policy",
     .example = R"(["eager", "mixed"])",
     .role = AxisRole::optimisation,
     .allowed = [](const auto& policies) { return policies; },
     .apply = [](Variant& v, const std::string& x) { v.attention_cfg.policy = x; }},
    {.name = "block_q",
     .example = R"([8, 16])",
     .type = AxisType::integer,
     .role = AxisRole::optimisation,
     .id_prefix = "bq",
     .min_value = 1,
     .at_most_seq_len = true,
     .apply = [](Variant& v, const std::string& x) { v.attention_cfg.block_q = std::stoi(x); }},
    {.name = "block_kv",
     .example = R"([8, 16])",
     .type = AxisType::integer,
     .role = AxisRole::optimisation,
     .id_prefix = "bkv",
     .min_value = 1,
     .at_most_seq_len = true,
     .apply = [](Variant& v, const std::string& x) { v.attention_cfg.block_kv = std::stoi(x); }},
    {.name = "loop_order",
     .example = R"(["kv_outer", "q_outer"])",
     .role = AxisRole::optimisation,
     .allowed = [](const auto&) { return kLoopOrders; },
     .apply = [](Variant& v, const std::string& x) { v.attention_cfg.loop_order = *parse_loop_order(x); }},
    // [numerics]: the arithmetic optimisations of the training model (src/train/model.hpp); each baseline
    // is the [numerics] default, the arithmetic the trainer always ran. split_k is checked against the
    // model's shortest reduction in read_axis_values.
    {.name = "matmul",
     .example = R"(["fp32", "bf16x3"])",
     .role = AxisRole::optimisation,
     .baseline = "fp32",
     .id_prefix = "mm_",
     .allowed = [](const auto&) { return words(kAllMatmulArithmetics); },
     .apply = [](Variant& v, const std::string& x) { v.numerics.matmul = *parse_matmul_arithmetic(x); }},
    {.name = "split_k",
     .example = R"([1, 2])",
     .type = AxisType::integer,
     .role = AxisRole::optimisation,
     .baseline = "1",
     .id_prefix = "sk",
     .min_value = 1,
     .apply = [](Variant& v, const std::string& x) { v.numerics.split_k = std::stoi(x); }},
    {.name = "layernorm",
     .example = R"(["torch", "welford"])",
     .role = AxisRole::optimisation,
     .baseline = "torch",
     .id_prefix = "ln_",
     .allowed = [](const auto&) { return words(kAllLayerNormAlgorithms); },
     .apply = [](Variant& v, const std::string& x) { v.numerics.layernorm = *parse_layernorm_algorithm(x); }},
    {.name = "gelu",
     .example = R"(["erf", "tanh"])",
     .role = AxisRole::optimisation,
     .baseline = "erf",
     .id_prefix = "gelu_",
     .allowed = [](const auto&) { return words(kAllGeluApproximations); },
     .apply = [](Variant& v, const std::string& x) { v.numerics.gelu = *parse_gelu_approximation(x); }},
    {.name = "recompute",
     .example = R"(["off", "on"])",
     .role = AxisRole::optimisation,
     .baseline = "off",
     .id_prefix = "recompute_",
     .allowed = [](const auto&) { return kOnOff; },
     .apply = [](Variant& v, const std::string& x) { v.numerics.recompute = x == "on"; }},
    {.name = "lr",
     .example = R"([0.001, 0.002])",
     .type = AxisType::real,
     .role = AxisRole::setting,
     .id_prefix = "lr",
     .apply =
         [](Variant& v, const std::string& x) {
           v.train.lr = std::stod(x);
           v.train.min_lr = std::min(v.train.min_lr, v.train.lr);
         }},
    // The training-loop axes (docs/configuration.md "Training-loop axes"; cross-checked per variant by
    // check_loop_axes).
    {.name = "dp_width",
     .example = R"([1, 4])",
     .type = AxisType::integer,
     .role = AxisRole::optimisation,
     .baseline = "1",
     .id_prefix = "dp",
     .min_value = 1,
     .apply = [](Variant& v, const std::string& x) { v.train.dp_width = std::stoi(x); }},
    {.name = "allreduce",
     .example = R"(["rank", "tree"])",
     .role = AxisRole::optimisation,
     .baseline = "rank",
     .allowed = [](const auto&) { return words(kAllReduceOrders); },
     .apply = [](Variant& v, const std::string& x) { v.train.allreduce = *parse_reduce_order(x); }},
    {.name = "grad_accum",
     .example = R"([1, 2])",
     .type = AxisType::integer,
     .role = AxisRole::optimisation,
     .baseline = "1",
     .id_prefix = "ga",
     .min_value = 1,
     .apply = [](Variant& v, const std::string& x) { v.train.grad_accum = std::stoi(x); }},
    {.name = "repeat",
     .example = R"([0, 1])",
     .type = AxisType::integer,
     .role = AxisRole::noise,
     .baseline = "0",
     .replicate = true,
     .id_prefix = "r",
     .apply = [](Variant& v, const std::string& x) { v.train.repeat = std::stoi(x); }},
};

const GridAxis* find_axis(const std::string& name) {
  for (const auto& axis : kGridAxes)
    if (axis.name == name) return &axis;
  return nullptr;
}

// The token an axis value contributes to a variant id. An axis of the user's ([axes.NAME]) adds its
// value when that starts with a letter ("fused"), else its name and the value ("tp2").
std::string id_token(const std::string& axis, const std::string& value) {
  if (const GridAxis* row = find_axis(axis)) return row->id_prefix + value;
  if (!value.empty() && std::isalpha(static_cast<unsigned char>(value[0]))) return value;
  return axis + value;
}

// The values of an axis of the user's ([axes.NAME] of an imported study): strings or integers, as text.
std::vector<std::string> read_declared_axis_values(Section& sec, const std::string& axis) {
  std::vector<std::string> values;
  for (const auto& el : *sec.array(axis)) {
    std::string value;
    if (auto w = el.value<std::string>(); el.is_string() && w) value = *w;
    else if (el.is_integer()) value = std::to_string(*el.value<std::int64_t>());
    else sec.fail_at(el, axis, "`" + sec.qualified(axis) + "` must hold strings or integers (got " + Section::type_name(el) + ")");
    if (value.empty() || value.find_first_of("/\\") != std::string::npos)
      sec.fail_at(el, axis, "`" + sec.qualified(axis) + "` value \"" + value + "\" must be non-empty, without slashes",
                  "the values are parts of file names and variant ids");
    if (std::find(values.begin(), values.end(), value) != values.end())
      sec.fail_at(el, axis, "`" + sec.qualified(axis) + "` lists \"" + value + "\" twice", "remove the duplicate");
    values.push_back(value);
  }
  return values;
}

// The values one grid axis lists (in `sec`, the [grid] table or one [[grid.vary]] table), validated
// against the axis's row.
// In an imported study the values of a word axis are the user's own labels ("math", "fa2"), and the
// model's limits do not apply: fastudy runs none of them.
std::vector<std::string> read_axis_values(Section& sec, const std::string& axis, const toml::node& v,
                                          const std::vector<std::string>& policy_names, const Study& st) {
  const GridAxis* found = find_axis(axis);
  if (!found) return read_declared_axis_values(sec, axis);
  const GridAxis& row = *found;
  const ModelConfig& m = st.model;
  const bool imported = st.imported();
  std::vector<std::string> values;
  switch (row.type) {
    case AxisType::word: {
      if (imported) return read_declared_axis_values(sec, axis);
      const std::vector<std::string> allowed = row.allowed(policy_names);
      sec.get_words(axis, values, {});
      for (std::size_t i = 0; i < values.size(); ++i) {
        if (std::find(allowed.begin(), allowed.end(), values[i]) != allowed.end()) continue;
        std::string hint = row.unknown_hint ? row.unknown_hint(values[i]) : std::string();
        if (hint.empty()) hint = suggestion(values[i], allowed);
        sec.fail_at(*v.as_array()->get(i), axis,
                    "`" + sec.qualified(axis) + "` has unknown value " + printable_name(values[i]) + "; allowed: " + join(allowed),
                    hint);
      }
      break;
    }
    case AxisType::integer: {
      std::vector<int> ints;
      sec.get_ints(axis, ints, row.min_value);
      for (std::size_t i = 0; i < ints.size(); ++i) {
        if (imported) {
          values.push_back(std::to_string(ints[i]));
          continue;
        }
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
      std::set<std::string> seen;
      for (const auto& el : *arr) {
        if (!el.is_number() || *el.value<double>() <= 0)
          sec.fail_at(el, axis, "[" + sec.name() + "] " + axis + " must hold positive numbers");
        std::string s = shortest_number_text(*el.value<double>());
        if (!seen.insert(s).second)
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

// A table axis, or one the study declares ([axes.NAME] of an imported study).
bool is_known_axis(const std::string& axis, const Study& st) {
  const auto& known = known_axes();
  if (std::find(known.begin(), known.end(), axis) != known.end()) return true;
  return std::any_of(st.declared_axes.begin(), st.declared_axes.end(), [&](const GridAxisInfo& a) { return a.name == axis; });
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

const std::vector<std::string>& known_axes() {
  static const std::vector<std::string> axes = [] {
    std::vector<std::string> names;
    for (const auto& axis : kGridAxes) names.emplace_back(axis.name);
    return names;
  }();
  return axes;
}

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

std::uint64_t listed_variants(const Study& st) {
  constexpr std::uint64_t kMax = UINT64_MAX;
  const auto times = [](std::uint64_t a, std::uint64_t b) { return b != 0 && a > kMax / b ? kMax : a * b; };
  const auto product = [&](auto begin, auto end) {
    std::uint64_t p = 1;
    for (auto it = begin; it != end; ++it) p = times(p, it->second.size());
    return p;
  };
  if (st.vary.empty()) return product(st.axes.begin(), st.axes.end());
  const std::uint64_t crossed = product(st.axes.begin(), st.axes.begin() + static_cast<std::ptrdiff_t>(st.crossed_axes));
  std::uint64_t total = 0;
  for (const auto& arm : st.vary) {  // every other vary axis at its baseline: one value
    const std::uint64_t n = times(crossed, product(arm.begin(), arm.end()));
    total = total > kMax - n ? kMax : total + n;
  }
  return total;
}

namespace {

// Whole text as a number, or nullopt.
std::optional<std::int64_t> whole_number(const std::string& x) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(x.c_str(), &end, 10);
  if (x.empty() || *end != '\0' || errno == ERANGE) return std::nullopt;
  return n;
}
std::optional<double> real_number(const std::string& x) {
  char* end = nullptr;
  const double r = std::strtod(x.c_str(), &end);
  if (x.empty() || *end != '\0') return std::nullopt;
  return r;
}

// The problem with value `x` of axis `row` in study `st` ("" when it is allowed): what read_axis_values
// checks for a value the grid lists, for a value from the command line.
std::string axis_value_problem(const Study& st, const GridAxis& row, const std::string& x) {
  const std::string axis = row.name;
  switch (row.type) {
    case AxisType::word: {
      std::vector<std::string> policies;
      for (const Reading& r : kReadings) policies.emplace_back(r.name);
      for (const auto& [name, custom] : st.attention.custom_policies) policies.push_back(name);
      const std::vector<std::string> allowed = row.allowed(policies);
      if (std::find(allowed.begin(), allowed.end(), x) != allowed.end()) return "";
      std::string hint = row.unknown_hint ? row.unknown_hint(x) : std::string();
      if (hint.empty()) hint = suggestion(x, allowed);
      return "value \"" + x + "\" is not allowed for " + axis + "; allowed: " + join(allowed) +
             (hint.empty() ? "" : " (" + hint + ")");
    }
    case AxisType::integer: {
      const std::optional<std::int64_t> n = whole_number(x);
      if (!n || *n < row.min_value)
        return "value \"" + x + "\" is not allowed for " + axis + ": it takes a whole number >= " + std::to_string(row.min_value);
      if (axis == "split_k" && *n > max_split_k(st.model))
        return "split_k = " + x + " is larger than the shortest reduction of the model's linear layers (" +
               std::to_string(max_split_k(st.model)) + ")";
      if (row.at_most_seq_len && *n > st.model.seq_len)
        return axis + " = " + x + " is larger than [model] seq_len = " + std::to_string(st.model.seq_len);
      return "";
    }
    case AxisType::real: {
      const std::optional<double> r = real_number(x);
      if (!r || !(*r > 0) || !std::isfinite(*r)) return "value \"" + x + "\" is not allowed for " + axis + ": it takes a positive number";
      return "";
    }
  }
  return "";
}

}  // namespace

Variant variant_with(const Study& st, const Variant& base, const std::vector<std::pair<std::string, std::string>>& set) {
  Variant var = base;
  std::string suffix;
  for (const auto& [axis, raw] : set) {
    const GridAxis* row = find_axis(axis);
    if (row == nullptr) {
      std::string hint = suggestion(axis, known_axes());
      throw UsageError("--set " + axis + "=" + raw + ": `" + axis + "` is not a grid axis",
                       hint.empty() ? "the grid axes are " + join(known_axes()) : hint);
    }
    if (const std::string problem = axis_value_problem(st, *row, raw); !problem.empty())
      throw UsageError("--set " + axis + "=" + raw + ": " + problem, "pass a value the axis allows");
    // The value as the grid would hold it: integers and reals in their shortest text.
    std::string value = raw;
    if (row->type == AxisType::integer) value = std::to_string(*whole_number(raw));
    if (row->type == AxisType::real) value = shortest_number_text(*real_number(raw));
    row->apply(var, value);
    const std::string& name = axis;  // a structured binding is captured by clang only from C++20 on (clang 16)
    auto it = std::find_if(var.axes.begin(), var.axes.end(), [&](const auto& a) { return a.first == name; });
    if (it != var.axes.end()) it->second = value;
    else var.axes.emplace_back(axis, value);
    suffix += "+" + axis + "=" + value;
  }
  const TrainConfig& t = var.train;
  const int width = t.dp_width > 0 ? t.dp_width : t.ranks_per_variant;
  if (t.batch % width != 0 || (t.batch / width) % t.grad_accum != 0)
    throw UsageError("--set: dp_width = " + std::to_string(width) + " and grad_accum = " + std::to_string(t.grad_accum) +
                         " do not cut [train] batch = " + std::to_string(t.batch) + " into equal shards and micro-batches",
                     "choose a dp_width that divides batch and a grad_accum that divides batch / dp_width");
  var.id = base.id + suffix;
  var.resolved_toml = config_detail::variant_toml(var);
  var.hash = content_hash(var.resolved_toml);
  return var;
}

namespace config_detail {

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
    if (!is_known_axis(axis, st)) unknown_axis(file, *kp, "grid." + axis);
    st.axes.emplace_back(axis, read_axis_values(grid, axis, *vp, policy_names, st));
  }
  st.crossed_axes = st.axes.size();
  if (!vary_node) return;
  grid.has("vary");
  const toml::array* tables = vary_node->as_array();
  if (!tables || tables->empty() || !tables->is_array_of_tables())
    grid.fail("vary", "`grid.vary` must be a list of tables: write each as [[grid.vary]] followed by its axes",
              "see docs/configuration.md \"Grids\"");
  std::map<std::string, std::size_t> where;  // vary axis -> index in st.axes
  std::map<std::string, std::set<std::string>> listed;
  for (std::size_t t = 0; t < tables->size(); ++t) {
    const toml::table& table = *tables->get(t)->as_table();
    Section sec(file, "grid.vary", &table, table.source());
    if (table.empty()) sec.fail("", "a [[grid.vary]] table is empty", "list the axes it varies, e.g. matmul = [\"tf32\"]");
    std::vector<std::pair<std::string, std::vector<std::string>>> arm;
    for (const auto& [kp, vp] : in_file_order(table)) {
      const std::string axis(kp->str());
      if (!is_known_axis(axis, st)) unknown_axis(file, *kp, "grid.vary." + axis);
      for (std::size_t a = 0; a < st.crossed_axes; ++a)
        if (st.axes[a].first == axis)
          sec.fail(axis, "axis `" + axis + "` is in [grid] and in a [[grid.vary]] table",
                   "an axis is either crossed with everything ([grid]) or varied from its baseline ([[grid.vary]])");
      std::vector<std::string> values = read_axis_values(sec, axis, *vp, policy_names, st);
      auto [it, fresh] = where.emplace(axis, st.axes.size());
      if (fresh) {
        const std::string declared = study_axis(st, axis).baseline;
        st.axes.emplace_back(axis, std::vector<std::string>{declared.empty() ? values.front() : declared});
      }
      auto& all = st.axes[it->second].second;
      auto& in_all = listed[axis];  // the values of `all`, for a lookup in log n: a list may be long
      in_all.insert(all.begin(), all.end());
      for (const auto& value : values)
        if (in_all.insert(value).second) all.push_back(value);
      arm.emplace_back(axis, std::move(values));
    }
    st.vary.push_back(std::move(arm));
  }
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
        if (!st.imported()) find_axis(axis)->apply(var, value);
      }
      var.id = tokens.empty() ? "default" : join(tokens, "-");
      if (const auto problem = name_problem(var.id, kMaxVariantIdLength))
        throw ConfigError(st.file, 0, 0, "grid", "the variant id " + printable_name(var.id) + " " + *problem,
                          "an id is a folder name (OUT/checkpoints/<id>) with a token per axis: vary fewer axes in "
                          "[grid] (use [[grid.vary]] tables), or give custom policies shorter names");
      std::string values;
      for (const auto& [axis, value] : var.axes) values += axis + "=" + value + " ";
      // The same variant again (from another [[grid.vary]] table) is kept once, as first produced.
      if (seen.insert(values).second) {
        if (auto [it, fresh] = ids.emplace(var.id, values); !fresh)
          throw ConfigError(st.file, 0, 0, "grid",
                            "two variants get the id `" + var.id + "`: " + it->second + "and " + values,
                            "axis values that are words of another axis make ids ambiguous; rename a custom policy");
        var.resolved_toml = st.imported() ? imported_variant_toml(st, var) : variant_toml(var);
        var.hash = content_hash(var.resolved_toml);
        st.variants.push_back(std::move(var));
      }

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

// [grid] and [[grid.vary]] as TOML, written by hand: toml++ orders keys, the grid keeps the file's
// order. Values are typed by their axis (integers, reals, words).
std::string grid_toml(const Study& st) {
  std::ostringstream grid_text;
  grid_text << "\n[grid]\n";
  auto write_axis = [&](const std::string& axis, const std::vector<std::string>& values) {
    toml::array arr;
    // An axis of the user's: integers when every value is one, else strings (both read back the same).
    const bool all_integers = std::all_of(values.begin(), values.end(), [](const std::string& v) {
      return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos && v.size() < 19;
    });
    const GridAxis* row = find_axis(axis);
    const AxisType type = row ? row->type : all_integers ? AxisType::integer : AxisType::word;
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
  return grid_text.str();
}

}  // namespace config_detail
}  // namespace fastudy
