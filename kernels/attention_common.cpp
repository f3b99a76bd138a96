// The readings (kReadings: a row and a policy function each, one policy per attention kind), the
// names of attention kinds, loop orders, flash kernels, scale placements and quantizations, and the
// fp64 golden reference (naive loops, no rounding) that every fast kernel is validated against.
//
// B batch, H heads, N sequence, d head dim; tensors are contiguous [B, H, N, d], lse is [B, H, N].
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/error.hpp"
#include "kernels/attention.hpp"

namespace fastudy {

namespace {

// Every format of a policy set to f, the classes then set per reading.
PrecisionPolicy storage_policy(std::string_view name, Format f) {
  PrecisionPolicy p;
  p.name = std::string(name);
  p.q = p.k = p.v = p.s = p.p = p.o = p.grad = f;
  p.accum = p.stats = p.softmax = p.division = f;
  p.stats_running = p.rescale = p.o_running = p.exp_arg = f;
  return p;
}

// fp32 inside ops and in registers, or f itself when f is wider than fp32 (only fp64 is).
Format fp32_or_wider(Format f) { return f == Format::fp64 ? Format::fp64 : Format::fp32; }

void in_op_fp32(PrecisionPolicy& p, Format f) { p.accum = p.stats = p.softmax = p.division = fp32_or_wider(f); }
void state_fp32(PrecisionPolicy& p, Format f) {
  p.stats_running = p.rescale = p.o_running = p.exp_arg = fp32_or_wider(f);
}

bool is_fp8(Format f) { return f == Format::fp8_e4m3 || f == Format::fp8_e5m2; }

// The framework baseline as PyTorch users write it: softmax((q @ k.T) * scale) @ v on tensors of f.
// Each op computes in fp32 inside and rounds its output to f (S twice: after the matmul and after the
// scaling). The state steps are flash's and unused here; they stay in f (eager's static rounding).
PrecisionPolicy framework_baseline(std::string_view name, Format f) {
  PrecisionPolicy p = storage_policy(name, f);
  in_op_fp32(p, f);
  p.scale = ScalePlacement::after;
  return p;
}

// A flash kernel (fa2, fa3) at fp16/bf16 (and, as a hypothetical, any wider f): Q, K, V, P as the P.V
// operand, O and the gradients in f; the score tile, statistics and running state in fp32 registers.
PrecisionPolicy kernel_flash(std::string_view name, Format f, FlashKernel kernel) {
  PrecisionPolicy p = storage_policy(name, f);
  in_op_fp32(p, f);
  state_fp32(p, f);
  p.s = fp32_or_wider(f);
  p.kernel = kernel;
  return p;
}

// FA3's FP8 path (hopper/flash_api.cpp: e4m3 inputs; flash_fwd_launch_template.h: T_out = bf16):
// flash = Q, K, V quantized per block with incoherent processing, P in f with Max_offset, O in bf16;
// baseline = standard attention in FP8 (FA3 §4.3: "per-tensor scaling, with matmul accumulator in
// FP32 and intermediate softmax results kept in FP16"), per head here, S and P in fp16, O in bf16.
PrecisionPolicy fa3_fp8(std::string_view name, Format f, AttentionKind kind) {
  if (kind == AttentionKind::flash) {
    PrecisionPolicy p = kernel_flash(name, f, FlashKernel::fa3);
    p.o = p.grad = Format::bf16;
    p.quantization = Quantization::block;
    p.incoherent = true;
    return p;
  }
  PrecisionPolicy p = framework_baseline(name, f);
  p.s = p.p = Format::fp16;
  p.o = p.grad = Format::bf16;
  p.quantization = Quantization::head;
  return p;
}

// ---- the readings: one policy function each, then their table -------------------------------------

PrecisionPolicy pure_policy(std::string_view name, Format f, AttentionKind) { return storage_policy(name, f); }

PrecisionPolicy eager_policy(std::string_view name, Format f, AttentionKind kind) {
  if (kind == AttentionKind::baseline) return framework_baseline(name, f);
  PrecisionPolicy p = storage_policy(name, f);
  in_op_fp32(p, f);
  p.scale = ScalePlacement::after;  // S = (q @ k.T) * scale per tile, as a re-implementation writes it
  return p;
}

PrecisionPolicy fa2_policy(std::string_view name, Format f, AttentionKind kind) {
  return kind == AttentionKind::flash ? kernel_flash(name, f, FlashKernel::fa2) : framework_baseline(name, f);
}

PrecisionPolicy fa3_policy(std::string_view name, Format f, AttentionKind kind) {
  if (is_fp8(f)) return fa3_fp8(name, f, kind);
  return kind == AttentionKind::flash ? kernel_flash(name, f, FlashKernel::fa3) : framework_baseline(name, f);
}

PrecisionPolicy mixed_policy(std::string_view name, Format f, AttentionKind kind) {
  if (kind == AttentionKind::baseline) return framework_baseline(name, f);
  PrecisionPolicy p = storage_policy(name, f);
  in_op_fp32(p, f);
  state_fp32(p, f);
  return p;
}

// The readings (kernels/attention.hpp says what each models and how the table is read). `.cuda`: the
// CUDA kernels' dispatch (kernels/cuda/tile_dispatch.hpp) takes the reading's policies of fp32, fp16 and
// bf16, both kinds (tests/gpu/test_tile_math.cpp checks the field against it).
constexpr Reading kReadingRows[] = {
    {.name = "pure",
     .models = "every step in the format, every add of every accumulation rounded",
     .source = "",
     .policy = pure_policy,
     .cuda = true,
     .report = "every step in the format, every add of every accumulation rounded"},
    {.name = "eager",
     .models = "framework ops (PyTorch) in the format: fp32 inside each op; op outputs and flash's running state "
               "in the format",
     .source = "PyTorch eager ops on bf16/fp16 tensors (aten's opmath_t: fp32 inside each op, its output rounded)",
     .policy = eager_policy,
     .cuda = true,
     .report = "a framework-level re-implementation (PyTorch ops on bf16/fp16 tensors): each op in fp32, its output "
               "and flash's state between key/value tiles in the format"},
    {.name = "fa2",
     .models = "the FlashAttention-2 CUDA kernel: S, statistics and running O in fp32 registers, P rounded only "
               "for P.V, scale folded into exp2, KV blocks last to first",
     .source = "Dao-AILab/flash-attention csrc/flash_attn/src (flash_fwd_kernel.h, flash_bwd_kernel.h, softmax.h)",
     .policy = fa2_policy,
     .cuda = true,
     .report = "the FlashAttention-2 CUDA kernel"},
    {.name = "fa3",
     .models = "the FlashAttention-3 Hopper kernel: as fa2 at fp16/bf16; at fp8 its FP8 path (block "
               "quantization, incoherent processing, P in fp8)",
     .source = "Dao-AILab/flash-attention hopper/ (softmax.h, mainloop_fwd_sm90_tma_gmma_ws.hpp, flash_api.cpp, "
               "flash_fwd_launch_template.h); FlashAttention-3 paper §3.3, §4.3",
     .policy = fa3_policy,
     .cuda = true,
     .report = "the FlashAttention-3 Hopper kernel"},
    {.name = "mixed",
     .models = "hypothetical (no known kernel): storage in the format, S included; inside ops and running "
               "state in fp32",
     .source = "",
     .policy = mixed_policy,
     .cuda = true,
     .report = "a hypothetical reading: storage in the format, in-op values and running state in fp32; no known "
               "kernel does exactly this"},
};

}  // namespace

const ReadingTable kReadings{kReadingRows, sizeof kReadingRows / sizeof kReadingRows[0]};

const Reading* find_reading(std::string_view name) {
  for (const Reading& r : kReadings)
    if (r.name == name) return &r;
  return nullptr;
}

Format input_format(const PrecisionPolicy& p, Format storage) {
  return p.quantization == Quantization::none ? storage : Format::fp32;
}

PrecisionPolicy make_policy(std::string_view preset, Format f, AttentionKind kind) {
  if (const Reading* r = find_reading(preset)) return r->policy(preset, f, kind);
  throw Error("unknown precision policy preset '" + std::string(preset) + "'",
              "use one of: " + policy_preset_names() + ", or define [attention.policies." + std::string(preset) +
                  "] in the grid file");
}

ReadingPolicies make_reading(std::string_view preset, Format f) {
  return {make_policy(preset, f, AttentionKind::flash), make_policy(preset, f, AttentionKind::baseline)};
}

std::string policy_preset_names() {
  std::string names;
  for (const Reading& r : kReadings) names += (names.empty() ? "" : ", ") + std::string(r.name);
  return names;
}

std::string cuda_reading_names() {
  std::vector<std::string_view> names;
  for (const Reading& r : kReadings)
    if (r.cuda) names.push_back(r.name);
  std::string out;
  for (std::size_t k = 0; k < names.size(); ++k)
    out += (k == 0 ? "" : k + 1 == names.size() ? " and " : ", ") + std::string(names[k]);
  return out;
}

bool is_policy_preset(std::string_view name) { return find_reading(name) != nullptr; }

const PolicyStep* find_policy_step(std::string_view name) {
  for (const auto& step : kPolicySteps)
    if (step.name == name) return &step;
  return nullptr;
}

std::string_view to_string(AttentionKind k) {
  switch (k) {
    case AttentionKind::baseline: return "baseline";
    case AttentionKind::flash: return "flash";
  }
  return "unknown";
}

std::optional<AttentionKind> parse_attention_kind(std::string_view name) {
  if (name == "baseline") return AttentionKind::baseline;
  if (name == "flash") return AttentionKind::flash;
  return std::nullopt;
}

std::string_view to_string(LoopOrder o) {
  switch (o) {
    case LoopOrder::kv_outer: return "kv_outer";
    case LoopOrder::q_outer: return "q_outer";
  }
  return "unknown";
}

std::optional<LoopOrder> parse_loop_order(std::string_view name) {
  if (name == "kv_outer") return LoopOrder::kv_outer;
  if (name == "q_outer") return LoopOrder::q_outer;
  return std::nullopt;
}

std::string_view to_string(FlashKernel k) {
  switch (k) {
    case FlashKernel::framework: return "framework";
    case FlashKernel::fa2: return "fa2";
    case FlashKernel::fa3: return "fa3";
  }
  return "unknown";
}

std::optional<FlashKernel> parse_flash_kernel(std::string_view name) {
  for (FlashKernel k : {FlashKernel::framework, FlashKernel::fa2, FlashKernel::fa3})
    if (to_string(k) == name) return k;
  return std::nullopt;
}

std::string_view to_string(ScalePlacement s) {
  switch (s) {
    case ScalePlacement::fused: return "fused";
    case ScalePlacement::after: return "after";
    case ScalePlacement::before: return "before";
  }
  return "unknown";
}

std::string_view to_string(FrameworkOps o) {
  switch (o) {
    case FrameworkOps::libtorch1_cpu: return "libtorch1_cpu";
    case FrameworkOps::libtorch1_cpublas: return "libtorch1_cpublas";
    case FrameworkOps::opmath: break;
  }
  return "opmath";
}

std::optional<ScalePlacement> parse_scale_placement(std::string_view name) {
  for (ScalePlacement s : {ScalePlacement::fused, ScalePlacement::after, ScalePlacement::before})
    if (to_string(s) == name) return s;
  return std::nullopt;
}

std::string_view to_string(Quantization q) {
  switch (q) {
    case Quantization::none: return "none";
    case Quantization::head: return "head";
    case Quantization::block: return "block";
  }
  return "unknown";
}

std::optional<Quantization> parse_quantization(std::string_view name) {
  for (Quantization q : {Quantization::none, Quantization::head, Quantization::block})
    if (to_string(q) == name) return q;
  return std::nullopt;
}

namespace {

double reference_scale(const AttentionShape& shape) {
  return shape.scale != 0.0 ? shape.scale : 1.0 / std::sqrt(static_cast<double>(shape.head_dim));
}

// Row i of the softmax matrix P of one head: p[j] for j < N (0 where masked); returns lse.
double reference_softmax_row(const AttentionShape& shape, const double* q, const double* k, std::int64_t i,
                             std::vector<double>& p) {
  const std::int64_t n = shape.seq_len, d = shape.head_dim;
  const double scale = reference_scale(shape);
  const std::int64_t j_end = shape.causal ? i + 1 : n;
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < n; ++j) {
    if (j >= j_end) {
      p[j] = -std::numeric_limits<double>::infinity();
      continue;
    }
    double s = 0;
    for (std::int64_t t = 0; t < d; ++t) s += q[i * d + t] * k[j * d + t];
    p[j] = s * scale;
    m = std::max(m, p[j]);
  }
  double l = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    p[j] = j < j_end ? std::exp(p[j] - m) : 0.0;
    l += p[j];
  }
  for (std::int64_t j = 0; j < n; ++j) p[j] /= l;
  return m + std::log(l);
}

}  // namespace

