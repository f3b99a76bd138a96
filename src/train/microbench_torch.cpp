// LibTorch's own ops on the CPU as microbenchmark rows (see microbench_torch.hpp). Every line below is
// one LibTorch call, written as a PyTorch user or a framework-level re-implementation writes it; which
// of them the emulated readings model is written next to the kernels (kernels/detail/attention_impl.hpp).
//
// B batch, H heads, N sequence, d head dim; tensors are [B, H, N, d], lse [B, H, N, 1].
#include "src/train/microbench_torch.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "base/error.hpp"
#include "fastudy/version.hpp"
#include "src/train/libtorch.hpp"

namespace fastudy {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

torch::ScalarType dtype_of(Format f) {
  std::string why;
  if (!torch_cpu_runs(f, &why)) throw UsageError("framework rows at " + std::string(to_string(f)) + ": " + why);
  switch (f) {
    case Format::fp64: return torch::kFloat64;
    case Format::fp32: return torch::kFloat32;
    case Format::fp16: return torch::kFloat16;
    default: return torch::kBFloat16;
  }
}

void append(std::vector<double>& out, const torch::Tensor& t) {
  const torch::Tensor h = t.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  out.insert(out.end(), h.data_ptr<double>(), h.data_ptr<double>() + h.numel());
}

// Where a row of keys j0 .. j0 + cols - 1 comes after query i0 + r: true (causal masking), [rows, cols].
torch::Tensor after_query(std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) {
  const torch::Tensor query = torch::arange(i0, i0 + rows, torch::kInt64).unsqueeze(1);
  const torch::Tensor key = torch::arange(j0, j0 + cols, torch::kInt64).unsqueeze(0);
  return key > query;
}

struct Inputs {
  torch::Tensor q, k, v, dout;
  double scale;
  bool causal;
};

// softmax((Q K^T) * scale) V, or with `scale_first` softmax((Q * scale) K^T) V (nanoGPT and PyTorch
// 1.13's SDPA math path respectively); causal: masked_fill of the keys after each query with -inf.
torch::Tensor baseline_forward(const Inputs& in, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               bool scale_first) {
  torch::Tensor s = scale_first ? torch::matmul(q * in.scale, k.transpose(-2, -1))
                                : torch::matmul(q, k.transpose(-2, -1)) * in.scale;
  if (in.causal) s = s.masked_fill(after_query(0, q.size(2), 0, k.size(2)), kNegInf);
  return torch::matmul(torch::softmax(s, -1), v);
}

// FlashAttention-2's forward (its Algorithm 1, q_outer) as LibTorch ops: per Q block i and KV tile j,
// S = (Q_i K_j^T) * scale, m_new = max(m, rowmax S), P = exp(S - m_new), alpha = exp(m - m_new),
// l = alpha l + rowsum P, O = alpha O + P V_j; at the end O / l and lse = m + log l. Every op's output
// is a tensor of the inputs' dtype.
struct Fa2Forward {
  torch::Tensor o, lse;
};
Fa2Forward fa2_forward(const Inputs& in, std::int64_t block_q, std::int64_t block_kv) {
  const torch::NoGradGuard no_grad;
  const std::int64_t n = in.q.size(2);
  std::vector<torch::Tensor> o_blocks, lse_blocks;
  for (std::int64_t i0 = 0; i0 < n; i0 += block_q) {
    const std::int64_t rows = std::min(block_q, n - i0);
    const torch::Tensor q_i = in.q.narrow(2, i0, rows);
    std::vector<std::int64_t> row_shape = q_i.sizes().vec();
    row_shape.back() = 1;
    torch::Tensor m = torch::full(row_shape, kNegInf, in.q.options());
    torch::Tensor l = torch::zeros(row_shape, in.q.options());
    torch::Tensor o = torch::zeros_like(q_i);
    const std::int64_t j_end = in.causal ? std::min(n, i0 + rows) : n;
    for (std::int64_t j0 = 0; j0 < j_end; j0 += block_kv) {
      const std::int64_t cols = std::min(block_kv, n - j0);
      torch::Tensor s = torch::matmul(q_i, in.k.narrow(2, j0, cols).transpose(-2, -1)) * in.scale;
      if (in.causal && j0 + cols - 1 > i0) s = s.masked_fill(after_query(i0, rows, j0, cols), kNegInf);
      const torch::Tensor m_new = torch::maximum(m, std::get<0>(s.max(-1, true)));
      const torch::Tensor p = torch::exp(s - m_new);
      const torch::Tensor alpha = torch::exp(m - m_new);
      l = alpha * l + p.sum(-1, true);
      o = alpha * o + torch::matmul(p, in.v.narrow(2, j0, cols));
      m = m_new;
    }
    o_blocks.push_back(o / l);
    lse_blocks.push_back(m + torch::log(l));
  }
  return {torch::cat(o_blocks, 2), torch::cat(lse_blocks, 2)};
}

// FlashAttention-2's backward (its Algorithm 2: KV tiles outer, Q blocks inner) as LibTorch ops, from
// the forward's O and lse: D = rowsum(dO * O); per tile S = (Q_i K_j^T) * scale, P = exp(S - lse_i),
// dV_j = dV_j + P^T dO_i, dP = dO_i V_j^T, dS = P * (dP - D_i), dQ_i = dQ_i + (dS K_j) * scale,
// dK_j = dK_j + (dS^T Q_i) * scale. dQ, dK, dV are tensors of the inputs' dtype throughout.
std::vector<torch::Tensor> fa2_backward(const Inputs& in, const Fa2Forward& fwd, std::int64_t block_q,
                                        std::int64_t block_kv) {
  const torch::NoGradGuard no_grad;
  const std::int64_t n = in.q.size(2);
  const torch::Tensor d = (in.dout * fwd.o).sum(-1, true);
  torch::Tensor dq = torch::zeros_like(in.q), dk = torch::zeros_like(in.k), dv = torch::zeros_like(in.v);
  for (std::int64_t j0 = 0; j0 < n; j0 += block_kv) {
    const std::int64_t cols = std::min(block_kv, n - j0);
    const torch::Tensor k_j = in.k.narrow(2, j0, cols), v_j = in.v.narrow(2, j0, cols);
    torch::Tensor dk_j = torch::zeros_like(k_j), dv_j = torch::zeros_like(v_j);
    for (std::int64_t i0 = 0; i0 < n; i0 += block_q) {
      const std::int64_t rows = std::min(block_q, n - i0);
      if (in.causal && i0 + rows - 1 < j0) continue;  // every query of the block precedes every key
      const torch::Tensor q_i = in.q.narrow(2, i0, rows), dout_i = in.dout.narrow(2, i0, rows);
      torch::Tensor s = torch::matmul(q_i, k_j.transpose(-2, -1)) * in.scale;
      if (in.causal && j0 + cols - 1 > i0) s = s.masked_fill(after_query(i0, rows, j0, cols), kNegInf);
      const torch::Tensor p = torch::exp(s - fwd.lse.narrow(2, i0, rows));
      dv_j = dv_j + torch::matmul(p.transpose(-2, -1), dout_i);
      const torch::Tensor dp = torch::matmul(dout_i, v_j.transpose(-2, -1));
      const torch::Tensor ds = p * (dp - d.narrow(2, i0, rows));
      torch::Tensor dq_i = dq.narrow(2, i0, rows);
      dq_i.copy_(dq_i + torch::matmul(ds, k_j) * in.scale);
      dk_j = dk_j + torch::matmul(ds.transpose(-2, -1), q_i) * in.scale;
    }
    dk.narrow(2, j0, cols).copy_(dk_j);
    dv.narrow(2, j0, cols).copy_(dv_j);
  }
  return {dq, dk, dv};
}

}  // namespace

