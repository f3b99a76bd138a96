// The study configuration: what a grid.toml says, validated and with every default filled in.
//
// load_study() parses a grid.toml with toml++, rejects anything unknown, mistyped or inconsistent
// with a ConfigError that names the file, line, column and key, and expands [grid] into variants:
// the cross product of the axes, each with a stable readable id and a content hash of its resolved
// configuration. This header stays free of toml++ and LibTorch: most files include it.
//
// The word-valued settings (device, schedule, allreduce, init, ...) are enums of settings.hpp; what a
// device or this build can run is capabilities.hpp. The implementation, by concern: config_read.cpp
// (the sections of grid.toml), grid.cpp (the axis table and the expansion into variants),
// resolved.cpp (the resolved TOML and its content hash), config.cpp (the small rest).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "base/pair_metrics.hpp"
#include "kernels/attention.hpp"
#include "kernels/format.hpp"
#include "kernels/fa2_launch.hpp"
#include "kernels/microbench.hpp"
#include "src/core/settings.hpp"

namespace fastudy {

// A configuration error: exit code 2, nothing written. what() is the full message
// ("grid.toml:12:3: [model] d_model = 100 ...\nhint: ...").
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string file, int line, int column, std::string key, const std::string& message,
              std::string hint = {});
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& key() const { return key_; }

 private:
  std::string file_;
  int line_, column_;
  std::string key_;
};

struct ModelConfig {
  int vocab = 64;
  int d_model = 64;
  int heads = 4;
  int layers = 2;
  int seq_len = 64;
  int mlp_ratio = 4;
};

struct DataConfig {
  DataKind kind = DataKind::synthetic;
  std::string path;                // text: any file (byte tokens); tokens: flat little-endian ids (nanoGPT layout)
  int token_bytes = 2;             // tokens: bytes per id, 2 (uint16, nanoGPT) or 4 (uint32)
  std::uint64_t seed = 1234;       // the data seed: fixed across variants unless it is a grid axis
  int span_len = 8;                // synthetic: length of the spans that repeat inside a sequence
};

struct TrainConfig {
  std::int64_t steps = 200;
  int batch = 16;              // global batch (sequences per step), sharded over a variant's ranks
  double lr = 3e-3;
  double min_lr = 3e-4;
  std::int64_t warmup = 20;
  Schedule schedule = Schedule::cosine;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;      // max global grad norm; 0 disables clipping
  std::int64_t checkpoint_every = 50;
  int ranks_per_variant = 1;
  // The training-loop axes (docs/configuration.md "Training-loop axes"). dp_width: the data-parallel width W the
  // arithmetic models: the global batch in W shards, one mean-loss gradient each, summed in the
  // `allreduce` order and divided by W, bit for bit the same on any ranks_per_variant R dividing W.
  // 0 (unset): W = R, the physical ranks' gradients averaged by the group's allreduce backend (MPI or
  // NCCL, in the library's order) as before these axes existed.
  int dp_width = 0;
  ReduceOrder allreduce = ReduceOrder::rank;  // the order of the W-shard sum
  int grad_accum = 1;              // k micro-batches per shard, loss/k each, gradients accumulated in order
  int repeat = 0;                  // the same variant again (noise axis): changes no arithmetic
  Device device = Device::auto_;   // where the variant trains (see Device); `--device` overrides it
  Arithmetic arithmetic = Arithmetic::emulated;  // also a grid axis
  bool shadow_attention = false;
  std::int64_t log_every = 10;
  int spike_window = 20;          // running window for loss-spike detection (steps)
  double spike_threshold = 2.0;   // a spike: loss > threshold x running mean of the window
  double loss_scale = 65536.0;    // fp16: initial dynamic loss scale
  std::int64_t loss_scale_window = 200;  // fp16: grow the scale after this many finite steps
};

// What a custom policy changes in one attention kind's policy (or in both): steps set to other formats,
// the baseline's scale placement, the quantization of Q, K, V, incoherent processing and Qiu & Yao's
// max_offset (unset: the preset's).
struct PolicyOverrides {
  std::map<std::string, Format> steps;  // step -> format
  std::optional<ScalePlacement> scale;
  std::optional<Quantization> quantization;
  std::optional<bool> incoherent;
  std::optional<double> max_offset;  // beta > 1 (PrecisionPolicy::max_offset)
  bool empty() const { return steps.empty() && !scale && !quantization && !incoherent && !max_offset; }
};

