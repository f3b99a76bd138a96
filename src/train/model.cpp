// The GPT-style decoder, its emulated Linear and rounding functions, and the kernel-backed attention
// (custom autograd functions). See model.hpp for the emulation rules; the parameters' shapes and
// init schemes are model_params.cpp.
// Shapes: B batch, H heads, N sequence, d head dim, D = H*d, V vocab.
#include "src/train/model.hpp"

#include <algorithm>
#include <cmath>

#include "base/error.hpp"
#include "base/hash.hpp"
#include "src/train/fixed_order.hpp"
#include "src/train/profile.hpp"
#include "src/train/sdpa.hpp"

#include "fastudy/version.hpp"  // FASTUDY_TORCH_CUDA

#ifdef FASTUDY_HAVE_CUDA_KERNELS
#include "kernels/cuda/attention_cuda.hpp"
#endif
#if FASTUDY_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace fastudy::train {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr std::int64_t kNoRounding = -1;  // a format slot that rounds nothing

std::int64_t format_code(bool enabled, Format f) { return enabled ? static_cast<std::int64_t>(f) : kNoRounding; }

// Round a fresh contiguous tensor in place (float or double container), in blocks on the threads;
// off the CPU with LibTorch's conversions.
void round_tensor_inplace(torch::Tensor& t, Format f) {
  if (!t.is_cpu()) {
    round_with_conversions(t, f);
    return;
  }
  const std::int64_t n = t.numel(), block = fixed::kElementBlock;
  const bool wide = t.scalar_type() == torch::kDouble;
  void* data = t.data_ptr();
  fixed::for_each_piece((n + block - 1) / block, [&](std::int64_t k) {
    const std::int64_t e0 = k * block;
    const auto len = static_cast<std::size_t>(std::min(block, n - e0));
    if (wide) {
      round_inplace(f, static_cast<double*>(data) + e0, len);
    } else {
      round_inplace(f, static_cast<float*>(data) + e0, len);
    }
  });
}

// A StepProfile carried through an autograd function's settings as an integer (null: not timed).
std::int64_t profile_bits(StepProfile* p) { return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(p)); }
StepProfile* profile_of(std::int64_t bits) { return reinterpret_cast<StepProfile*>(static_cast<std::intptr_t>(bits)); }

// round_if and round_tensor_inplace, timed as roundings of the forward or backward pass.
torch::Tensor round_if(const torch::Tensor& t, std::int64_t code, StepProfile* profile, Phase phase) {
  if (code == kNoRounding) return t;
  const StepProfile::Scope timed(profile, phase);
  return round_copy(t, static_cast<Format>(code));
}
void round_tensor_inplace(torch::Tensor& t, Format f, StepProfile* profile, Phase phase) {
  const StepProfile::Scope timed(profile, phase);
  round_tensor_inplace(t, f);
}

// A matmul operand prepared for an arithmetic: `hi` is the operand in the matmul's input format (the
// operand itself for fp32), `lo` bf16x3's low part (undefined otherwise).
struct Operand {
  torch::Tensor hi, lo;
  Operand t() const { return {hi.t(), lo.defined() ? lo.t() : lo}; }
};

Operand prepare_operand(const torch::Tensor& a, MatmulArithmetic arithmetic) {
  switch (arithmetic) {
    case MatmulArithmetic::fp32: return {a, {}};
    case MatmulArithmetic::tf32: return {round_copy(a, Format::tf32), {}};
    case MatmulArithmetic::bf16: return {round_copy(a, Format::bf16), {}};
    case MatmulArithmetic::bf16x3: {
      torch::Tensor hi = round_copy(a, Format::bf16);
      torch::Tensor lo = a - hi;  // exact: the bits of a below bf16's last place
      round_tensor_inplace(lo, Format::bf16);
      return {hi, lo};
    }
  }
  return {a, {}};
}

// The product of prepared operands a [M, K] and b [K, N] over the reduction range [k0, k1).
torch::Tensor range_product(const Operand& a, const Operand& b, std::int64_t k0, std::int64_t k1) {
  auto slice_a = [&](const torch::Tensor& t) { return t.narrow(1, k0, k1 - k0); };
  auto slice_b = [&](const torch::Tensor& t) { return t.narrow(0, k0, k1 - k0); };
  if (!a.lo.defined()) return fixed::mm(slice_a(a.hi), slice_b(b.hi));
  torch::Tensor y = fixed::mm(slice_a(a.hi), slice_b(b.lo));  // bf16x3: the two small terms first
  y.add_(fixed::mm(slice_a(a.lo), slice_b(b.hi)));
  y.add_(fixed::mm(slice_a(a.hi), slice_b(b.hi)));
  return y;
}

