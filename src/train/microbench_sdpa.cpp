// LibTorch's SDPA backends as microbenchmark algorithms (see microbench_sdpa.hpp). Compiles against
// every LibTorch: on one without SDPA or CUDA the config refuses these algorithms at load, and
// sdpa_attention throws if it is reached anyway.
#include "src/train/microbench_sdpa.hpp"

#include <torch/cuda.h>

#include <algorithm>
#include <vector>

#include "base/error.hpp"
#include "fastudy/version.hpp"
#include "src/train/libtorch.hpp"
#include "src/train/sdpa.hpp"

namespace fastudy {
namespace {

SdpaBackend backend_of(const std::string& name) {
  if (const std::optional<SdpaBackend> b = parse_sdpa_backend(name)) return *b;
  throw UsageError("unknown framework kernel '" + name + "'",
                   "use sdpa_flash, sdpa_efficient, sdpa_cudnn or sdpa_math");
}

void append(std::vector<double>& out, const torch::Tensor& t) {
  const torch::Tensor h = t.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  out.insert(out.end(), h.data_ptr<double>(), h.data_ptr<double>() + h.numel());
}

}  // namespace

int sdpa_device_count() {
  return FASTUDY_TORCH_CUDA && torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

bool sdpa_device_available(std::string* why) {
  std::string reason;
  if (!FASTUDY_TORCH_SDPA || !FASTUDY_TORCH_CUDA)
    reason = std::string("this build's LibTorch ") + FASTUDY_TORCH_VERSION +
             (FASTUDY_TORCH_CUDA ? " has no scaled_dot_product_attention" : " has no CUDA");
  else if (sdpa_device_count() == 0)
    reason = "LibTorch sees no CUDA device (torch::cuda::is_available() is false)";
  if (why != nullptr) *why = reason;
  return reason.empty();
}

MicrobenchRow microbench_sdpa_row(const MicrobenchRun& run, const std::string& backend, int device,
                                  std::vector<double>* out) {
  const Format f = run.point.format;
  if (f != Format::fp16 && f != Format::bf16)
    throw UsageError("framework kernel " + backend + " at " + std::string(to_string(f)) + ": it runs fp16 and bf16");
  const SdpaBackend b = backend_of(backend);
  const auto dtype = f == Format::fp16 ? torch::kHalf : torch::kBFloat16;
  const AttentionShape& s = run.shape;
  const std::vector<std::int64_t> dims{s.batch, s.heads, s.seq_len, s.head_dim};
  const torch::Device dev(torch::kCUDA, static_cast<c10::DeviceIndex>(device));
  // The values are exact in f (rounded by prepare_microbench_point), so the conversion is exact.
  auto tensor = [&](const std::vector<double>& x) {
    return torch::from_blob(const_cast<double*>(x.data()), dims, torch::kFloat64).to(dev, dtype);
  };
  std::vector<double> values;
  const bool backward = run.point.pass == Pass::backward;
  if (!backward) {
    const torch::NoGradGuard no_grad;
    append(values, train::sdpa_attention(tensor(run.q), tensor(run.k), tensor(run.v), b, s.causal));
  } else {
    torch::Tensor q = tensor(run.q).requires_grad_(true), k = tensor(run.k).requires_grad_(true);
    torch::Tensor v = tensor(run.v).requires_grad_(true);
    train::sdpa_attention(q, k, v, b, s.causal).backward(tensor(run.dout));
    append(values, q.grad());
    append(values, k.grad());
    append(values, v.grad());
  }
  AttentionStats none;
  none.tiles_kv = 0;
  none.rescales_per_row = 0;
  MicrobenchRow row = microbench_row(run, backend, values, run.golden, none);
  if (out != nullptr) *out = std::move(values);
  return row;
}

}  // namespace fastudy
