// The GPT-style decoder, its emulated Linear and rounding functions, and the kernel-backed attention
// (custom autograd functions). See model.hpp for the emulation rules.
// Shapes: B batch, H heads, N sequence, d head dim, D = H*d, V vocab.
#include "src/train/model.hpp"

#include <cmath>

#include "base/error.hpp"
#include "src/train/rng.hpp"

namespace fastudy::train {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr std::int64_t kNoRounding = -1;  // a format slot that rounds nothing

std::int64_t format_code(bool enabled, Format f) { return enabled ? static_cast<std::int64_t>(f) : kNoRounding; }

// Round a fresh contiguous tensor in place (float or double container).
void round_tensor_inplace(torch::Tensor& t, Format f) {
  if (t.scalar_type() == torch::kDouble) {
    round_inplace(f, t.data_ptr<double>(), static_cast<std::size_t>(t.numel()));
  } else {
    round_inplace(f, t.data_ptr<float>(), static_cast<std::size_t>(t.numel()));
  }
}

torch::Tensor round_if(const torch::Tensor& t, std::int64_t code) {
  return code == kNoRounding ? t : round_copy(t, static_cast<Format>(code));
}

struct LinearFn : public torch::autograd::Function<LinearFn> {
  // x [M, in], w [out, in], b [out] or empty (no bias; autograd functions take no undefined inputs)
  // -> [M, out].
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor w, torch::Tensor b,
                               std::int64_t in_code, std::int64_t store_code, bool x_in_format, bool grad_in_format) {
    const torch::Tensor xr = x_in_format ? x : round_if(x, in_code);
    const torch::Tensor wr = round_if(w, in_code);
    const bool has_bias = b.numel() > 0;
    torch::Tensor y = has_bias ? torch::addmm(round_if(b, store_code), xr, wr.t()) : torch::mm(xr, wr.t());
    if (store_code != kNoRounding) round_tensor_inplace(y, static_cast<Format>(store_code));
    ctx->save_for_backward({xr, wr});
    ctx->saved_data["in"] = in_code;
    ctx->saved_data["store"] = store_code;
    ctx->saved_data["bias"] = has_bias;
    ctx->saved_data["grad_in_format"] = grad_in_format;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& xr = saved[0];
    const torch::Tensor& wr = saved[1];
    const std::int64_t in_code = ctx->saved_data["in"].toInt();
    const std::int64_t store_code = ctx->saved_data["store"].toInt();
    const torch::Tensor g = ctx->saved_data["grad_in_format"].toBool()
                                ? grads[0].contiguous()
                                : round_if(grads[0].contiguous(), in_code);  // the backward matmuls' input
    torch::Tensor gx = torch::mm(g, wr);
    torch::Tensor gw = torch::mm(g.t(), xr);
    torch::Tensor gb;
    if (ctx->saved_data["bias"].toBool()) gb = g.sum(0);
    if (store_code != kNoRounding) {
      const auto f = static_cast<Format>(store_code);
      round_tensor_inplace(gx, f);
      round_tensor_inplace(gw, f);
      if (gb.defined()) round_tensor_inplace(gb, f);
    }
    return {gx, gw, gb, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

struct RoundFn : public torch::autograd::Function<RoundFn> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, std::int64_t code) {
    ctx->saved_data["code"] = code;
    return round_copy(x, static_cast<Format>(code));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {round_copy(grads[0], static_cast<Format>(ctx->saved_data["code"].toInt())), torch::Tensor()};
  }
};

template <class T>
void attention_forward_typed(const AttentionShape& shape, const AttentionParams& params, const torch::Tensor& packed,
                             torch::Tensor& o, torch::Tensor& lse) {
  const std::int64_t n = packed.numel() / 3;
  const T* q = packed.data_ptr<T>();
  attention_forward<T>(shape, params, q, q + n, q + 2 * n, o.data_ptr<T>(), lse.defined() ? lse.data_ptr<T>() : nullptr);
}

void run_attention_forward(const AttentionShape& shape, const AttentionParams& params, const torch::Tensor& packed,
                           torch::Tensor& o, torch::Tensor& lse) {
  if (packed.scalar_type() == torch::kDouble) {
    attention_forward_typed<double>(shape, params, packed, o, lse);
  } else {
    attention_forward_typed<float>(shape, params, packed, o, lse);
  }
}

template <class T>
void attention_backward_typed(const AttentionShape& shape, const AttentionParams& params, const torch::Tensor& packed,
                              const torch::Tensor& o, const torch::Tensor& lse, const torch::Tensor& dout,
                              torch::Tensor& dpacked) {
  const std::int64_t n = packed.numel() / 3;
  const T* q = packed.data_ptr<T>();
  T* dq = dpacked.data_ptr<T>();
  attention_backward<T>(shape, params, q, q + n, q + 2 * n, o.data_ptr<T>(), lse.data_ptr<T>(), dout.data_ptr<T>(), dq,
                        dq + n, dq + 2 * n);
}

// The step's params for one layer: its own stochastic-rounding streams (the step's seed mixed with
// the layer index; forward and backward of a layer share it, the kernels split them).
AttentionParams layer_params(const AttentionParams& step_params, std::int64_t layer) {
  AttentionParams p = step_params;
  p.rounding_seed ^= 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(layer + 1);
  return p;
}

struct AttentionFn : public torch::autograd::Function<AttentionFn> {
  // qkv [B, N, 3D] -> [B, N, D]. `setup` is an AttentionSetup* carried as an integer (it outlives the
  // step, see kernel_attention).
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor qkv, std::int64_t heads, std::int64_t setup_bits,
                               std::int64_t layer) {
    const auto* setup = reinterpret_cast<const AttentionSetup*>(static_cast<std::intptr_t>(setup_bits));
    const std::int64_t B = qkv.size(0), N = qkv.size(1), D = qkv.size(2) / 3, d = D / heads;
    const AttentionShape shape{B, heads, N, d, /*causal=*/true, /*scale=*/0.0};
    // [B, N, 3, H, d] -> [3, B, H, N, d]: q, k, v each contiguous [B, H, N, d].
    const torch::Tensor packed = qkv.view({B, N, 3, heads, d}).permute({2, 0, 3, 1, 4}).contiguous();
    torch::Tensor o = torch::empty({B, heads, N, d}, qkv.options());
    torch::Tensor lse = torch::empty({B, heads, N}, qkv.options());
    const AttentionParams params = layer_params(setup->params, layer);
    if (setup->capture != nullptr && setup->capture_layer == layer) {
      CapturedAttention& cap = *setup->capture;
      cap.batch = B;
      cap.heads = heads;
      cap.seq_len = N;
      cap.head_dim = d;
      const torch::Tensor wide = packed.to(torch::kDouble).contiguous();
      const double* x = wide.data_ptr<double>();
      const std::int64_t n = wide.numel() / 3;
      cap.q.assign(x, x + n);
      cap.k.assign(x + n, x + 2 * n);
      cap.v.assign(x + 2 * n, x + 3 * n);
    }
    run_attention_forward(shape, params, packed, o, lse);
    if (setup->shadow && setup->shadow_sink != nullptr) {
      AttentionParams other = params;
      other.attention = other.attention == AttentionKind::flash ? AttentionKind::baseline : AttentionKind::flash;
      torch::Tensor o_other = torch::empty_like(o);
      torch::Tensor no_lse;
      run_attention_forward(shape, other, packed, o_other, no_lse);
      const torch::Tensor diff = (o - o_other).abs().to(torch::kDouble);
      setup->shadow_sink->push_back(
          {static_cast<int>(layer), diff.max().item<double>(), diff.mean().item<double>()});
    }
    ctx->save_for_backward({packed, o, lse});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["setup"] = setup_bits;
    ctx->saved_data["layer"] = layer;
    return o.permute({0, 2, 1, 3}).reshape({B, N, D});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& packed = saved[0];
    const torch::Tensor& o = saved[1];
    const torch::Tensor& lse = saved[2];
    const auto* setup =
        reinterpret_cast<const AttentionSetup*>(static_cast<std::intptr_t>(ctx->saved_data["setup"].toInt()));
    const std::int64_t heads = ctx->saved_data["heads"].toInt();
    const std::int64_t B = o.size(0), N = o.size(2), d = o.size(3), D = heads * d;
    const AttentionShape shape{B, heads, N, d, /*causal=*/true, /*scale=*/0.0};
    const torch::Tensor dout = grads[0].view({B, N, heads, d}).permute({0, 2, 1, 3}).contiguous();
    torch::Tensor dpacked = torch::empty_like(packed);
    const AttentionParams params = layer_params(setup->params, ctx->saved_data["layer"].toInt());
    if (packed.scalar_type() == torch::kDouble) {
      attention_backward_typed<double>(shape, params, packed, o, lse, dout, dpacked);
    } else {
      attention_backward_typed<float>(shape, params, packed, o, lse, dout, dpacked);
    }
    // [3, B, H, N, d] -> [B, N, 3, H, d] -> [B, N, 3D]
    return {dpacked.permute({1, 3, 0, 2, 4}).reshape({B, N, 3 * D}), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

// Index of each parameter inside a block, in module-path order.
enum BlockParam : std::size_t {
  kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kMlpProjW, kMlpProjB, kBlockParams
};

}  // namespace

Emulation Emulation::of(Format precision) {
  Emulation e;
  e.precision = precision;
  e.dtype = precision == Format::fp64 ? torch::kDouble : torch::kFloat;
  e.round_matmul_inputs = precision != Format::fp64 && precision != Format::fp32;
  e.round_storage = e.round_matmul_inputs && precision != Format::tf32;
  return e;
}

torch::Tensor round_copy(const torch::Tensor& t, Format f) {
  torch::Tensor c = t.is_contiguous() ? t.clone(torch::MemoryFormat::Contiguous) : t.contiguous();
  const bool identity = f == Format::fp64 || (f == Format::fp32 && c.scalar_type() == torch::kFloat);
  if (!identity) round_tensor_inplace(c, f);
  return c;
}

torch::Tensor emulated_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                              const Emulation& e, bool x_in_format, bool grad_in_format) {
  std::vector<std::int64_t> shape = x.sizes().vec();
  const torch::Tensor x2 = x.reshape({-1, shape.back()});
  shape.back() = w.size(0);
  const torch::Tensor bias = b.defined() ? b : torch::empty({0}, x.options());
  return LinearFn::apply(x2, w, bias, format_code(e.round_matmul_inputs, e.precision),
                         format_code(e.round_storage, e.precision), x_in_format, grad_in_format)
      .view(shape);
}

torch::Tensor round_activation(const torch::Tensor& x, const Emulation& e) {
  if (!e.round_storage) return x;
  return RoundFn::apply(x, static_cast<std::int64_t>(e.precision));
}

torch::Tensor kernel_attention(const torch::Tensor& qkv, int heads, const AttentionSetup& setup, int layer) {
  return AttentionFn::apply(qkv, static_cast<std::int64_t>(heads),
                            static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&setup)),
                            static_cast<std::int64_t>(layer));
}