// ((P0 + P1) + P2) + ... over the split_k ranges of the reduction dimension.
torch::Tensor split_product(const Operand& a, const Operand& b, int split_k) {
  const auto ranges = split_ranges(a.hi.size(1), split_k);
  torch::Tensor y = range_product(a, b, ranges[0].first, ranges[0].second);
  for (std::size_t j = 1; j < ranges.size(); ++j) y.add_(range_product(a, b, ranges[j].first, ranges[j].second));
  return y;
}

struct LinearFn : public torch::autograd::Function<LinearFn> {
  // x [M, in], w [out, in], b [out] or empty (no bias; autograd functions take no undefined inputs)
  // -> [M, out]. `arithmetic` and split_k: the [numerics] of the three matmuls (model.hpp); the
  // default (fp32, 1) runs the plain torch products.
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor w, torch::Tensor b,
                               std::int64_t in_code, std::int64_t store_code, bool x_in_format, bool grad_in_format,
                               std::int64_t arithmetic, std::int64_t split_k, std::int64_t profile) {
    StepProfile* prof = profile_of(profile);
    const torch::Tensor xr = x_in_format ? x : round_if(x, in_code, prof, Phase::forward_roundings);
    const torch::Tensor wr = round_if(w, in_code, prof, Phase::forward_roundings);
    const bool has_bias = b.numel() > 0;
    const auto arith = static_cast<MatmulArithmetic>(arithmetic);
    const Operand xo = prepare_operand(xr, arith), wo = prepare_operand(wr, arith);
    torch::Tensor y;
    if (split_k == 1 && arith != MatmulArithmetic::bf16x3) {
      // One GEMM: the bias is its C operand (addmm), as the plain fp32 product has always done.
      y = has_bias ? fixed::addmm(round_if(b, store_code, prof, Phase::forward_roundings), xo.hi, wo.hi.t())
                   : fixed::mm(xo.hi, wo.hi.t());
    } else {
      y = split_product(xo, wo.t(), static_cast<int>(split_k));
      if (has_bias) y.add_(round_if(b, store_code, prof, Phase::forward_roundings));  // the epilogue, after the reduction
    }
    ctx->save_for_backward({xo.hi, wo.hi, xo.lo, wo.lo});  // the operands as prepared (lo: bf16x3 only)
    if (store_code != kNoRounding)
      round_tensor_inplace(y, static_cast<Format>(store_code), prof, Phase::forward_roundings);
    ctx->saved_data["in"] = in_code;
    ctx->saved_data["store"] = store_code;
    ctx->saved_data["bias"] = has_bias;
    ctx->saved_data["grad_in_format"] = grad_in_format;
    ctx->saved_data["arithmetic"] = arithmetic;
    ctx->saved_data["split_k"] = split_k;
    ctx->saved_data["profile"] = profile;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::int64_t in_code = ctx->saved_data["in"].toInt();
    const std::int64_t store_code = ctx->saved_data["store"].toInt();
    const auto arith = static_cast<MatmulArithmetic>(ctx->saved_data["arithmetic"].toInt());
    const int split_k = static_cast<int>(ctx->saved_data["split_k"].toInt());
    StepProfile* prof = profile_of(ctx->saved_data["profile"].toInt());
    const torch::Tensor g = ctx->saved_data["grad_in_format"].toBool()
                                ? grads[0].contiguous()
                                : round_if(grads[0].contiguous(), in_code, prof,
                                           Phase::backward_roundings);  // the backward matmuls' input
    torch::Tensor gx, gw;
    if (arith == MatmulArithmetic::fp32 && split_k == 1) {
      gx = fixed::mm(g, saved[1]);
      gw = fixed::mm(g.t(), saved[0]);
    } else {
      // The saved operands are already prepared (in the matmul's format, or split); only G is new.
      const Operand xo{saved[0], saved[2]}, wo{saved[1], saved[3]};
      const Operand go = prepare_operand(g, arith);
      gx = split_product(go, wo, split_k);        // reduction over the output features
      gw = split_product(go.t(), xo, split_k);    // reduction over the tokens
    }
    torch::Tensor gb;
    if (ctx->saved_data["bias"].toBool()) gb = fixed::column_sums(g);
    if (store_code != kNoRounding) {
      const auto f = static_cast<Format>(store_code);
      round_tensor_inplace(gx, f, prof, Phase::backward_roundings);
      round_tensor_inplace(gw, f, prof, Phase::backward_roundings);
      if (gb.defined()) round_tensor_inplace(gb, f, prof, Phase::backward_roundings);
    }
    variable_list out{gx, gw, gb};
    out.resize(10);  // no gradients for the seven settings
    return out;
  }
};

