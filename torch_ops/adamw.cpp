// fusekit::adamw_step_ over kernels/adamw.h: one AdamW step (torch.optim.AdamW's arithmetic) over
// lists of float32 parameters, gradients and moments, in one launch. The launch walks a chunk table
// that lives on the device (kernels/adamw.h AdamWTensorList); building one uploads it, so the tables
// of the last few lists, keyed by every pointer and size in them, are kept: a training loop whose
// gradients come back at the same addresses every step (PyTorch's caching allocator does that in
// the steady state) builds its table once.
#include <torch/library.h>

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/adamw.h"
#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {
namespace {

constexpr size_t kCachedTables = 4;

struct CachedTable {
  std::vector<uintptr_t> key;  // device, then per tensor: param, grad, exp_avg, exp_avg_sq, count
  std::unique_ptr<kernels::AdamWTensorList> table;
};

const kernels::AdamWTensorList& table_for(const std::vector<kernels::AdamWTensor>& tensors, int device) {
  static std::mutex mutex;
  static std::list<CachedTable> cache;  // most recently used first
  std::vector<uintptr_t> key = {static_cast<uintptr_t>(device)};
  for (const kernels::AdamWTensor& t : tensors) {
    key.insert(key.end(), {reinterpret_cast<uintptr_t>(t.param), reinterpret_cast<uintptr_t>(t.grad),
                           reinterpret_cast<uintptr_t>(t.exp_avg), reinterpret_cast<uintptr_t>(t.exp_avg_sq),
                           static_cast<uintptr_t>(t.count)});
  }
  const std::lock_guard<std::mutex> lock(mutex);
  for (auto it = cache.begin(); it != cache.end(); ++it) {
    if (it->key == key) {
      cache.splice(cache.begin(), cache, it);
      return *cache.front().table;
    }
  }
  cache.push_front({std::move(key), std::make_unique<kernels::AdamWTensorList>(tensors)});
  if (cache.size() > kCachedTables) cache.pop_back();
  return *cache.front().table;
}

void adamw_step_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                 double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  constexpr const char* op = "adamw_step_";
  TORCH_CHECK_VALUE(
      grads.size() == params.size() && exp_avgs.size() == params.size() && exp_avg_sqs.size() == params.size(),
      text("fusekit::adamw_step_: ", params.size(), " params but ", grads.size(), " grads, ", exp_avgs.size(),
           " exp_avgs and ", exp_avg_sqs.size(), " exp_avg_sqs"));
  TORCH_CHECK_VALUE(step >= 1, text("fusekit::adamw_step_: step counts from 1, not ", step));
  if (params.empty()) return;
  std::vector<kernels::AdamWTensor> tensors;
  tensors.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string which = std::to_string(i);
    for (const auto& [t, name] : {std::pair{&params[i], "params"},
                                  {&grads[i], "grads"},
                                  {&exp_avgs[i], "exp_avgs"},
                                  {&exp_avg_sqs[i], "exp_avg_sqs"}}) {
      check_cuda(*t, at::kFloat, op, (std::string(name) + "[" + which + "]").c_str());
      TORCH_CHECK_VALUE(t->device() == params[0].device(), text("fusekit::adamw_step_: ", name, "[", which, "] is on ",
                                                                t->device(), " but params[0] on ", params[0].device()));
      check_numel(*t, params[i].numel(), op, (std::string(name) + "[" + which + "]").c_str());
    }
    tensors.push_back({params[i].data_ptr<float>(), grads[i].data_ptr<float>(), exp_avgs[i].data_ptr<float>(),
                       exp_avg_sqs[i].data_ptr<float>(), static_cast<size_t>(params[i].numel())});
  }
  const c10::cuda::CUDAGuard guard(params[0].device());
  const kernels::AdamWTensorList& table = table_for(tensors, params[0].device().index());
  kernels::AdamWOptions options;
  options.lr = lr;
  options.beta1 = beta1;
  options.beta2 = beta2;
  options.eps = eps;
  options.weight_decay = weight_decay;
  kernels::adamw_step(table, options, step, current_stream(params[0]));
}

}  // namespace

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) { m.impl("adamw_step_", &adamw_step_); }

}  // namespace fusekit::torch_ops
