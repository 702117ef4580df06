// The operator suite: every fused operator at BERT-base/large and Swin-T/B/L shapes, forward and
// forward + backward, fp16 and bf16, fused and baseline. Or one operator at one shape and dtype.
#pragma once

#include <string>
#include <vector>

#include "kernels/layernorm.h"
#include "suites/ops/operands.h"
#include "suites/runner.h"

namespace fusekit::suites {

struct OpsRequest {
  std::string op;         // "" for the whole suite
  std::string shape;      // with op: "ROWSxCOLUMNS"
  std::string dtype;      // with op: fp32 | fp16 | bf16
  bool backward = false;  // with op: forward + backward instead of forward
};

// Throws std::invalid_argument for an unknown operator, shape or dtype.
std::vector<Case> ops_cases(const OpsRequest& request);

// One operator's cases (fused, and the libtorch baseline where built in).
std::vector<Case> layernorm_cases(Shape2 shape, kernels::DType dtype, bool backward);

// Whether the libtorch baselines were built in.
bool baselines_available();

}  // namespace fusekit::suites
