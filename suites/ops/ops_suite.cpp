#include "suites/ops/ops_suite.h"

#include <stdexcept>

namespace fusekit::suites {
namespace {

// Token counts x hidden sizes: BERT-base and -large at batch 64 x seq 128 and 32 x 512; Swin
// stages at batch 128 (224 x 224 input: 56^2, 28^2, 14^2, 7^2 tokens per image).
const char* const kLayerNormShapes[] = {
    "8192x768",    // BERT-base, 64 x 128
    "8192x1024",   // BERT-large, 64 x 128
    "16384x1024",  // BERT-large, 32 x 512
    "401408x96",   // Swin-T stage 1
    "401408x128",  // Swin-B stage 1
    "401408x192",  // Swin-L stage 1
    "100352x384",  // Swin-L stage 2
    "6272x768",    // Swin-T stage 4
};

}  // namespace

bool baselines_available() {
#ifdef FUSEKIT_WITH_TORCH
  return true;
#else
  return false;
#endif
}

std::vector<Case> ops_cases(const OpsRequest& request) {
  std::vector<Case> cases;
  auto append = [&](std::vector<Case> more) {
    for (Case& c : more) cases.push_back(std::move(c));
  };
  if (!request.op.empty()) {
    if (request.shape.empty() || request.dtype.empty()) {
      throw std::invalid_argument("--op needs --shape and --dtype");
    }
    const Shape2 shape = parse_shape2(request.shape);
    const kernels::DType dtype = parse_dtype(request.dtype);
    if (request.op == "layernorm") {
      append(layernorm_cases(shape, dtype, request.backward));
    } else {
      throw std::invalid_argument("unknown operator '" + request.op + "' (available: layernorm)");
    }
    return cases;
  }
  for (kernels::DType dtype : {kernels::DType::f16, kernels::DType::bf16}) {
    for (bool backward : {false, true}) {
      for (const char* shape : kLayerNormShapes) append(layernorm_cases(parse_shape2(shape), dtype, backward));
    }
  }
  return cases;
}

}  // namespace fusekit::suites