bool torch_cpu_runs(Format f, std::string* why) {
  std::string reason;
  if (f == Format::fp16) {
    // Asked of LibTorch itself: 1.13 (Debian's) refuses, later versions gained CPU fp16 kernels.
    static const std::string fp16_reason = [] {
      try {
        const torch::Tensor a = torch::ones({2, 2}, torch::kFloat16);
        torch::matmul(a, a);
        return std::string();
      } catch (const c10::Error& e) {
        return std::string("LibTorch " FASTUDY_TORCH_VERSION " has no fp16 matmul on the CPU (") +
               e.what_without_backtrace() + ")";
      }
    }();
    reason = fp16_reason;
  } else if (f != Format::fp64 && f != Format::fp32 && f != Format::bf16) {
    reason = "LibTorch has no " + std::string(to_string(f)) + " tensors on the CPU";
  }
  if (why != nullptr) *why = reason;
  return reason.empty();
}

std::string torch_cpu_machine() {
  // at::show_config() lists the build, one "  - " line each: keep the CPU capability and oneDNN's version.
  std::string parts;
  std::istringstream config(at::show_config());
  for (std::string line; std::getline(config, line);) {
    const std::size_t dash = line.find("- ");
    if (dash == std::string::npos) continue;
    const std::string item = line.substr(dash + 2);
    std::string kept;
    if (item.rfind("CPU capability usage: ", 0) == 0) kept = "CPU capability " + item.substr(22);
    else if (item.find("MKL-DNN") != std::string::npos || item.find("oneDNN") != std::string::npos)
      kept = item.substr(0, item.find(" (Git Hash"));
    if (!kept.empty()) parts += (parts.empty() ? "" : ", ") + kept;
  }
  std::string cpu = "an unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const std::size_t colon = line.find(':');
    if (colon != std::string::npos && colon + 2 <= line.size()) cpu = line.substr(colon + 2);
    break;
  }
  return "LibTorch " FASTUDY_TORCH_VERSION + (parts.empty() ? std::string() : " (" + parts + ")") + " on " + cpu;
}