struct RoundFn : public torch::autograd::Function<RoundFn> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, std::int64_t code, std::int64_t profile) {
    ctx->saved_data["code"] = code;
    ctx->saved_data["profile"] = profile;
    return round_if(x, code, profile_of(profile), Phase::forward_roundings);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {round_if(grads[0], ctx->saved_data["code"].toInt(), profile_of(ctx->saved_data["profile"].toInt()),
                     Phase::backward_roundings),
            torch::Tensor(), torch::Tensor()};
  }
};

template <class T>
void attention_forward_typed(const AttentionShape& shape, const AttentionParams& params, const torch::Tensor& packed,
                             torch::Tensor& o, torch::Tensor& lse) {
  const std::int64_t n = packed.numel() / 3;
  const T* q = packed.data_ptr<T>();
  attention_forward<T>(shape, params, q, q + n, q + 2 * n, o.data_ptr<T>(), lse.defined() ? lse.data_ptr<T>() : nullptr);
}

// The CUDA kernels on float containers (storage fp32: the policy rounds on load, as on the CPU) or on
// fp16/bf16 tensors of the policy's storage format (native training), on LibTorch's current stream,
// their workspace taken from LibTorch's caching allocator: the calls allocate nothing themselves and
// never wait for the device, so a step's attention can be captured in a CUDA graph.
#ifndef FASTUDY_HAVE_CUDA_KERNELS
[[noreturn]] void no_cuda_kernels() {
  throw Error("attention on a CUDA tensor needs fastudy's CUDA kernels, which this build lacks",
              "configure with nvcc available (FASTUDY_CUDA=ON), or train on the CPU");
}
#endif
Format cuda_storage(const torch::Tensor& packed) {
  switch (packed.scalar_type()) {
    case torch::kFloat: return Format::fp32;
    case torch::kBFloat16: return Format::bf16;
    case torch::kHalf: return Format::fp16;
    default:
      throw Error("the CUDA attention kernels take float, bf16 or fp16 tensors; fp64 variants train on the CPU",
                  "use [train] device = \"cpu\" for fp64 variants");
  }
}

#ifdef FASTUDY_HAVE_CUDA_KERNELS
cudaStream_t current_stream() {
#if FASTUDY_TORCH_CUDA
  return at::cuda::getCurrentCUDAStream().stream();
#else
  return nullptr;  // no CUDA tensors without a CUDA LibTorch
#endif
}

torch::Tensor device_workspace(std::size_t bytes, const torch::Tensor& like) {
  return torch::empty({static_cast<std::int64_t>(std::max<std::size_t>(bytes, 1))}, like.options().dtype(torch::kByte));
}
#endif

void run_attention_forward(const AttentionShape& shape, const AttentionParams& params, const torch::Tensor& packed,
                           torch::Tensor& o, torch::Tensor& lse) {
  if (packed.is_cuda()) {
    const Format storage = cuda_storage(packed);
#ifdef FASTUDY_HAVE_CUDA_KERNELS
    const std::int64_t n = packed.numel() / 3;
    const auto* q = static_cast<const unsigned char*>(packed.data_ptr());
    const std::size_t bytes = static_cast<std::size_t>(n) * packed.element_size();
    torch::Tensor ws = device_workspace(cuda::attention_workspace_bytes(shape, params, storage, false), packed);
    cuda::attention_forward_cuda(shape, params, storage, q, q + bytes, q + 2 * bytes, o.data_ptr(),
                                 lse.defined() ? lse.data_ptr<float>() : nullptr, current_stream(), ws.data_ptr());
    return;
#else
    (void)storage;
    no_cuda_kernels();
#endif
  }
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
  p.rounding_seed ^= kSplitMix64Gamma * static_cast<std::uint64_t>(layer + 1);
  return p;
}

