// Device operands for the operator suite: buffers that free themselves, random fills on the GPU,
// and how many rotated input sets a case needs so that its timings are of memory, not of L2.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace fusekit::suites {

// The inputs a model's cases share (initial weights, batches), kept for `key` until another key is
// asked for: a model's cases follow one another (its variants; in the timed pass, then again in the
// traced one), and drawing them took seconds of each case's set-up. One kept value per call site
// (the statics belong to the instantiation, and each call site's `make` is a lambda of its own
// type); set-up runs on the runner's thread.
template <class T, class Make>
std::shared_ptr<const T> kept_for(const std::string& key, Make make) {
  static std::string kept_key;
  static std::shared_ptr<const T> kept;
  if (kept == nullptr || kept_key != key) {
    kept.reset();  // the old inputs go before the new ones are made
    kept = make();
    kept_key = key;
  }
  return kept;
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  void* get() const { return data_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Fills `count` elements of `dtype` with offset + scale * (uniform in [-1, 1)), from a counter-based
// hash of (seed, index): fresh inputs for every case, made on the GPU.
void fill_random(void* data, size_t count, kernels::DType dtype, uint64_t seed, float scale, float offset,
                 cudaStream_t stream);

// Sets of `bytes_per_set` each, at least 2, together more than twice the L2 size.
int rotation_sets(size_t bytes_per_set);

// The `count` sizes of "AxBx..." (a shape's text before any ":option"): positive integers of at
// most `limit`, separated by single 'x's; anything else throws std::invalid_argument(usage).
std::vector<long> parse_sizes(const std::string& text, int count, long limit, const std::string& usage);

// "8192x768" -> {8192, 768}; throws std::invalid_argument on anything else.
struct Shape2 {
  int rows;
  int columns;
};
Shape2 parse_shape2(const std::string& text);

kernels::DType parse_dtype(const std::string& text);  // fp32 | fp16 | bf16

// Device memory in use now (all allocations on the device, this process's context included): what
// a whole training step's case subtracts from its peak to report its own memory.
double device_bytes_in_use();

}  // namespace fusekit::suites
