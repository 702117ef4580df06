// The built-in demo workload: y = a * x + b over rotated input sets larger than L2, once as two
// kernels (scale, then add: the "baseline", moving twice the bytes) and once as one fused kernel.
// It exists to show what fusekit records and reports before the operator suites exist, and to
// test the tracer with known kernels, copies and nested NVTX ranges.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "suites/runner.h"

namespace fusekit::suites {

class DemoSuite {
 public:
  // `elements` per input set; enough sets that all of them together exceed twice the L2 size.
  explicit DemoSuite(size_t elements = size_t{1} << 24);
  ~DemoSuite();
  DemoSuite(const DemoSuite&) = delete;
  DemoSuite& operator=(const DemoSuite&) = delete;

  std::vector<Case> cases();
  // Copies the inputs up and clears the outputs (memcpy and memset records) under range "setup".
  void upload(cudaStream_t stream);

  // y[i] = a * x[i] + b on set `set`, as the baseline's two kernels or the fused one.
  void run_baseline(cudaStream_t stream, int set);
  void run_fused(cudaStream_t stream, int set);
  // Reads back output set `set` (for tests).
  std::vector<float> download(int set);
  std::vector<float> input(int set) const;
  size_t elements() const { return elements_; }
  int sets() const { return sets_; }
  static constexpr float kScale = 1.5f;
  static constexpr float kBias = -0.25f;

 private:
  size_t elements_;
  int sets_ = 0;
  std::vector<float*> x_, y_;
  std::vector<std::vector<float>> host_x_;
};

}  // namespace fusekit::suites