struct AttentionFn : public torch::autograd::Function<AttentionFn> {
  // qkv [B, N, 3D] -> [B, N, D]. `setup` is an AttentionSetup* carried as an integer (it outlives the
  // step, see kernel_attention).
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor qkv, std::int64_t heads, std::int64_t setup_bits,
                               std::int64_t layer) {
    const auto* setup = reinterpret_cast<const AttentionSetup*>(static_cast<std::intptr_t>(setup_bits));
    const StepProfile::Scope timed(setup->profile, Phase::attention_forward);
    const std::int64_t B = qkv.size(0), N = qkv.size(1), D = qkv.size(2) / 3, d = D / heads;
    const AttentionShape shape{B, heads, N, d, /*causal=*/true, /*scale=*/0.0};
    // [B, N, 3, H, d] -> [3, B, H, N, d]: q, k, v each contiguous [B, H, N, d].
    const torch::Tensor packed = qkv.view({B, N, 3, heads, d}).permute({2, 0, 3, 1, 4}).contiguous();
    torch::Tensor o = torch::empty({B, heads, N, d}, qkv.options());
    // lse in the container type on the CPU, in float from the CUDA kernels.
    torch::Tensor lse = torch::empty({B, heads, N}, qkv.is_cuda() ? qkv.options().dtype(torch::kFloat) : qkv.options());
    const AttentionParams params = layer_params(setup->params, layer);
    if (setup->capture != nullptr && setup->capture_layer == layer) {
      CapturedAttention& cap = *setup->capture;
      cap.batch = B;
      cap.heads = heads;
      cap.seq_len = N;
      cap.head_dim = d;
      const torch::Tensor wide = packed.to(torch::kCPU, torch::kDouble).contiguous();
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
      const torch::Tensor diff = (o - o_other).abs().to(torch::kCPU, torch::kDouble).contiguous();
      // Summed in index order on this thread (LibTorch's mean() splits its sum by thread count).
      const double* d = diff.data_ptr<double>();
      double sum = 0.0;
      for (std::int64_t i = 0; i < diff.numel(); ++i) sum += d[i];
      setup->shadow_sink->push_back({static_cast<int>(layer), diff.max().item<double>(),
                                     sum / static_cast<double>(std::max<std::int64_t>(diff.numel(), 1))});
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
    const StepProfile::Scope timed(setup->profile, Phase::attention_backward);
    const std::int64_t heads = ctx->saved_data["heads"].toInt();
    const std::int64_t B = o.size(0), N = o.size(2), d = o.size(3), D = heads * d;
    const AttentionShape shape{B, heads, N, d, /*causal=*/true, /*scale=*/0.0};
    const torch::Tensor dout = grads[0].view({B, N, heads, d}).permute({0, 2, 1, 3}).contiguous();
    torch::Tensor dpacked = torch::empty_like(packed);
    const AttentionParams params = layer_params(setup->params, ctx->saved_data["layer"].toInt());
    if (packed.is_cuda()) {
      const Format storage = cuda_storage(packed);
#ifdef FASTUDY_HAVE_CUDA_KERNELS
      const std::size_t bytes = static_cast<std::size_t>(packed.numel() / 3) * packed.element_size();
      const auto* q = static_cast<const unsigned char*>(packed.data_ptr());
      auto* dq = static_cast<unsigned char*>(dpacked.data_ptr());
      torch::Tensor ws = device_workspace(cuda::attention_workspace_bytes(shape, params, storage, true), packed);
      cuda::attention_backward_cuda(shape, params, storage, q, q + bytes, q + 2 * bytes, o.data_ptr(),
                                    lse.data_ptr<float>(), dout.data_ptr(), dq, dq + bytes, dq + 2 * bytes,
                                    current_stream(), ws.data_ptr());
#else
      (void)storage;
      no_cuda_kernels();
#endif
    } else if (packed.scalar_type() == torch::kDouble) {
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

constexpr double kLayerNormEps = 1e-5;

// Mean and 1/sqrt(var + eps) of each row of x [R, D], summed in index order (two_pass or welford).
template <class T>
void row_moments(const T* x, std::int64_t rows, std::int64_t d, LayerNormAlgorithm algorithm, T* mean, T* rstd) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * d;
    T m = 0, var = 0;
    if (algorithm == LayerNormAlgorithm::welford) {
      T m2 = 0;
      for (std::int64_t i = 0; i < d; ++i) {
        const T delta = row[i] - m;
        m += delta / static_cast<T>(i + 1);
        m2 += delta * (row[i] - m);
      }
      var = m2 / static_cast<T>(d);
    } else {
      T sum = 0;
      for (std::int64_t i = 0; i < d; ++i) sum += row[i];
      m = sum / static_cast<T>(d);
      T squares = 0;
      for (std::int64_t i = 0; i < d; ++i) {
        const T c = row[i] - m;
        squares += c * c;
      }
      var = squares / static_cast<T>(d);
    }
    mean[r] = m;
    rstd[r] = static_cast<T>(1) / std::sqrt(var + static_cast<T>(kLayerNormEps));
  }
}

// y = ((x - mean) rstd) w + b for x [R, D] with the algorithm's row statistics, and its analytic
// backward: with xhat = (x - mean) rstd and dxhat = dy w, dx = rstd (dxhat - mean(dxhat) - xhat
// mean(dxhat xhat)), dw = sum over rows of dy xhat, db = sum over rows of dy; every sum in index
// order, in the container type.
template <class T>
void layer_norm_forward_rows(const T* x, const T* w, const T* b, std::int64_t rows, std::int64_t d,
                             LayerNormAlgorithm algorithm, T* y, T* mean, T* rstd) {
  row_moments(x, rows, d, algorithm, mean, rstd);
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    T* yr = y + r * d;
    for (std::int64_t i = 0; i < d; ++i) yr[i] = ((xr[i] - mean[r]) * rstd[r]) * w[i] + b[i];
  }
}

