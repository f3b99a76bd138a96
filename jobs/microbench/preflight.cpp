// The microbench job's CUDA preflight (microbench_preflight.hpp): a device on every rank for the sweeps
// that need one, and our flash kernel's tiles within what the device holds.
#include "jobs/microbench/preflight.hpp"

#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>

#include "src/train/microbench_sdpa.hpp"
#if FASTUDY_HAVE_CUDA_KERNELS
#include "kernels/cuda/attention_cuda.hpp"
#endif
#include "src/runtime/gpu.hpp"

namespace fastudy {

bool runs_our_cuda_kernels(const MicrobenchSweep& sw) {
  return std::find(sw.devices.begin(), sw.devices.end(), "cuda") != sw.devices.end();
}

// Whether a sweep lists framework code that runs on the CUDA device (LibTorch's SDPA rows; the CPU rows,
// torch_*, need none).
bool runs_framework_on_cuda(const MicrobenchSweep& sw) {
  return std::any_of(sw.framework.begin(), sw.framework.end(), [](const std::string& a) {
    const RealCode* code = find_real_code(a);
    return code != nullptr && code->device == "cuda";
  });
}

int microbench_cuda_preflight(const Study& st, const std::vector<CudaPointTiles>& tiles, mpi::Comm& world) {
  const MicrobenchSweep* ours = nullptr;
  const MicrobenchSweep* framework = nullptr;
  for (const auto& sw : st.microbench.sweeps) {
    if (!ours && runs_our_cuda_kernels(sw)) ours = &sw;
    if (!framework && runs_framework_on_cuda(sw)) framework = &sw;
  }
  if (!ours && !framework) return -1;
  std::string why;
  int count = 0;
  if (ours) {
#if FASTUDY_HAVE_CUDA_KERNELS
    count = cuda::device_count(&why);
#else
    why = "this build has no CUDA kernels";  // load_study refuses it first
    (void)tiles;
#endif
  }
  if ((!ours || count > 0) && framework) {
    if (sdpa_device_available(&why))
      count = ours ? std::min(count, sdpa_device_count()) : sdpa_device_count();
    else
      count = 0;
  }
  const std::int64_t missing = world.allreduce_max(std::int64_t{count > 0 ? 0 : 1});
  if (missing != 0) {
    const MicrobenchSweep& sw = ours && (count == 0 || !framework) ? *ours : *framework;
    const std::string key = &sw == ours ? "devices = [..., \"cuda\"]" : "framework";
    throw UsageError(st.file + ": [microbench] sweep '" + sw.name + "': " + key + " needs a CUDA device, and " +
                         (count > 0 ? std::string("another rank sees none")
                                    : "rank " + std::to_string(world.rank()) + " sees none (" + why + ")"),
                     "run on a machine with an NVIDIA GPU (nvidia-smi, CUDA_VISIBLE_DEVICES), or remove the key "
                     "(configs/microbench.toml runs on the CPU)");
  }
  const int device = select_gpu(world);  // the trainer's rule: node-local rank modulo the devices, made current
#if FASTUDY_HAVE_CUDA_KERNELS
  if (ours) {
    std::string sweep, why_tiles, hint;
    std::set<std::tuple<int, int, int>> seen;
    for (const auto& t : tiles) {
      if (!seen.insert({t.block_q, t.block_kv, t.head_dim}).second) continue;
      try {
        cuda::check_flash_tiles(t.block_q, t.block_kv, t.head_dim);
      } catch (const UsageError& e) {
        sweep = t.sweep;
        why_tiles = e.what();
        hint = e.hint();
        break;
      }
    }
    if (world.allreduce_max(std::int64_t{why_tiles.empty() ? 0 : 1}) != 0) {
      throw UsageError(st.file + ": [microbench] " +
                           (why_tiles.empty() ? std::string("another rank's device cannot hold the CUDA kernels' tiles")
                                              : "sweep '" + sweep + "': blocks (or sram) and head_dims with devices = "
                                                "[..., \"cuda\"]: " + why_tiles),
                       hint.empty() ? "use smaller block_q/block_kv for the CUDA kernels" : hint);
    }
  }
#endif
  return device;
}

}  // namespace fastudy
