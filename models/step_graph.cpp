#include "models/step_graph.h"

#include <stdexcept>
#include <string>

#include "kernels/cuda_check.h"

namespace fusekit::models {

StepGraph::StepGraph(const std::function<void(cudaStream_t)>& enqueue) {
  cudaStream_t stream = nullptr;
  FUSEKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Thread-local mode: other threads' CUDA calls (a tracer's, a peer's) are not part of the capture
  // and do not invalidate it.
  FUSEKIT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  std::string failure;
  try {
    enqueue(stream);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph_);
  cudaStreamDestroy(stream);
  if (!failure.empty() || ended != cudaSuccess) {
    if (graph_) cudaGraphDestroy(graph_);
    graph_ = nullptr;
    cudaGetLastError();  // the capture's error is reported here, not left for the next call
    throw std::runtime_error("step graph: the step could not be captured: " +
                             (failure.empty() ? std::string(cudaGetErrorString(ended)) : failure));
  }
  const cudaError_t counted = cudaGraphGetNodes(graph_, nullptr, &nodes_);
  const cudaError_t instantiated = counted == cudaSuccess ? cudaGraphInstantiate(&exec_, graph_, 0) : counted;
  if (instantiated != cudaSuccess) {
    cudaGraphDestroy(graph_);
    graph_ = nullptr;
    FUSEKIT_CUDA_CHECK(instantiated);
  }
}

StepGraph::~StepGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
}

void StepGraph::launch(cudaStream_t stream) const { FUSEKIT_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

}  // namespace fusekit::models