template <class T>
void layer_norm_backward_rows(const T* x, const T* w, const T* mean, const T* rstd, const T* dy, std::int64_t rows,
                              std::int64_t d, T* dx, T* dw, T* db) {
  std::fill(dw, dw + d, T(0));
  std::fill(db, db + d, T(0));
  const T inv_d = static_cast<T>(1) / static_cast<T>(d);
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    const T* dyr = dy + r * d;
    T* dxr = dx + r * d;
    T sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (std::int64_t i = 0; i < d; ++i) {
      const T xhat = (xr[i] - mean[r]) * rstd[r];
      const T dxhat = dyr[i] * w[i];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * xhat;
      dw[i] += dyr[i] * xhat;
      db[i] += dyr[i];
    }
    const T mean_dxhat = sum_dxhat * inv_d, mean_dxhat_xhat = sum_dxhat_xhat * inv_d;
    for (std::int64_t i = 0; i < d; ++i) {
      const T xhat = (xr[i] - mean[r]) * rstd[r];
      dxr[i] = rstd[r] * ((dyr[i] * w[i] - mean_dxhat) - xhat * mean_dxhat_xhat);
    }
  }
}

struct LayerNormFn : public torch::autograd::Function<LayerNormFn> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor w, torch::Tensor b,
                               std::int64_t algorithm) {
    const torch::Tensor xc = x.contiguous(), wc = w.contiguous(), bc = b.contiguous();
    const std::int64_t rows = xc.size(0), d = xc.size(1);
    torch::Tensor y = torch::empty_like(xc);
    torch::Tensor mean = torch::empty({rows}, xc.options());
    torch::Tensor rstd = torch::empty({rows}, xc.options());
    const auto a = static_cast<LayerNormAlgorithm>(algorithm);
    if (xc.scalar_type() == torch::kDouble) {
      layer_norm_forward_rows(xc.data_ptr<double>(), wc.data_ptr<double>(), bc.data_ptr<double>(), rows, d, a,
                              y.data_ptr<double>(), mean.data_ptr<double>(), rstd.data_ptr<double>());
    } else {
      layer_norm_forward_rows(xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), rows, d, a,
                              y.data_ptr<float>(), mean.data_ptr<float>(), rstd.data_ptr<float>());
    }
    ctx->save_for_backward({xc, wc, mean, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor dy = grads[0].contiguous();
    const std::int64_t rows = x.size(0), d = x.size(1);
    torch::Tensor dx = torch::empty_like(x), dw = torch::empty({d}, x.options()), db = torch::empty({d}, x.options());
    if (x.scalar_type() == torch::kDouble) {
      layer_norm_backward_rows(x.data_ptr<double>(), saved[1].data_ptr<double>(), saved[2].data_ptr<double>(),
                               saved[3].data_ptr<double>(), dy.data_ptr<double>(), rows, d, dx.data_ptr<double>(),
                               dw.data_ptr<double>(), db.data_ptr<double>());
    } else {
      layer_norm_backward_rows(x.data_ptr<float>(), saved[1].data_ptr<float>(), saved[2].data_ptr<float>(),
                               saved[3].data_ptr<float>(), dy.data_ptr<float>(), rows, d, dx.data_ptr<float>(),
                               dw.data_ptr<float>(), db.data_ptr<float>());
    }
    return {dx, dw, db, torch::Tensor()};
  }
};

// Causal attention of qkv [B, N, 3D] -> [B, N, D] in qkv's dtype: LibTorch's SDPA with the setup's
// backend, or fastudy's kernels (on float containers: native formats are widened and the result cast
// back, the kernels' policy doing the rounding).
// Q, K and V of a fused projection [B, N, 3D] recorded in the trace (they travel on as one tensor).
void trace_qkv(const AttentionSetup& setup, const std::string& block, const torch::Tensor& qkv) {
  if (setup.trace == nullptr) return;
  const std::int64_t D = qkv.size(-1) / 3;
  for (int j = 0; j < 3; ++j) {
    setup.trace->outputs.emplace_back(block + "attn." + "qkv"[j], qkv.narrow(-1, j * D, D).detach().clone());
  }
}