// A custom precision policy: a preset (the reading it starts from, in the variant's format, one policy
// per attention kind), its rounding mode, what it changes in both kinds (the keys of
// [attention.policies.NAME]) and then in one kind only (its `flash` and `baseline` sub-tables).
struct CustomPolicy {
  std::string preset = "pure";
  Rounding rounding = Rounding::nearest;
  PolicyOverrides both, flash, baseline;
};

// The attention kernel settings shared by every variant (grid axes may override some of them).
struct AttentionConfig {
  int block_q = 32;
  int block_kv = 32;
  LoopOrder loop_order = LoopOrder::q_outer;
  // A reading (a row of kReadings: pure, eager, ...) or the name of a [attention.policies.NAME]. The default stays
  // mixed (the hypothetical reading), so that grids without the key keep their resolved text and hash.
  std::string policy = "mixed";
  std::map<std::string, CustomPolicy> custom_policies;
};

// [numerics]: the arithmetic of the training model's linear layers, LayerNorm and GELU, and activation
// recomputation (src/train/model.hpp says exactly what each value computes). Each field is also a grid
// axis (matmul, split_k, layernorm, gelu, recompute) with a declared baseline; the defaults are the
// arithmetic the trainer has always used.
struct NumericsConfig {
  MatmulArithmetic matmul = MatmulArithmetic::fp32;  // products of every linear layer, forward and backward
  int split_k = 1;               // reduction of every linear-layer matmul split into k contiguous parts
  LayerNormAlgorithm layernorm = LayerNormAlgorithm::torch;  // how LayerNorm's mean and variance are summed
  GeluApproximation gelu = GeluApproximation::erf;
  bool recompute = false;        // recompute each block's activations in the backward pass
  bool is_default() const;
};
// The largest split_k a model allows: the shortest reduction any linear-layer matmul has (forward:
// d_model; dX: d_model or vocab output features; dW: at least seq_len tokens of one sequence).
int max_split_k(const ModelConfig& m);

