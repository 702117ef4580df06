#include "models/host_tensors.h"

#include "kernels/cuda_check.h"
#include "models/storage_conversion.h"

namespace fusekit::models {

std::vector<HostTensor> host_tensors(
    const void* flat, size_t bytes, float scale,
    const std::function<std::vector<TensorView>(std::span<const std::byte>)>& views_of) {
  FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<std::byte> host(bytes);
  FUSEKIT_CUDA_CHECK(cudaMemcpy(host.data(), flat, host.size(), cudaMemcpyDeviceToHost));
  std::vector<HostTensor> out;
  for (const TensorView& view : views_of(host)) {
    HostTensor t{view.name, view.shape, std::vector<float>(view.elements())};
    convert_storage(*storage_type(view.type), view.bytes.data(), kernels::DType::f32,
                    reinterpret_cast<std::byte*>(t.values.data()), t.values.size());
    for (float& v : t.values) v /= scale;
    out.push_back(std::move(t));
  }
  return out;
}

float read_device_float(const void* device, cudaStream_t stream) {
  float value = 0.f;
  FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(&value, device, sizeof(float), cudaMemcpyDeviceToHost, stream));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return value;
}

}  // namespace fusekit::models