torch::Tensor attend(const torch::Tensor& qkv, int heads, const AttentionSetup& setup, int layer) {
  if (setup.sdpa != SdpaBackend::none) {
    const std::int64_t B = qkv.size(0), N = qkv.size(1), D = qkv.size(2) / 3, d = D / heads;
    const torch::Tensor qkv5 = qkv.view({B, N, 3, heads, d}).permute({2, 0, 3, 1, 4});  // [3, B, H, N, d]
    return sdpa_attention(qkv5[0], qkv5[1], qkv5[2], setup.sdpa, /*causal=*/true).permute({0, 2, 1, 3}).reshape({B, N, D});
  }
  if (qkv.scalar_type() == torch::kFloat || qkv.scalar_type() == torch::kDouble) {
    return kernel_attention(qkv, heads, setup, layer);
  }
  // fp16/bf16 tensors of the policy's storage format go to the CUDA kernels as they are (the same values
  // as widened to float and rounded on load); elsewhere they are widened.
  const Format storage = setup.params.policy.q;
  if (qkv.is_cuda() && ((qkv.scalar_type() == torch::kBFloat16 && storage == Format::bf16) ||
                        (qkv.scalar_type() == torch::kHalf && storage == Format::fp16))) {
    return kernel_attention(qkv, heads, setup, layer);
  }
  return kernel_attention(qkv.to(torch::kFloat), heads, setup, layer).to(qkv.scalar_type());
}

// A linear layer in the native arithmetic: inputs cast to the compute format (autocast's rule for
// linear), the product in that format.
torch::Tensor native_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, const Emulation& e) {
  return torch::linear(x.to(e.compute), w.to(e.compute), b.defined() ? b.to(e.compute) : b);
}

// LayerNorm in the native arithmetic: in fp32 (the container), as autocast runs it.
torch::Tensor native_layer_norm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  return torch::layer_norm(x.to(w.scalar_type()), {x.size(-1)}, w, b, kLayerNormEps);
}

// One transformer block in the native arithmetic (see model.hpp): the residual stream stays fp32.
torch::Tensor native_block_forward(const torch::Tensor& x, torch::TensorList p, int heads, const Emulation& e,
                                   const AttentionSetup& setup, int layer) {
  const std::string at = "blocks." + std::to_string(layer) + ".";
  torch::Tensor h = traced(setup, at + "ln1", native_layer_norm(x, p[kLn1W], p[kLn1B]));
  h = traced(setup, at + "attn.qkv", native_linear(h, p[kQkvW], p[kQkvB], e));
  trace_qkv(setup, at, h);
  h = traced(setup, at + "attn.out", attend(h, heads, setup, layer));
  const torch::Tensor y =
      x + traced(setup, at + "attn.proj", native_linear(h, p[kProjW], p[kProjB], e)).to(x.scalar_type());
  h = traced(setup, at + "ln2", native_layer_norm(y, p[kLn2W], p[kLn2B]));
  h = traced(setup, at + "mlp.fc", native_linear(h, p[kFcW], p[kFcB], e));
  h = traced(setup, at + "mlp.gelu", torch::gelu(h, e.numerics.gelu == GeluApproximation::tanh ? "tanh" : "none"));
  return traced(setup, at + "out",
                y + traced(setup, at + "mlp.proj", native_linear(h, p[kMlpProjW], p[kMlpProjB], e)).to(x.scalar_type()));
}

// One transformer block: x [B, N, D] -> [B, N, D], params in BlockParam order.
torch::Tensor block_forward(const torch::Tensor& x, torch::TensorList p, int heads, const Emulation& e,
                            const AttentionSetup& attention, int layer) {
  if (e.native) return native_block_forward(x, p, heads, e, attention, layer);
  // Inputs and gradients that arrive already in the format skip a second (idempotent) rounding: the
  // attention output (stored in policy.o), GELU's output, and the attention's dQKV (policy.grad).
  const bool attention_out_in_format = attention.params.policy.o == e.precision;
  const bool attention_grad_in_format = attention.params.policy.grad == e.precision;
  const std::string at = "blocks." + std::to_string(layer) + ".";
  torch::Tensor h = traced(attention, at + "ln1", layer_norm(x, p[kLn1W], p[kLn1B], e.numerics.layernorm));
  h = traced(attention, at + "attn.qkv", emulated_linear(h, p[kQkvW], p[kQkvB], e, false, attention_grad_in_format));  // [B, N, 3D]
  trace_qkv(attention, at, h);
  h = traced(attention, at + "attn.out", attend(h, heads, attention, layer));  // [B, N, D]
  torch::Tensor y = x + traced(attention, at + "attn.proj", emulated_linear(h, p[kProjW], p[kProjB], e, attention_out_in_format));
  h = traced(attention, at + "ln2", layer_norm(y, p[kLn2W], p[kLn2B], e.numerics.layernorm));
  h = traced(attention, at + "mlp.fc", emulated_linear(h, p[kFcW], p[kFcB], e));
  h = traced(attention, at + "mlp.gelu", round_activation(gelu(h, e.numerics.gelu), e));
  return traced(attention, at + "out",
                y + traced(attention, at + "mlp.proj", emulated_linear(h, p[kMlpProjW], p[kMlpProjB], e, e.round_storage)));
}