void attention_forward_reference(const AttentionShape& shape, const double* q, const double* k, const double* v,
                                 double* o, double* lse) {
  const std::int64_t n = shape.seq_len, d = shape.head_dim;
  std::vector<double> p(n);
  for (std::int64_t h = 0; h < shape.batch * shape.heads; ++h) {
    const std::int64_t off = h * n * d;
    for (std::int64_t i = 0; i < n; ++i) {
      const double row_lse = reference_softmax_row(shape, q + off, k + off, i, p);
      if (lse) lse[h * n + i] = row_lse;
      for (std::int64_t t = 0; t < d; ++t) {
        double acc = 0;
        for (std::int64_t j = 0; j < n; ++j) acc += p[j] * v[off + j * d + t];
        o[off + i * d + t] = acc;
      }
    }
  }
}

void attention_backward_reference(const AttentionShape& shape, const double* q, const double* k, const double* v,
                                  const double* dout, double* dq, double* dk, double* dv) {
  const std::int64_t n = shape.seq_len, d = shape.head_dim;
  const double scale = reference_scale(shape);
  std::vector<double> p(n), ds(n);
  for (std::int64_t h = 0; h < shape.batch * shape.heads; ++h) {
    const std::int64_t off = h * n * d;
    std::fill(dq + off, dq + off + n * d, 0.0);
    std::fill(dk + off, dk + off + n * d, 0.0);
    std::fill(dv + off, dv + off + n * d, 0.0);
    for (std::int64_t i = 0; i < n; ++i) {
      reference_softmax_row(shape, q + off, k + off, i, p);
      // dP_ij = dO_i . V_j;  D_i = sum_j P_ij dP_ij;  dS_ij = P_ij (dP_ij - D_i)
      double row_d = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        double dp = 0;
        for (std::int64_t t = 0; t < d; ++t) dp += dout[off + i * d + t] * v[off + j * d + t];
        ds[j] = dp;
        row_d += p[j] * dp;
      }
      for (std::int64_t j = 0; j < n; ++j) {
        ds[j] = p[j] * (ds[j] - row_d);
        for (std::int64_t t = 0; t < d; ++t) {
          dv[off + j * d + t] += p[j] * dout[off + i * d + t];
          dq[off + i * d + t] += scale * ds[j] * k[off + j * d + t];
          dk[off + j * d + t] += scale * ds[j] * q[off + i * d + t];
        }
      }
    }
  }
}

}  // namespace fastudy