TorchAttention torch_attention(const MicrobenchRun& run, const std::string& algorithm) {
  const RealCode* code = find_real_code(algorithm);
  if (code == nullptr || code->device != "cpu") {
    throw UsageError("'" + algorithm + "' is not one of LibTorch's CPU algorithms", "use " + real_code_names("cpu"));
  }
  const MicrobenchPoint& pt = run.point;
  if (code->kind == AttentionKind::flash && pt.loop_order != LoopOrder::q_outer) {
    throw UsageError(algorithm + " is FlashAttention-2's loop (q_outer); this point's loop order is " +
                         std::string(to_string(pt.loop_order)),
                     "compare it with q_outer points");
  }
  const torch::ScalarType dtype = dtype_of(pt.format);
  const AttentionShape& s = run.shape;
  const std::vector<std::int64_t> dims{s.batch, s.heads, s.seq_len, s.head_dim};
  auto tensor = [&](const std::vector<double>& x) {
    return torch::from_blob(const_cast<double*>(x.data()), dims, torch::kFloat64).to(dtype);
  };
  Inputs in{tensor(run.q), tensor(run.k), tensor(run.v), tensor(run.dout),
            s.scale != 0 ? s.scale : 1.0 / std::sqrt(static_cast<double>(s.head_dim)), s.causal};
  const bool backward = pt.pass == Pass::backward;
  TorchAttention out;
  if (code->kind == AttentionKind::flash) {
    const std::int64_t bq = std::min<std::int64_t>(pt.block_q, s.seq_len);
    const std::int64_t bkv = std::min<std::int64_t>(pt.block_kv, s.seq_len);
    const Fa2Forward fwd = fa2_forward(in, bq, bkv);
    if (!backward) append(out.values, fwd.o);
    else
      for (const torch::Tensor& g : fa2_backward(in, fwd, bq, bkv)) append(out.values, g);
    out.stats = run.flash.stats;  // the same tiles as the reading's flash kernel
    return out;
  }
  const bool scale_first = algorithm == "torch_baseline_before";
  if (!backward) {
    const torch::NoGradGuard no_grad;
    append(out.values, baseline_forward(in, in.q, in.k, in.v, scale_first));
  } else {
    torch::Tensor q = in.q.clone().requires_grad_(true), k = in.k.clone().requires_grad_(true);
    torch::Tensor v = in.v.clone().requires_grad_(true);
    baseline_forward(in, q, k, v, scale_first).backward(in.dout);
    append(out.values, q.grad());
    append(out.values, k.grad());
    append(out.values, v.grad());
  }
  out.stats.tiles_kv = 1;
  return out;
}

