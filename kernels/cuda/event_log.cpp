// CUDA events for device timings (see event_log.hpp).
#include "kernels/cuda/event_log.hpp"

#include "kernels/cuda/cuda_check.hpp"

namespace fastudy::cuda {

EventLog::~EventLog() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

int EventLog::record(cudaStream_t stream) {
  if (used_ == static_cast<int>(events_.size())) {
    cudaEvent_t e = nullptr;
    FASTUDY_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  FASTUDY_CUDA_CHECK(cudaEventRecord(events_[static_cast<std::size_t>(used_)], stream));
  return used_++;
}

float EventLog::elapsed_ms(int from, int to) const {
  float ms = 0.0f;
  FASTUDY_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[static_cast<std::size_t>(from)], events_[static_cast<std::size_t>(to)]));
  return ms;
}

void EventLog::synchronize(int index) const {
  FASTUDY_CUDA_CHECK(cudaEventSynchronize(events_[static_cast<std::size_t>(index)]));
}

}  // namespace fastudy::cuda
