#include "worker/cuda/step_graphs.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"

namespace lazykv {

StepGraphs::StepGraphs(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

StepGraphs::~StepGraphs() {
  for (Entry& e : entries_) static_cast<void>(cudaGraphExecDestroy(e.exec));
}

cudaGraphExec_t StepGraphs::capture(cudaStream_t stream, const std::function<void()>& launches) {
  // Thread-local: the worker's other threads may use CUDA meanwhile.
  LAZYKV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    launches();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    static_cast<void>(cudaStreamEndCapture(stream, &partial));
    if (partial != nullptr) static_cast<void>(cudaGraphDestroy(partial));
    throw;
  }
  cudaGraph_t graph = nullptr;
  LAZYKV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  static_cast<void>(cudaGraphDestroy(graph));
  LAZYKV_CUDA_CHECK(made);
  ++captures_;
  return exec;
}

void StepGraphs::run(const std::vector<int64_t>& signature, cudaStream_t stream,
                     const std::function<void()>& launches) {
  auto found = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.signature == signature; });
  if (found == entries_.end()) {
    if (entries_.size() == capacity_) {
      auto oldest = std::min_element(entries_.begin(), entries_.end(),
                                     [](const Entry& a, const Entry& b) { return a.last_used < b.last_used; });
      LAZYKV_CUDA_CHECK(cudaGraphExecDestroy(oldest->exec));
      entries_.erase(oldest);
    }
    const cudaGraphExec_t exec = capture(stream, launches);
    try {
      entries_.push_back({signature, exec, 0});
    } catch (...) {
      static_cast<void>(cudaGraphExecDestroy(exec));
      throw;
    }
    found = entries_.end() - 1;
  }
  found->last_used = ++clock_;
  LAZYKV_CUDA_CHECK(cudaGraphLaunch(found->exec, stream));
  ++replays_;
}

}  // namespace lazykv
