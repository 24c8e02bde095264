// Decode steps replayed as CUDA graphs. A step of a small model is hundreds
// of short kernels, and launching them one by one costs more than running
// them; a graph captured once launches them all in one call. A graph is
// keyed by the step's launch signature: everything its launches bake in
// (shapes, launch arguments, device buffer addresses). What changes from step
// to step within one signature (positions, page tables, slot counts) lives in
// device buffers the kernels read.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace lazykv {

class StepGraphs {
 public:
  // Keeps at most `capacity` graphs, dropping the least recently used.
  explicit StepGraphs(size_t capacity);
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Runs `launches` on `stream`: replays the graph captured under
  // `signature`, else captures one (`launches` may only enqueue work on
  // `stream`; nothing runs while it captures) and replays it. An exception
  // from `launches` ends the capture and leaves the stream usable.
  void run(const std::vector<int64_t>& signature, cudaStream_t stream, const std::function<void()>& launches);

  size_t captures() const { return captures_; }
  size_t replays() const { return replays_; }

 private:
  struct Entry {
    std::vector<int64_t> signature;
    cudaGraphExec_t exec = nullptr;
    uint64_t last_used = 0;
  };
  cudaGraphExec_t capture(cudaStream_t stream, const std::function<void()>& launches);

  size_t capacity_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
  size_t captures_ = 0, replays_ = 0;
};

}  // namespace lazykv
