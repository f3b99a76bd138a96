// LibTorch's scaled_dot_product_attention, one backend at a time (see sdpa.hpp).
#include "src/train/sdpa.hpp"

#include <string>

#include "base/error.hpp"
#include "fastudy/version.hpp"

namespace fastudy::train {

#if FASTUDY_TORCH_SDPA
namespace {

// Allows exactly one SDPA backend while alive; restores the user's switches on exit.
class OnlyBackend {
 public:
  explicit OnlyBackend(SdpaBackend b)
      : flash_(ctx().userEnabledFlashSDP()),
        efficient_(ctx().userEnabledMemEfficientSDP()),
        cudnn_(ctx().userEnabledCuDNNSDP()),
        math_(ctx().userEnabledMathSDP()) {
    set(b == SdpaBackend::flash, b == SdpaBackend::efficient, b == SdpaBackend::cudnn, b == SdpaBackend::math);
  }
  ~OnlyBackend() { set(flash_, efficient_, cudnn_, math_); }
  OnlyBackend(const OnlyBackend&) = delete;
  OnlyBackend& operator=(const OnlyBackend&) = delete;

 private:
  static at::Context& ctx() { return at::globalContext(); }
  static void set(bool flash, bool efficient, bool cudnn, bool math) {
    ctx().setSDPUseFlash(flash);
    ctx().setSDPUseMemEfficient(efficient);
    ctx().setSDPUseCuDNN(cudnn);
    ctx().setSDPUseMath(math);
  }
  bool flash_, efficient_, cudnn_, math_;
};

}  // namespace
#endif

torch::Tensor sdpa_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             SdpaBackend backend, bool causal) {
  if (backend == SdpaBackend::none) throw Error("sdpa_attention: no backend named");
#if FASTUDY_TORCH_SDPA
  const OnlyBackend only(backend);
  try {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/causal);
  } catch (const c10::Error& e) {
    throw Error(std::string(to_string(backend)) + " cannot run " + std::string(c10::toString(q.scalar_type())) +
                    " attention of head dim " + std::to_string(q.size(-1)) + " on " + q.device().str() + ": " +
                    e.what_without_backtrace(),
                "choose another attention kind, or the precision and device that backend supports "
                "(flash and cuDNN: fp16/bf16 on an NVIDIA GPU, i.e. [train] arithmetic = \"native\")");
  }
#else
  (void)q, (void)k, (void)v, (void)causal;
  throw Error(std::string(to_string(backend)) + " needs LibTorch >= 2.3 (scaled_dot_product_attention); this build links LibTorch " +
                  FASTUDY_TORCH_VERSION,
              "build against a newer LibTorch (docs/gpu.md)");
#endif
}

}  // namespace fastudy::train
