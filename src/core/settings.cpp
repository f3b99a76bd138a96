// The name tables of the word-valued settings (settings.hpp): one to_string per enum, and its parse
// reading the same table back.
#include "src/core/settings.hpp"

#include <cstddef>

namespace fastudy {
namespace {

// The value of `all` whose word is `name`.
template <class E, std::size_t N>
std::optional<E> parse_word(const E (&all)[N], std::string_view name) {
  for (E e : all)
    if (name == to_string(e)) return e;
  return std::nullopt;
}

}  // namespace

std::string_view to_string(Device d) {
  switch (d) {
    case Device::auto_: return "auto";
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
  }
  return "auto";
}
std::optional<Device> parse_device(std::string_view name) { return parse_word(kAllDevices, name); }

std::string_view to_string(Arithmetic a) {
  switch (a) {
    case Arithmetic::emulated: return "emulated";
    case Arithmetic::native: return "native";
  }
  return "emulated";
}
std::optional<Arithmetic> parse_arithmetic(std::string_view name) { return parse_word(kAllArithmetics, name); }

std::string_view to_string(Schedule s) {
  switch (s) {
    case Schedule::cosine: return "cosine";
    case Schedule::constant: return "constant";
  }
  return "cosine";
}
std::optional<Schedule> parse_schedule(std::string_view name) { return parse_word(kAllSchedules, name); }

std::string_view to_string(ReduceOrder order) {
  switch (order) {
    case ReduceOrder::rank: return "rank";
    case ReduceOrder::ring: return "ring";
    case ReduceOrder::tree: return "tree";
  }
  return "rank";
}
std::optional<ReduceOrder> parse_reduce_order(std::string_view name) { return parse_word(kAllReduceOrders, name); }

std::string_view to_string(DataKind k) {
  switch (k) {
    case DataKind::synthetic: return "synthetic";
    case DataKind::text: return "text";
    case DataKind::tokens: return "tokens";
  }
  return "synthetic";
}
std::optional<DataKind> parse_data_kind(std::string_view name) { return parse_word(kAllDataKinds, name); }

std::string_view to_string(InitScheme s) {
  switch (s) {
    case InitScheme::normal: return "normal";
    case InitScheme::xavier_uniform: return "xavier_uniform";
    case InitScheme::kaiming_normal: return "kaiming_normal";
    case InitScheme::scaled: return "scaled";
  }
  return "normal";
}
std::optional<InitScheme> parse_init_scheme(std::string_view name) { return parse_word(kAllInitSchemes, name); }

std::string_view to_string(MatmulArithmetic m) {
  switch (m) {
    case MatmulArithmetic::fp32: return "fp32";
    case MatmulArithmetic::tf32: return "tf32";
    case MatmulArithmetic::bf16: return "bf16";
    case MatmulArithmetic::bf16x3: return "bf16x3";
  }
  return "fp32";
}
std::optional<MatmulArithmetic> parse_matmul_arithmetic(std::string_view name) {
  return parse_word(kAllMatmulArithmetics, name);
}

std::string_view to_string(LayerNormAlgorithm l) {
  switch (l) {
    case LayerNormAlgorithm::torch: return "torch";
    case LayerNormAlgorithm::two_pass: return "two_pass";
    case LayerNormAlgorithm::welford: return "welford";
  }
  return "torch";
}
std::optional<LayerNormAlgorithm> parse_layernorm_algorithm(std::string_view name) {
  return parse_word(kAllLayerNormAlgorithms, name);
}

std::string_view to_string(GeluApproximation g) {
  switch (g) {
    case GeluApproximation::erf: return "erf";
    case GeluApproximation::tanh: return "tanh";
  }
  return "erf";
}
std::optional<GeluApproximation> parse_gelu_approximation(std::string_view name) {
  return parse_word(kAllGeluApproximations, name);
}

std::string_view to_string(SdpaBackend b) {
  switch (b) {
    case SdpaBackend::none: return "";
    case SdpaBackend::flash: return "sdpa_flash";
    case SdpaBackend::efficient: return "sdpa_efficient";
    case SdpaBackend::cudnn: return "sdpa_cudnn";
    case SdpaBackend::math: return "sdpa_math";
  }
  return "";
}
std::optional<SdpaBackend> parse_sdpa_backend(std::string_view name) { return parse_word(kSdpaKinds, name); }

}  // namespace fastudy
