// CUDA events for timing host code's device work without waiting for it: events recorded on a stream
// as the work is issued, read once the stream has passed them (after the step's one synchronisation).
// The one wrapper of cudaEventCreate/Record/ElapsedTime; host code, needs the CUDA runtime headers.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

namespace fastudy::cuda {

class EventLog {
 public:
  EventLog() = default;
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // Records a new event on `stream` (events are created once and reused after clear()); returns its index.
  int record(cudaStream_t stream);
  // Milliseconds from event `from` to event `to`; both must have completed (throws CudaError otherwise).
  float elapsed_ms(int from, int to) const;
  // Waits until event `index` has completed.
  void synchronize(int index) const;
  // Forgets the recorded events (kept for reuse).
  void clear() { used_ = 0; }

 private:
  std::vector<cudaEvent_t> events_;
  int used_ = 0;
};

}  // namespace fastudy::cuda
