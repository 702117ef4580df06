// One training step captured as a CUDA graph: the models' enqueue_step (every kernel, copy and
// memset of a step, on a stream, with no host synchronization and no allocation) recorded once on a
// private stream and instantiated; launch() replays it on any stream. Shapes and pointers are fixed
// at capture, so each prepared batch gets its own graph; what changes from step to step lives on the
// device (the AdamW trainer's step count, the dropout step counter of kernels/step_counter.h).
//
// Ranges (NVTX) pushed while capturing are not replayed: a graph's kernels land in the range open
// where launch() is called (profiler/attribution.h).
#pragma once

#include <cuda_runtime.h>

#include <functional>

namespace fusekit::models {

class StepGraph {
 public:
  // Captures enqueue(stream) on a stream of its own; throws std::runtime_error with CUDA's message
  // where the work cannot be captured (a synchronization or an allocation inside it).
  explicit StepGraph(const std::function<void(cudaStream_t)>& enqueue);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  void launch(cudaStream_t stream) const;
  size_t nodes() const { return nodes_; }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
};

}  // namespace fusekit::models
