// The small rest of config.hpp: ConfigError, the member functions of Variant, Study and
// NumericsConfig, the phase names, and a variant's resolved attention policy. The reading of
// grid.toml is config_read.cpp, the grid grid.cpp, the resolved TOML resolved.cpp.
#include "src/core/config.hpp"

#include <algorithm>
#include <sstream>

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

std::string Variant::attention_name() const {
  return sdpa == SdpaBackend::none ? std::string(fastudy::to_string(attention)) : std::string(fastudy::to_string(sdpa));
}

bool Study::has_phase(const std::string& p) const { return std::find(phases.begin(), phases.end(), p) != phases.end(); }

const Variant* Study::find_variant(const std::string& id) const {
  for (const auto& v : variants)
    if (v.id == id) return &v;
  return nullptr;
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

namespace {

// `scale_too`: whether o's scale applies (the policy's own table places the baseline's scale only; the
// flash table places the framework flash loops').
void apply(const PolicyOverrides& o, PrecisionPolicy& p, bool scale_too) {
  for (const auto& [step, fmt] : o.steps) p.*(find_policy_step(step)->member) = fmt;  // names checked on parse
  if (o.scale && scale_too) p.scale = *o.scale;
  if (o.quantization) p.quantization = *o.quantization;
  if (o.incoherent) p.incoherent = *o.incoherent;
  if (o.max_offset) p.max_offset = *o.max_offset;
}

}  // namespace

PrecisionPolicy resolve_policy(const AttentionConfig& cfg, const std::string& name, Format f, AttentionKind kind) {
  auto it = cfg.custom_policies.find(name);
  if (it == cfg.custom_policies.end()) return make_policy(name, f, kind);
  // A custom policy starts from its preset's policy of this kind in the variant's format, then sets
  // what it names for both kinds, then what it names for this kind.
  const CustomPolicy& custom = it->second;
  PrecisionPolicy p = make_policy(custom.preset, f, kind);
  p.name = name;
  p.rounding = custom.rounding;
  apply(custom.both, p, kind == AttentionKind::baseline);
  apply(kind == AttentionKind::flash ? custom.flash : custom.baseline, p, true);
  return p;
}

ReadingPolicies resolve_reading(const AttentionConfig& cfg, const std::string& name, Format f) {
  return {resolve_policy(cfg, name, f, AttentionKind::flash), resolve_policy(cfg, name, f, AttentionKind::baseline)};
}

}  // namespace fastudy