FrameworkOps torch_cpu_ops() {
  // Asked of LibTorch itself on bf16 tensors (FrameworkOps in kernels/attention.hpp): the scalar and the
  // softmax backward must both show LibTorch 1.x's behaviour, else the readings' opmath is what it runs;
  // then its GEMM tells libtorch1_cpu (oneDNN's, fp32 accumulators) from libtorch1_cpublas.
  static const FrameworkOps ops = [] {
    // The scalar: x * s for bf16 values x = 1 + k/128, against round(x * s) and round(x * bf16(s)).
    const double s = 1.0 / std::sqrt(48.0);  // not a bf16 value
    const double s_bf16 = round_to(Format::bf16, s);
    const torch::Tensor x = torch::arange(128, 256, torch::kFloat64) / 128.0;  // exact in bf16
    const torch::Tensor got = (x.to(torch::kBFloat16) * s).to(torch::kFloat64);
    bool scalar_rounded = true, any_differs = false;
    for (std::int64_t i = 0; i < x.size(0); ++i) {
      const double xi = x[i].item<double>(), g = got[i].item<double>();
      const double exact = round_to(Format::bf16, xi * s), rounded = round_to(Format::bf16, xi * s_bf16);
      any_differs = any_differs || exact != rounded;
      scalar_rounded = scalar_rounded && g == rounded;
    }
    // The softmax backward: (dY - D) * Y with D = sum dY * Y in fp32, or rounded to bf16 first.
    const torch::Tensor y = torch::softmax(torch::linspace(-3.0, 3.0, 64, torch::kFloat64), 0).to(torch::kBFloat16);
    const torch::Tensor dy = torch::linspace(-1.0, 1.3, 64, torch::kFloat64).to(torch::kBFloat16);
    const torch::Tensor gi = torch::_softmax_backward_data(dy, y, 0, torch::kBFloat16).to(torch::kFloat64);
    const torch::Tensor yd = y.to(torch::kFloat64), dyd = dy.to(torch::kFloat64);
    const double dot = (yd * dyd).sum().item<double>();
    bool dot_rounded = true, dot_differs = false;
    for (std::int64_t i = 0; i < 64; ++i) {
      const double yi = yd[i].item<double>(), dyi = dyd[i].item<double>(), g = gi[i].item<double>();
      const double opmath = round_to(Format::bf16, static_cast<double>(static_cast<float>((dyi - dot) * yi)));
      const double lib1 = round_to(Format::bf16, (dyi - round_to(Format::bf16, dot)) * yi);
      dot_differs = dot_differs || opmath != lib1;
      dot_rounded = dot_rounded && g == lib1;
    }
    if (!(any_differs && scalar_rounded && dot_differs && dot_rounded)) return FrameworkOps::opmath;
    // The GEMM: a @ b with both operands contiguous (P V's layout), 64 x 64 x 64 (oneDNN, where LibTorch
    // has it, takes products of more than 16^3 multiply-adds), against LibTorch 1.x's cpublas
    // gemm_notrans_ (acc = bf16(acc + bf16(a_l b_l)), l ascending, each add in fp32) and an fp32 sum
    // rounded once. Each row of a is 1 and then 63 terms 2^-10 (an eighth of bf16's spacing at 1), b is
    // ones: one fp32 sum gives 1 + 63 2^-10, which rounds to 1 + 2^-4; the bf16 accumulator stays at 1.
    constexpr std::int64_t kSize = 64;
    const torch::Tensor a = torch::full({kSize, kSize}, 0x1p-10, torch::kFloat64);
    a.select(1, 0).fill_(1.0);
    const torch::Tensor b = torch::ones({kSize, kSize}, torch::kFloat64);
    const torch::Tensor product =
        torch::matmul(a.to(torch::kBFloat16), b.to(torch::kBFloat16)).to(torch::kFloat64);
    double in_format = 0.0, opmath = 0.0;
    for (std::int64_t l = 0; l < kSize; ++l) {
      const double term = a[0][l].item<double>();
      in_format = round_to(Format::bf16, static_cast<double>(static_cast<float>(in_format) +
                                                             static_cast<float>(round_to(Format::bf16, term))));
      opmath += term;
    }
    opmath = round_to(Format::bf16, opmath);
    const bool gemm_in_format = (product == in_format).all().item<bool>();
    return gemm_in_format && in_format != opmath ? FrameworkOps::libtorch1_cpublas : FrameworkOps::libtorch1_cpu;
  }();
  return ops;
}

MicrobenchRow microbench_torch_row(const MicrobenchRun& run, const std::string& algorithm, std::vector<double>* values,
                                   std::vector<double>* reading) {
  const TorchAttention t = torch_attention(run, algorithm);
  const RealCode& code = *find_real_code(algorithm);
  const AttentionKind kind = code.kind;
  MicrobenchRow row = microbench_row(run, algorithm, t.values, run.golden, t.stats);
  // The reading with the code's scale placement (docs/readings.md: fused, after, before) and, where
  // its kernels are framework ops, LibTorch's own treatment of the scalar, the softmax backward and its
  // GEMM (FrameworkOps, probed): named "READING[/scale_PLACEMENT][/OPS] KIND", the kind the last word.
  PrecisionPolicy placed = run.policy_of(kind);
  std::string name = run.point.policy;
  const bool framework = kind == AttentionKind::baseline || placed.kernel == FlashKernel::framework;
  if (framework && placed.scale != code.scale) {
    placed.scale = code.scale;
    name += "/scale_" + std::string(to_string(code.scale));
  }
  const FrameworkOps ops = torch_cpu_ops();
  if (framework && ops != placed.framework_ops) {
    placed.framework_ops = ops;
    name += "/" + std::string(to_string(ops));
  }
  name += " " + std::string(to_string(kind));
  std::vector<double> theirs = name == run.point.policy + " " + std::string(to_string(kind))
                                   ? (kind == AttentionKind::flash ? run.flash : run.baseline).values
                                   : policy_values(run, placed, kind);
  set_agreement(row, t.values, theirs, name);
  if (values != nullptr) *values = t.values;
  if (reading != nullptr) *reading = std::move(theirs);
  return row;
}

}  // namespace fastudy