// One sweep of the microbenchmark: the cross product of its lists.
struct MicrobenchSweep {
  std::string name = "main";
  std::vector<Format> formats{Format::fp64, Format::fp32, Format::fp16, Format::bf16};
  std::vector<std::string> policies{"pure", "mixed"};
  // Rounding modes (nearest, zero, stochastic) every step of the policy uses; empty: each policy's
  // own (nearest for the readings, a custom policy's `rounding`).
  std::vector<Rounding> roundings;
  std::vector<int> seq_lens{256};
  std::vector<int> head_dims{64};
  std::vector<std::pair<int, int>> blocks{{32, 32}};  // (block_q, block_kv) pairs
  // SRAM sizes M (elements): when not empty, the tiles are derived from each M and head dim by each
  // of tile_rules (paper, swapped, square; kernels/microbench.hpp paper_tiles) instead of `blocks`.
  std::vector<int> sram;
  std::vector<std::string> tile_rules{"paper"};
  // launch = "pytorch": instead of blocks (or sram), the tiles, KV split and order PyTorch's FlashAttention-2
  // launch picks on a GPU of sm_count SMs (kernels/fa2_launch.hpp), and the fa2 reading runs that launch
  // step by step (kernels/detail/fa2_pytorch.hpp); its loop order is q_outer.
  Launch launch = Launch::blocks;
  int sm_count = kHopperSmCount;
  std::vector<LoopOrder> loop_orders{LoopOrder::kv_outer, LoopOrder::q_outer};
  std::vector<bool> causal{false};
  std::vector<Pass> passes{Pass::forward};
  int trials = 2;
  int batch = 1;
  int heads = 2;
  InputDistribution distribution = InputDistribution::normal;
  double outlier_fraction = 0.001;      // outliers: N(0,1) + N(0, outlier_scale^2) * Bernoulli(outlier_fraction)
  double outlier_scale = 10.0;          //   (FA3's recipe: N(0, 100) on 0.1% of entries)
  double sink_logit = 10.0;             // sink: the logit of key 0 for every query; repeated_max: of the repeated keys
  int repeated_keys = 4;                // repeated_max: the keys that share each row's largest logit (>= 2)
  // captured: Q, K, V of one attention layer of this study's own model, from a checkpoint of one of its
  // variants (in the output directory), on one global batch of the variant's data. The points take
  // the model's seq_len, head dim and heads and the variant's [train] batch.
  std::string captured_variant;         // a variant id of the study's grid
  std::int64_t captured_step = 0;       // the checkpoint's step; 0: the variant's last ([train] steps)
  int captured_layer = 0;               // 0-based block index
  std::int64_t captured_batch = 0;      // which global batch of the data stream (its data cursor)
  std::uint64_t seed = 7;
  // Where our own kernels run (docs/microbench.md "Real kernels"): "cpu" (always listed: the CPU kernels are the
  // reference the CUDA rows are checked against) and "cuda" (adds cuda_flash and cuda_baseline rows;
  // builds with the CUDA kernels, FASTUDY_CUDA_KERNELS, and a visible device).
  std::vector<std::string> devices{"cpu"};
  // The framework's own code on the same inputs (kRealCode, kernels/microbench.hpp): LibTorch's ops on
  // the CPU beside the sweep's points ("torch_baseline", "torch_baseline_before", "torch_flash"; formats
  // LibTorch runs on the CPU), and on the CUDA device LibTorch's SDPA with one backend each
  // ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math"), rows of policy "native" at the sweep's
  // formats (fp16 and bf16 only; builds with a CUDA LibTorch >= 2.3).
  std::vector<std::string> framework;
  // distribution = "file": the tensor file (safetensors, h5py HDF5 or torch.save) that holds q, k, v and,
  // for the backward pass, do, each [B, H, N, d] (jobs/microbench/file.hpp). Its shape replaces the
  // sweep's seq_lens, head_dims, batch and heads, and it runs one trial (every trial would read the same
  // tensors); a relative path is taken from the working directory, as [data] path.
  std::string input_file;
  // Every point's inputs and outputs into OUT/microbench_outputs.h5 (jobs/microbench/saved.hpp).
  bool save_outputs = false;
};

// [microbench] holds the defaults; each [[microbench.sweeps]] overrides some of them (e.g. the paper's
// format sweep, sequence-length sweep and block-area sweep). Without sweeps, [microbench] is one sweep.
struct MicrobenchConfig {
  std::vector<MicrobenchSweep> sweeps;
};

struct ReduceConfig {
  std::vector<std::string> metrics = default_pair_metrics();  // kPairMetrics' names (base/pair_metrics.hpp)
  std::vector<std::int64_t> steps;   // empty: every checkpoint step
  bool per_tensor = true;            // the distances of every tensor (false: the whole model's only)
  bool whole_model = true;           // the whole model's (false: no ranking or verdict, which rest on them)
  // The pairs of variants reduce computes: "verdict", those the ranking and the verdict use (the pairs
  // that differ in one axis), or "all"; pair_list (pairs = [["id_a", "id_b"], ...]) adds pairs to the
  // verdict's.
  std::string pairs = "verdict";
  std::vector<std::pair<std::string, std::string>> pair_list;
};

