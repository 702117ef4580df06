// What the fused models (models/bert_fused.h, models/swin_fused.h) share to hand results to the host:
// a flat device buffer as named float tensors, and one float read back.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "models/bert_model.h"  // HostTensor
#include "models/safetensors.h"

namespace fusekit::models {

// Copies `bytes` of the flat device buffer `flat` to the host (after the device is idle), cuts it
// into tensors with `views_of` (a layout's state-dict views of the host copy) and converts each to
// float divided by `scale` (the loss scale for gradients, 1 for parameters).
std::vector<HostTensor> host_tensors(
    const void* flat, size_t bytes, float scale,
    const std::function<std::vector<TensorView>(std::span<const std::byte>)>& views_of);

// The float at `device` once `stream` has reached this point (synchronizes the stream).
float read_device_float(const void* device, cudaStream_t stream);

}  // namespace fusekit::models
