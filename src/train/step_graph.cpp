// CUDA graphs of a step's forward and backward pass (see step_graph.hpp), after the recipe of
// PyTorch's "CUDA Graphs" notes (whole-network capture): warm up on a side stream, capture on it, the
// current stream waiting for it; the graph's tensors come from its private pool of LibTorch's caching
// allocator (aten/src/ATen/cuda/CUDAGraph.h).
#include "src/train/step_graph.hpp"

#include <string>

#include "base/error.hpp"
#include "fastudy/version.hpp"  // FASTUDY_TORCH_CUDA

#if FASTUDY_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#endif

namespace fastudy::train {

#if FASTUDY_TORCH_CUDA
struct StepGraph::Impl {
  std::unique_ptr<at::cuda::CUDAGraph> graph;
};

StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}
StepGraph::~StepGraph() = default;

bool StepGraph::available() { return true; }

void StepGraph::capture(const std::function<void()>& pass) {
  impl_->graph.reset();
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::cuda::CUDAEvent issued;
  issued.record(current);
  issued.block(side);  // the side stream starts after the work issued so far (the step's inputs)
  try {
    const c10::cuda::CUDAStreamGuard on_side(side);
    pass();  // the warm-up: this step's results, op by op
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    graph->capture_begin();
    pass();  // recorded, not run
    graph->capture_end();
    impl_->graph = std::move(graph);
  } catch (const c10::Error& e) {
    throw Error(std::string("capturing the training step in a CUDA graph failed: ") + e.what_without_backtrace(),
                "train without --cuda-graph");
  }
  at::cuda::CUDAEvent done;
  done.record(side);
  done.block(current);
}

bool StepGraph::captured() const { return impl_->graph != nullptr; }

void StepGraph::replay() { impl_->graph->replay(); }

#else
struct StepGraph::Impl {};

StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}
StepGraph::~StepGraph() = default;

bool StepGraph::available() { return false; }

void StepGraph::capture(const std::function<void()>&) {
  throw Error(std::string("CUDA graphs need a CUDA build of LibTorch; this build links LibTorch ") +
                  FASTUDY_TORCH_VERSION,
              "train without --cuda-graph, or build against a CUDA LibTorch (docs/gpu.md)");
}

bool StepGraph::captured() const { return false; }

void StepGraph::replay() {
  throw Error("no CUDA graph was captured", "capture the step before replaying it");
}
#endif

}  // namespace fastudy::train