// What an axis is to the verdict (analysis/ranking.hpp):
//  - optimisation: a training optimisation or implementation choice, measured against its baseline
//    value (flash vs baseline attention, tf32 vs fp32 matmuls, ...);
//  - reference: a factor everyone already accepts (init seed, training precision), the yardstick;
//  - setting: a hyperparameter or input the other axes are compared under (init scheme, lr, ...);
//  - noise: the same variant again (`repeat`), whose distance is the noise floor.
enum class AxisRole { optimisation, reference, setting, noise };
// The grid axes, from the one table in grid.cpp that drives their validation, expansion, ids and
// resolved TOML: each axis's name, two allowed values as TOML (for help texts and tests), its role, its
// declared baseline value ("": the first value the grid lists) and whether it is a replicate axis (an
// independent draw such as the init or data seed: pairs that differ in another axis are grouped into
// conditions by every non-replicate axis, and replicate values give the independent pairs).
struct GridAxisInfo {
  std::string name;
  std::string example;
  AxisRole role = AxisRole::setting;
  std::string baseline;
  bool replicate = false;
};
// [import]: runs trained elsewhere (docs/import.md), read instead of training. `path` is a
// pattern over the grid's axes and the checkpoint step ("runs/{attention}-{precision}-s{seed}/
// step_{step}.safetensors"), made absolute against the grid file's folder at load; the format comes
// from the extension (io::TensorFile). Tensor names as the study sees them: every prefix of
// strip_prefix removed from the front (repeatedly, "module._orig_mod.x" -> "x"), then the rename table
// applied to the whole name; a name matching an exclude pattern (* and ? wildcards) is left out.
struct ImportConfig {
  std::string path;                           // absolute pattern; empty: the study trains its own runs
  std::vector<std::int64_t> steps;            // the steps to read; empty: every step whose files exist
  std::vector<std::string> strip_prefix;
  std::map<std::string, std::string> rename;  // stored name (after the strip) -> name in the study
  std::vector<std::string> exclude;
  bool present() const { return !path.empty(); }
  // The study's name of a stored tensor; nullopt when an exclude pattern matches it.
  std::optional<std::string> tensor_name(const std::string& stored) const;
  // `path` with the variant's axis values put in; {step} is left for the files to fill.
  std::string path_of(const std::vector<std::pair<std::string, std::string>>& axes) const;
};
// The placeholders of an import pattern, in order ("attention", "seed", "step", ...).
std::vector<std::string> import_placeholders(const std::string& pattern);
// Whether `name` matches a glob pattern of * (any run of characters) and ? (one character).
bool glob_match(const std::string& pattern, const std::string& name);

// One point of the grid: the axis values and the fully resolved configuration it trains with.
struct Variant {
  std::string id;  // e.g. "flash-bf16-s1-normal"
  std::vector<std::pair<std::string, std::string>> axes;  // (axis, value) in grid order
  AttentionKind attention = AttentionKind::flash;
  SdpaBackend sdpa = SdpaBackend::none;  // set: the framework's attention instead of `attention`
  Format precision = Format::fp32;
  std::uint64_t seed = 0;           // the init seed
  InitScheme init = InitScheme::normal;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  AttentionConfig attention_cfg;
  NumericsConfig numerics;
  std::string hash;                 // content hash (hex) of the resolved configuration
  std::string resolved_toml;        // the resolved configuration, as TOML
  const std::string& axis(const std::string& name) const;  // value of an axis ("" when absent)
  std::string attention_name() const;  // "baseline", "flash" or an SDPA kind
};

// The limits of what a grid (and a study.toml) may be, checked before anything is parsed or expanded
// (docs/reliability.md): its size in bytes, the depth of its tables (table headers, dotted keys,
// arrays and inline tables, one level each), and the variants it lists unless [study] max_variants
// says otherwise. Expanding 10,000 variants takes about 0.6 s and 180 MB, 100,000 about 3 s and 360 MB.
inline constexpr std::size_t kMaxGridBytes = std::size_t{4} << 20;
inline constexpr std::size_t kMaxTomlDepth = 64;
inline constexpr std::uint64_t kDefaultMaxVariants = 10000;

struct Study {
  std::string file;                    // the grid.toml path it came from
  std::string name = "study";
  std::string out = "fastudy-out";     // output directory (relative to the working directory)
  std::vector<std::string> phases{"microbench", "train", "reduce", "report"};
  // The preflight refuses a grid whose estimated training memory per rank exceeds what a rank can have;
  // `[study] memory_check = false` overrides it (the estimate can be pessimistic).
  bool memory_check = true;
  // The most variants a grid may list (listed_variants, counted before anything is expanded); a larger
  // grid is refused at load. `[study] max_variants = N` raises (or lowers) it.
  std::uint64_t max_variants = kDefaultMaxVariants;
  // Every grid axis with the values its variants take: [grid]'s own axes first (in file order), then
  // the [[grid.vary]] axes in order of first appearance, each with its baseline first.
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  std::size_t crossed_axes = 0;  // the first crossed_axes entries of `axes` are [grid]'s own
  // [[grid.vary]]: each table's axes (with the values it lists) are crossed with [grid]'s axes while
  // every other vary axis stays at its baseline (the declared one, or the first value listed for it).
  // Empty: the variants are the cross product of `axes`.
  std::vector<std::vector<std::pair<std::string, std::vector<std::string>>>> vary;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  AttentionConfig attention;
  NumericsConfig numerics;
  MicrobenchConfig microbench;
  ReduceConfig reduce;
  ImportConfig import;
  // [axes.NAME] of an imported study: axes beyond the table (role, baseline, replicate as declared),
  // and the declared baseline of a table axis whose grid values are the user's own words.
  std::vector<GridAxisInfo> declared_axes;
  std::vector<Variant> variants;
  std::string hash;                    // content hash of the whole resolved study
  std::string resolved_toml;           // the whole resolved study, as TOML (defaults filled in)