Gpt::Gpt(const ModelConfig& c, torch::Dtype dtype) : config_(c) {
  if (c.vocab < 2 || c.d_model < 1 || c.heads < 1 || c.layers < 1 || c.seq_len < 1 || c.mlp_ratio < 1 ||
      c.d_model % c.heads != 0) {
    throw Error("[model] vocab = " + std::to_string(c.vocab) + ", d_model = " + std::to_string(c.d_model) +
                    ", heads = " + std::to_string(c.heads) + ", layers = " + std::to_string(c.layers) +
                    ", seq_len = " + std::to_string(c.seq_len) + ", mlp_ratio = " + std::to_string(c.mlp_ratio) +
                    " does not describe a model",
                "all sizes must be positive and d_model a multiple of heads");
  }
  const std::int64_t D = c.d_model, F = static_cast<std::int64_t>(c.mlp_ratio) * D;
  const auto opts = torch::TensorOptions().dtype(dtype);
  auto add = [&](const std::string& name, std::vector<std::int64_t> shape) {
    params_.emplace_back(name, torch::zeros(shape, opts).set_requires_grad(true));
  };
  add("tok_emb.weight", {c.vocab, D});
  add("pos_emb.weight", {c.seq_len, D});
  for (int i = 0; i < c.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    add(b + "ln1.weight", {D});
    add(b + "ln1.bias", {D});
    add(b + "attn.qkv.weight", {3 * D, D});
    add(b + "attn.qkv.bias", {3 * D});
    add(b + "attn.proj.weight", {D, D});
    add(b + "attn.proj.bias", {D});
    add(b + "ln2.weight", {D});
    add(b + "ln2.bias", {D});
    add(b + "mlp.fc.weight", {F, D});
    add(b + "mlp.fc.bias", {F});
    add(b + "mlp.proj.weight", {D, F});
    add(b + "mlp.proj.bias", {D});
  }
  add("ln_f.weight", {D});
  add("ln_f.bias", {D});
  add("lm_head.weight", {c.vocab, D});
}

