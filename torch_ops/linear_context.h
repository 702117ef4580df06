// The cuBLASLt context (kernels/linear.h: handle, workspace, plans) of fusekit's torch.ops, one per
// device, shared by every op that runs GEMMs (fusekit::linear, fusekit::bert_layer). Hold
// linear_context_mutex() while enqueueing on a context: the lock orders the enqueueing, not the GPU
// work, so GEMMs enqueued on two streams at once could share the workspace while both run (a
// context serves one stream). One stream per device, as training uses.
#pragma once

#include <mutex>

#include "kernels/linear.h"

namespace fusekit::torch_ops {

std::mutex& linear_context_mutex();

// Under linear_context_mutex(), on the current device; made on first use.
kernels::LinearContext& linear_context_for(int device);

}  // namespace fusekit::torch_ops
