// The forward and backward pass of a training step as a CUDA graph (LibTorch's at::cuda::CUDAGraph):
// captured once from the step's own ops, replayed on the following steps, which then cost one launch
// instead of hundreds. The captured function reads its inputs from and writes its outputs to tensors
// that stay in place (the engine's static token, loss and gradient buffers), so replaying it computes
// exactly what running it op by op computes. Needs a CUDA LibTorch (FASTUDY_TORCH_CUDA); internal to
// src/train.
#pragma once

#include <functional>
#include <memory>

namespace fastudy::train {

class StepGraph {
 public:
  StepGraph();
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Whether this build can capture graphs (a CUDA LibTorch).
  static bool available();
  // Runs `pass` once op by op on a side stream (its results are the current step's: the warm-up that
  // CUDA graphs need), then captures it; the current stream waits for the side stream. Replaces an
  // earlier capture. Throws fastudy::Error when capturing fails (the pass synchronised, or allocated
  // outside LibTorch's allocator).
  void capture(const std::function<void()>& pass);
  bool captured() const;
  // Runs the captured pass on the current stream.
  void replay();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastudy::train