void Gpt::init(const std::string& scheme, std::uint64_t seed) {
  if (scheme != "normal" && scheme != "xavier_uniform" && scheme != "kaiming_normal" && scheme != "scaled") {
    throw Error("init = \"" + scheme + "\" is not an init scheme",
                "use normal, xavier_uniform, kaiming_normal or scaled");
  }
  const double residual_scale = 1.0 / std::sqrt(2.0 * config_.layers);
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : params_) {
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    const std::int64_t n = tensor.numel();
    std::vector<float> values(static_cast<std::size_t>(n), 0.0f);
    Rng rng(seed, fnv1a64(name));
    const bool embedding = name == "tok_emb.weight" || name == "pos_emb.weight";
    if (ends_with(".bias")) {
      // zeros
    } else if (name.rfind("ln_f.", 0) == 0 || name.find(".ln") != std::string::npos) {
      std::fill(values.begin(), values.end(), 1.0f);  // LayerNorm gain
    } else if (embedding || scheme == "normal" || scheme == "scaled") {
      double stddev = 0.02;
      if (scheme == "scaled" && (ends_with("attn.proj.weight") || ends_with("mlp.proj.weight"))) {
        stddev *= residual_scale;
      }
      for (auto& x : values) x = static_cast<float>(stddev * rng.normal());
    } else {
      const double fan_out = static_cast<double>(tensor.size(0)), fan_in = static_cast<double>(tensor.size(1));
      if (scheme == "xavier_uniform") {
        const double a = std::sqrt(6.0 / (fan_in + fan_out));
        for (auto& x : values) x = static_cast<float>(a * (2.0 * rng.uniform() - 1.0));
      } else {  // kaiming_normal: fan_in mode, ReLU gain sqrt(2) (torch's default)
        const double stddev = std::sqrt(2.0 / fan_in);
        for (auto& x : values) x = static_cast<float>(stddev * rng.normal());
      }
    }
    tensor.copy_(torch::from_blob(values.data(), tensor.sizes(), torch::kFloat));
  }
}