  bool has_phase(const std::string& p) const;
  const Variant* find_variant(const std::string& id) const;
  bool imported() const { return import.present(); }
};

// Variant `base` of study `st` with some axes set to other values (`fastudy replay --set AXIS=VALUE`):
// each axis must be one of fastudy's grid axes (known_axes) and each value one the axis allows in this
// study (a word it lists, a policy of the study, an integer in range, a positive number); the
// training-loop keys are checked against the batch as when the grid loads. The id gets
// "+AXIS=VALUE" per axis set; the resolved TOML and the hash are those of the new configuration.
// Throws UsageError naming the axis or the value, with the allowed ones.
Variant variant_with(const Study& st, const Variant& base, const std::vector<std::pair<std::string, std::string>>& set);
// The grid axes fastudy knows, with what each overrides.
const std::vector<std::string>& known_axes();
const char* axis_role_name(AxisRole role);  // "optimisation", "reference", "setting", "noise"

std::vector<GridAxisInfo> grid_axes();
// The table's row of an axis; nullptr for an unknown name.
const GridAxisInfo* find_grid_axis(const std::string& name);
// An axis of a study as the verdict sees it: the study's [axes.NAME] declaration, else the table's row,
// else a setting without a declared baseline.
GridAxisInfo study_axis(const Study& st, const std::string& name);
// The phases an imported study may run: reduce and report.
const std::vector<std::string>& import_phases();
// Every phase name, in run order: microbench, train, reduce, report.
const std::vector<std::string>& known_phases();

// The grid's design in one line: "attention[2] x seed[3]"; with [[grid.vary]] tables,
// "seed[3] x (attention[2] | matmul[3])" (each table's lists, before the shared variants are merged).
std::string grid_shape(const Study& st);
// The variants the grid lists, counted from its axis sizes without expanding them: the product of the
// axes' sizes, or with [[grid.vary]] tables the sum over the tables of their products (a variant that two
// tables both produce, such as the all-baseline one, counted once per table); saturates at UINT64_MAX.
std::uint64_t listed_variants(const Study& st);

// Parse, validate and expand. Throws ConfigError. load_study reads the grid file only when it is a
// regular file of at most kMaxGridBytes, and refuses one that sets nothing (empty, blanks or comments
// only: /dev/null, a file truncated to nothing). parse_study refuses a text larger than kMaxGridBytes
// or nested deeper than kMaxTomlDepth before the TOML parser sees it, and a grid that lists more than
// [study] max_variants variants before any is expanded.
Study load_study(const std::string& path);
Study parse_study(const std::string& toml_text, const std::string& source_name);

// The settings whose values differ between two studies' resolved configurations (study.toml), one
// line each in the order of the text: "train.lr: 0.003 -> 0.004", "grid.seed: [ 1, 2 ] -> [ 1, 2, 3 ]",
// "attention.policies.x.s: (unset) -> 'bf16'". [study] out (where the grid said the study lives, not
// what it computes) is not compared. Empty: the same configuration.
std::vector<std::string> configuration_differences(const Study& before, const Study& after);

// The resolved policy of a reading or custom policy `name` for attention kind `kind` in format f.
PrecisionPolicy resolve_policy(const AttentionConfig& cfg, const std::string& name, Format f, AttentionKind kind);
// Both kinds' (a microbenchmark point runs both).
ReadingPolicies resolve_reading(const AttentionConfig& cfg, const std::string& name, Format f);

// 64-bit FNV-1a of a string, as 16 hex digits: the content hash used for configs.
std::string content_hash(const std::string& text);

}  // namespace fastudy