// recompute = on: a block whose forward keeps only its input and parameters and runs again inside
// the backward pass. The Emulation and AttentionSetup travel as addresses (they outlive the step,
// see Gpt::loss). The rerun uses the same setup, so attention draws the same stochastic-rounding
// bits (the seed is the step's, mixed with the layer index), without shadow records or capture.
struct RecomputedBlockFn : public torch::autograd::Function<RecomputedBlockFn> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::TensorList params, std::int64_t heads,
                               std::int64_t emulation_bits, std::int64_t setup_bits, std::int64_t layer) {
    const auto* e = reinterpret_cast<const Emulation*>(static_cast<std::intptr_t>(emulation_bits));
    const auto* setup = reinterpret_cast<const AttentionSetup*>(static_cast<std::intptr_t>(setup_bits));
    torch::Tensor y = block_forward(x, params, static_cast<int>(heads), *e, *setup, static_cast<int>(layer));
    variable_list keep{x};
    keep.insert(keep.end(), params.begin(), params.end());
    ctx->save_for_backward(keep);
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["emulation"] = emulation_bits;
    ctx->saved_data["setup"] = setup_bits;
    ctx->saved_data["layer"] = layer;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto address = [&](const char* key) { return static_cast<std::intptr_t>(ctx->saved_data[key].toInt()); };
    const auto* e = reinterpret_cast<const Emulation*>(address("emulation"));
    AttentionSetup rerun = *reinterpret_cast<const AttentionSetup*>(address("setup"));
    rerun.shadow = false;
    rerun.capture = nullptr;
    rerun.trace = nullptr;
    variable_list inputs;
    for (const torch::Tensor& t : ctx->get_saved_variables()) inputs.push_back(t.detach().requires_grad_(true));
    torch::Tensor y;
    {
      torch::AutoGradMode enable(true);
      const int heads = static_cast<int>(ctx->saved_data["heads"].toInt());
      y = block_forward(inputs[0], torch::TensorList(inputs).slice(1), heads, *e, rerun,
                        static_cast<int>(ctx->saved_data["layer"].toInt()));
    }
    variable_list out = torch::autograd::grad({y}, inputs, {grads[0]}, /*retain_graph=*/false,
                                              /*create_graph=*/false, /*allow_unused=*/true);
    for (int i = 0; i < 4; ++i) out.emplace_back();  // heads, emulation, setup, layer
    return out;
  }
};

}  // namespace

Emulation Emulation::of(Format precision, const NumericsConfig& numerics, Arithmetic arithmetic) {
  Emulation e;
  e.precision = precision;
  e.numerics = numerics;
  e.dtype = precision == Format::fp64 ? torch::kDouble : torch::kFloat;
  e.native = arithmetic == Arithmetic::native;
  e.round_matmul_inputs = !e.native && precision != Format::fp64 && precision != Format::fp32;
  e.round_storage = e.round_matmul_inputs && precision != Format::tf32;
  e.compute = !e.native                     ? e.dtype
              : precision == Format::bf16 ? torch::kBFloat16
              : precision == Format::fp16 ? torch::kHalf
                                          : e.dtype;
  return e;
}

void round_with_conversions(torch::Tensor& t, Format f) {
  if (f == Format::fp64 || f == Format::fp32) return;
  if (t.scalar_type() != torch::kFloat || !t.is_contiguous()) {
    throw Error("rounding with LibTorch's conversions takes contiguous float tensors (got " +
                std::string(c10::toString(t.scalar_type())) + ")");
  }
  torch::NoGradGuard no_grad;
  switch (f) {
    case Format::bf16: t.copy_(t.to(torch::kBFloat16)); return;
    case Format::fp16: t.copy_(t.to(torch::kHalf)); return;
    case Format::tf32: {
      // Round to nearest even at bit 13: add 0xFFF plus the lowest kept bit, clear the 13 bits below.
      // A carry out of the fraction raises the exponent (to Inf past the largest finite value), as the
      // format's rounding does; Inf and NaN (exponent all ones) keep their bits.
      torch::Tensor bits = t.view(torch::kInt);
      const torch::Tensor rounded = (bits + (bits.bitwise_right_shift(13).bitwise_and(1) + 0xFFF)).bitwise_and(~0x1FFF);
      const torch::Tensor finite = bits.bitwise_and(0x7F800000).ne(0x7F800000);
      bits.copy_(torch::where(finite, rounded, bits));
      return;
    }
    default:
      throw Error(std::string(to_string(f)) + " rounding runs on the CPU only",
                  "train fp8 formats with [train] device = \"cpu\"");
  }
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
                         format_code(e.round_storage, e.precision), x_in_format, grad_in_format,
                         static_cast<std::int64_t>(e.numerics.matmul), static_cast<std::int64_t>(e.numerics.split_k),
                         profile_bits(e.profile))
      .view(shape);
}