torch::Tensor Gpt::loss(const torch::Tensor& tokens, const Emulation& e, const AttentionSetup& attention) const {
  const std::int64_t N = config_.seq_len, D = config_.d_model;
  const torch::Tensor inputs = tokens.narrow(1, 0, N);
  const torch::Tensor targets = tokens.narrow(1, 1, N).reshape({-1});
  // Inputs and gradients that arrive already in the format skip a second (idempotent) rounding: the
  // attention output (stored in policy.o), GELU's output, and the attention's dQKV (policy.grad).
  const bool attention_out_in_format = attention.params.policy.o == e.precision;
  const bool attention_grad_in_format = attention.params.policy.grad == e.precision;
  torch::Tensor x = torch::embedding(p(0), inputs) + p(1);  // [B, N, D]
  for (int i = 0; i < config_.layers; ++i) {
    const std::size_t o = 2 + static_cast<std::size_t>(i) * kBlockParams;
    torch::Tensor h = torch::layer_norm(x, {D}, p(o + kLn1W), p(o + kLn1B), 1e-5);
    h = emulated_linear(h, p(o + kQkvW), p(o + kQkvB), e, false, attention_grad_in_format);  // [B, N, 3D]
    h = kernel_attention(h, config_.heads, attention, i);                                  // [B, N, D]
    x = x + emulated_linear(h, p(o + kProjW), p(o + kProjB), e, attention_out_in_format);
    h = torch::layer_norm(x, {D}, p(o + kLn2W), p(o + kLn2B), 1e-5);
    h = emulated_linear(h, p(o + kFcW), p(o + kFcB), e);
    h = round_activation(torch::gelu(h), e);
    x = x + emulated_linear(h, p(o + kMlpProjW), p(o + kMlpProjB), e, e.round_storage);
  }
  const std::size_t f = 2 + static_cast<std::size_t>(config_.layers) * kBlockParams;
  x = torch::layer_norm(x, {D}, p(f), p(f + 1), 1e-5);
  const torch::Tensor logits = emulated_linear(x, p(f + 2), torch::Tensor(), e);  // [B, N, V]
  return torch::nn::functional::cross_entropy(logits.reshape({-1, config_.vocab}), targets);
}

}  // namespace fastudy::train
