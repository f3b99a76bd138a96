// The word-valued settings of a grid.toml as enums, each with one name table: the words that name its
// values in grid.toml, the resolved TOML, CSV columns and checkpoint attributes (`cosine`, `tree`, ...).
//
// Every enum E here follows kernels/format.hpp's Format: kAll... lists its values in order, to_string
// is its name table (settings.cpp), and parse_... reads a word back (nullopt for any other word).
// Config validation lists a table's words in its messages ("allowed: rank, ring, tree") and suggests
// the nearest one; the code that uses a value switches on the enum, never on its word.
#pragma once

#include <optional>
#include <string_view>

namespace fastudy {

// [train] device: where a variant trains. auto = cuda when this build's LibTorch has CUDA and every
// rank of the variant's group sees a GPU, else cpu. Not part of a variant's hash: a checkpoint written
// on one device resumes on the other.
enum class Device { auto_, cpu, cuda };
inline constexpr Device kAllDevices[] = {Device::auto_, Device::cpu, Device::cuda};
std::string_view to_string(Device d);  // "auto", "cpu", "cuda"
std::optional<Device> parse_device(std::string_view name);

// [train] arithmetic: emulated = fp32 containers rounded by the precision policy (the trainer's
// arithmetic, the same on every device); native = the hardware's own formats through the framework
// (autocast: bf16/fp16 tensors and tensor cores on a GPU, bf16 on a CPU; TF32 matmuls for tf32).
enum class Arithmetic { emulated, native };
inline constexpr Arithmetic kAllArithmetics[] = {Arithmetic::emulated, Arithmetic::native};
std::string_view to_string(Arithmetic a);  // "emulated", "native"
std::optional<Arithmetic> parse_arithmetic(std::string_view name);

// [train] schedule: the learning rate after warmup, cosine decay to min_lr or constant lr.
enum class Schedule { cosine, constant };
inline constexpr Schedule kAllSchedules[] = {Schedule::cosine, Schedule::constant};
std::string_view to_string(Schedule s);  // "cosine", "constant"
std::optional<Schedule> parse_schedule(std::string_view name);

// [train] allreduce (docs/configuration.md "Training-loop axes"): the order in which the gradients of the dp_width
// shards are summed (src/train/dp_reduce.hpp says exactly how each one associates).
enum class ReduceOrder { rank, ring, tree };
inline constexpr ReduceOrder kAllReduceOrders[] = {ReduceOrder::rank, ReduceOrder::ring, ReduceOrder::tree};
std::string_view to_string(ReduceOrder order);  // "rank", "ring", "tree"
std::optional<ReduceOrder> parse_reduce_order(std::string_view name);

// [data] kind: synthetic sequences, a text file read as byte tokens, or a flat file of token ids.
enum class DataKind { synthetic, text, tokens };
inline constexpr DataKind kAllDataKinds[] = {DataKind::synthetic, DataKind::text, DataKind::tokens};
std::string_view to_string(DataKind k);  // "synthetic", "text", "tokens"
std::optional<DataKind> parse_data_kind(std::string_view name);

// The init axis: how the model's weights are drawn (src/train/model.hpp, Gpt::init).
enum class InitScheme { normal, xavier_uniform, kaiming_normal, scaled };
inline constexpr InitScheme kAllInitSchemes[] = {InitScheme::normal, InitScheme::xavier_uniform,
                                                 InitScheme::kaiming_normal, InitScheme::scaled};
std::string_view to_string(InitScheme s);  // "normal", "xavier_uniform", "kaiming_normal", "scaled"
std::optional<InitScheme> parse_init_scheme(std::string_view name);

// [numerics]: the arithmetic of the training model's linear layers, LayerNorm and GELU (src/train/
// model.hpp says exactly what each value computes).
enum class MatmulArithmetic { fp32, tf32, bf16, bf16x3 };
inline constexpr MatmulArithmetic kAllMatmulArithmetics[] = {MatmulArithmetic::fp32, MatmulArithmetic::tf32,
                                                             MatmulArithmetic::bf16, MatmulArithmetic::bf16x3};
std::string_view to_string(MatmulArithmetic m);  // "fp32", "tf32", "bf16", "bf16x3"
std::optional<MatmulArithmetic> parse_matmul_arithmetic(std::string_view name);

enum class LayerNormAlgorithm { torch, two_pass, welford };
inline constexpr LayerNormAlgorithm kAllLayerNormAlgorithms[] = {
    LayerNormAlgorithm::torch, LayerNormAlgorithm::two_pass, LayerNormAlgorithm::welford};
std::string_view to_string(LayerNormAlgorithm l);  // "torch", "two_pass", "welford"
std::optional<LayerNormAlgorithm> parse_layernorm_algorithm(std::string_view name);

enum class GeluApproximation { erf, tanh };
inline constexpr GeluApproximation kAllGeluApproximations[] = {GeluApproximation::erf, GeluApproximation::tanh};
std::string_view to_string(GeluApproximation g);  // "erf", "tanh"
std::optional<GeluApproximation> parse_gelu_approximation(std::string_view name);

// The framework's own attention as extra attention kinds: LibTorch's scaled_dot_product_attention with
// one backend allowed at a time ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math"; builds
// against LibTorch >= 2.3, FASTUDY_TORCH_SDPA). none: fastudy's own kernels (Variant::attention).
enum class SdpaBackend { none, flash, efficient, cudnn, math };
// The SDPA kinds (every backend but none), in order.
inline constexpr SdpaBackend kSdpaKinds[] = {SdpaBackend::flash, SdpaBackend::efficient, SdpaBackend::cudnn,
                                             SdpaBackend::math};
// "sdpa_flash", ... ("" for none).
std::string_view to_string(SdpaBackend b);
// The SDPA kind named (never none); nullopt for any other name.
std::optional<SdpaBackend> parse_sdpa_backend(std::string_view name);

}  // namespace fastudy