std::vector<std::pair<std::int64_t, std::int64_t>> split_ranges(std::int64_t k_len, int split_k) {
  const std::int64_t parts = std::clamp<std::int64_t>(split_k, 1, std::max<std::int64_t>(k_len, 1));
  const std::int64_t base = k_len / parts, longer = k_len % parts;
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  std::int64_t begin = 0;
  for (std::int64_t j = 0; j < parts; ++j) {
    const std::int64_t end = begin + base + (j < longer ? 1 : 0);
    out.emplace_back(begin, end);
    begin = end;
  }
  return out;
}

torch::Tensor numerics_matmul(const torch::Tensor& a, const torch::Tensor& b, MatmulArithmetic arithmetic,
                              int split_k) {
  return split_product(prepare_operand(a, arithmetic), prepare_operand(b, arithmetic), split_k);
}

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                         LayerNormAlgorithm algorithm) {
  const std::int64_t d = x.size(-1);
  if (algorithm == LayerNormAlgorithm::torch) return fixed::layer_norm(x, w, b, kLayerNormEps);
  if (!x.is_cpu()) {
    throw Error("[numerics] layernorm = " + std::string(to_string(algorithm)) + " runs on the CPU only",
                "use layernorm = \"torch\" on a GPU, or [train] device = \"cpu\"");
  }
  return LayerNormFn::apply(x.reshape({-1, d}), w, b, static_cast<std::int64_t>(algorithm)).view(x.sizes());
}

torch::Tensor gelu(const torch::Tensor& x, GeluApproximation approximation) {
  return fixed::gelu(x, approximation == GeluApproximation::tanh ? "tanh" : "none");
}

torch::Tensor round_activation(const torch::Tensor& x, const Emulation& e) {
  if (!e.round_storage) return x;
  return RoundFn::apply(x, static_cast<std::int64_t>(e.precision), profile_bits(e.profile));
}

torch::Tensor kernel_attention(const torch::Tensor& qkv, int heads, const AttentionSetup& setup, int layer) {
  return AttentionFn::apply(qkv, static_cast<std::int64_t>(heads),
                            static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&setup)),
                            static_cast<std::int64_t>(layer));
}

torch::Tensor Gpt::loss(const torch::Tensor& tokens, const Emulation& e, const AttentionSetup& attention) const {
  const std::int64_t N = config_.seq_len;
  const torch::Tensor inputs = tokens.narrow(1, 0, N);
  const torch::Tensor targets = tokens.narrow(1, 1, N).reshape({-1});
  torch::Tensor x = traced(attention, "embed", torch::embedding(p(0), inputs) + p(1));  // [B, N, D]
  // Recomputation only where there is a backward pass (not under the capture's NoGradGuard).
  const bool recompute = e.numerics.recompute && torch::GradMode::is_enabled();
  for (int i = 0; i < config_.layers; ++i) {
    const std::size_t o = 2 + static_cast<std::size_t>(i) * kBlockParams;
    std::vector<torch::Tensor> block(kBlockParams);
    for (std::size_t j = 0; j < kBlockParams; ++j) block[j] = p(o + j);
    if (recompute) {
      x = RecomputedBlockFn::apply(x, torch::TensorList(block), static_cast<std::int64_t>(config_.heads),
                                   static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&e)),
                                   static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&attention)),
                                   static_cast<std::int64_t>(i));
    } else {
      x = block_forward(x, block, config_.heads, e, attention, i);
    }
  }
  const std::size_t f = 2 + static_cast<std::size_t>(config_.layers) * kBlockParams;
  if (e.native) {
    // Autocast's rules: the LM head in the compute format, the loss in fp32.
    x = traced(attention, "ln_f", native_layer_norm(x, p(f), p(f + 1)));
    const torch::Tensor logits = traced(attention, "logits", native_linear(x, p(f + 2), torch::Tensor(), e));
    return traced(attention, "loss",
                  torch::nn::functional::cross_entropy(logits.reshape({-1, config_.vocab}).to(e.dtype), targets));
  }
  x = traced(attention, "ln_f", layer_norm(x, p(f), p(f + 1), e.numerics.layernorm));
  const torch::Tensor logits = traced(attention, "logits", emulated_linear(x, p(f + 2), torch::Tensor(), e));  // [B, N, V]
  return traced(attention, "loss", torch::nn::functional::cross_entropy(logits.reshape({-1, config_.vocab}), targets));
}

torch::Tensor traced(const AttentionSetup& setup, const std::string& name, torch::Tensor t) {
  if (setup.trace == nullptr) return t;
  if (setup.trace->factor) {
    const double f = setup.trace->factor(name);
    if (f != 1.0) t = t * f;
  }
  setup.trace->outputs.emplace_back(name, t.detach().clone());
  return t;
}

}  // namespace fastudy::train
