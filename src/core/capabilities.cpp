// What a device and this build can run (capabilities.hpp): device_problem for a variant's training,
// real_kernel_problem for a microbenchmark sweep's real kernels.
#include "src/core/capabilities.hpp"

#include <algorithm>

#include "base/error.hpp"
#include "fastudy/version.hpp"  // FASTUDY_TORCH_SDPA, FASTUDY_TORCH_CUDA, FASTUDY_TORCH_VERSION, FASTUDY_CUDA_KERNELS
#include "kernels/cuda/tile_dispatch.hpp"  // what the CUDA kernels run (host code, in every build)

namespace fastudy {

std::string device_problem(const Variant& v, Device device) {
  const TrainConfig& t = v.train;
  const std::string precision(to_string(v.precision));
  if (t.shadow_attention && v.sdpa != SdpaBackend::none) {
    return "[train] shadow_attention compares fastudy's flash and baseline kernels; attention = " + v.attention_name() +
           " is LibTorch's own (set shadow_attention = false for it)";
  }
  if (t.arithmetic == Arithmetic::native) {
    const NumericsConfig& n = v.numerics;
    if (n.matmul != MatmulArithmetic::fp32 || n.split_k != 1 || n.layernorm != LayerNormAlgorithm::torch) {
      return "[numerics] matmul, split_k and layernorm are emulated arithmetic; arithmetic = native runs the "
             "framework's own (keep their defaults, or use arithmetic = \"emulated\")";
    }
    if (device == Device::cpu && (v.precision == Format::fp16 || v.precision == Format::tf32)) {
      return "arithmetic = native with precision " + precision + " needs a GPU (a CPU has no native " + precision +
             " matmuls); use device = \"cuda\", precision bf16, or arithmetic = \"emulated\"";
    }
  }
  if (device != Device::cuda) return "";
  if (!FASTUDY_TORCH_CUDA) {
    return std::string("device = \"cuda\" needs a CUDA LibTorch; this build links LibTorch ") + FASTUDY_TORCH_VERSION +
           " without CUDA (build against PyTorch's LibTorch on a GPU machine: docs/gpu.md)";
  }
  if (v.precision == Format::fp64) return "fp64 variants train on the CPU only (the CUDA kernels have no fp64)";
  if (v.numerics.layernorm != LayerNormAlgorithm::torch) {
    return "[numerics] layernorm = " + std::string(to_string(v.numerics.layernorm)) + " runs on the CPU only";
  }
  if (v.sdpa == SdpaBackend::none) {
    try {
      cuda_tile::tile_storage_format(resolve_policy(v.attention_cfg, v.attention_cfg.policy, v.precision, v.attention));
    } catch (const UsageError& e) {
      return e.what() + std::string(" (or train this variant with device = \"cpu\")");
    }
  }
  return "";
}

std::optional<SweepProblem> real_kernel_problem(const MicrobenchSweep& sw) {
  auto lists = [](const std::vector<std::string>& v, const char* x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  if (!lists(sw.devices, "cpu"))
    return SweepProblem{"devices",
                        "devices must list \"cpu\": the CPU kernels are the reference the CUDA rows are checked "
                        "against, and their rows are the emulated readings",
                        "devices = [\"cpu\", \"cuda\"]"};
  if (lists(sw.devices, "cuda")) {
    for (Format f : sw.formats)
      if (f != Format::fp32 && f != Format::fp16 && f != Format::bf16)
        return SweepProblem{"formats",
                            "devices lists \"cuda\", and the CUDA kernels do not run " + std::string(to_string(f)) +
                                " (they run fp32, fp16 and bf16)",
                            "put the other formats in a sweep of their own without \"cuda\""};
    for (const auto& p : sw.policies)
      if (const Reading* r = find_reading(p); r == nullptr || !r->cuda)
        return SweepProblem{"policies",
                            "devices lists \"cuda\", and the CUDA kernels do not run policy \"" + p +
                                "\" (they run the readings " + cuda_reading_names() + ")",
                            r == nullptr ? "put custom policies in a sweep of their own without \"cuda\""
                                         : "put the reading " + p + " in a sweep of its own without \"cuda\""};
    for (Rounding r : sw.roundings)
      if (r != Rounding::nearest)
        return SweepProblem{"roundings",
                            "devices lists \"cuda\", and the CUDA kernels round to nearest only (not " +
                                std::string(to_string(r)) + ")",
                            "drop roundings, or put the other modes in a sweep of their own without \"cuda\""};
    if (!FASTUDY_CUDA_KERNELS)
      return SweepProblem{"devices",
                          "devices lists \"cuda\", and this build has no CUDA kernels (it was configured without "
                          "nvcc)",
                          "build on a machine with the CUDA toolkit (docs/gpu.md), or remove \"cuda\""};
  }
  std::vector<std::string> cpu_code, cuda_code;
  for (const auto& a : sw.framework)
    (find_real_code(a) != nullptr && find_real_code(a)->device == "cpu" ? cpu_code : cuda_code).push_back(a);
  for (const auto& a : cpu_code) {
    for (Format f : sw.formats) {
      // LibTorch 1.x (Debian's 1.13) has no fp16 matmul on the CPU ("addmm_impl_cpu_" not implemented for
      // 'Half'); on a later LibTorch the microbenchmark asks LibTorch itself before any work.
      const bool no_fp16 = f == Format::fp16 && std::string(FASTUDY_TORCH_VERSION).rfind("1.", 0) == 0;
      if (no_fp16 || (f != Format::fp64 && f != Format::fp32 && f != Format::fp16 && f != Format::bf16))
        return SweepProblem{"framework",
                            "framework lists " + a + " (LibTorch's ops on the CPU), and this build's LibTorch " +
                                std::string(FASTUDY_TORCH_VERSION) + " has no " + std::string(to_string(f)) +
                                (no_fp16 ? " matmul on the CPU" : " tensors on the CPU") + " (formats lists it)",
                            "run the CPU framework rows at bf16 (or fp32, fp64): put " + std::string(to_string(f)) +
                                " in a sweep of its own without them"};
    }
    if (find_real_code(a)->kind == AttentionKind::flash &&
        std::find(sw.loop_orders.begin(), sw.loop_orders.end(), LoopOrder::q_outer) == sw.loop_orders.end())
      return SweepProblem{"framework",
                          "framework lists " + a + ", FlashAttention-2's loop (q_outer), and loop_orders has no "
                          "q_outer to put it beside",
                          "add \"q_outer\" to loop_orders"};
  }
  if (!cuda_code.empty()) {
    for (Format f : sw.formats)
      if (f != Format::fp16 && f != Format::bf16)
        return SweepProblem{"formats",
                            "framework kernels on the GPU (" + cuda_code.front() +
                                ") run at fp16 and bf16, and this sweep lists " + std::string(to_string(f)),
                            "formats = [\"fp16\", \"bf16\"]; put the other formats in a sweep of their own"};
    if (!FASTUDY_TORCH_SDPA)
      return SweepProblem{"framework",
                          "framework kernels need LibTorch >= 2.3 (scaled_dot_product_attention with selectable "
                          "backends); this build links LibTorch " + std::string(FASTUDY_TORCH_VERSION),
                          "build against a newer CUDA LibTorch (docs/gpu.md), or remove framework"};
    if (!FASTUDY_TORCH_CUDA)
      return SweepProblem{"framework",
                          "framework kernels run on the CUDA device, and this build's LibTorch " +
                              std::string(FASTUDY_TORCH_VERSION) + " has no CUDA",
                          "build against a CUDA LibTorch (docs/gpu.md), or remove framework"};
  }
  return std::nullopt;
}

}  // namespace fastudy
