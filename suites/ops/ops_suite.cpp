#include "suites/ops/ops_suite.h"

#include <algorithm>

#include <stdexcept>

namespace fusekit::suites {

bool baselines_available() {
#ifdef FUSEKIT_WITH_TORCH
  return true;
#else
  return false;
#endif
}

const std::vector<OpDefinition>& ops() {
  static const std::vector<OpDefinition> all = {
      layernorm_op(),        bias_gelu_op(),      softmax_op(),       bias_dropout_residual_layernorm_op(),
      cross_entropy_op(),    adamw_op(),          linear_op(),        embedding_layernorm_op(),
      window_partition_op(), window_merge_op(),   patch_merging_op(), window_attention_op(),
      qkv_projection_op(),   bert_attention_op(),
  };
  return all;
}

store::CaseInfo make_case_info(const std::string& op, const std::string& shape, kernels::DType dtype, bool backward,
                               double bytes) {
  store::CaseInfo info;
  info.op = op;
  info.shape = shape;
  info.dtype = kernels::dtype_name(dtype);
  info.name = op + "/" + shape + "/" + info.dtype + (backward ? "/fwd+bwd" : "/fwd");
  info.bytes = bytes;
  return info;
}

const std::vector<std::string>& op_suites() {
  static const std::vector<std::string> all = {"ops", "attention"};
  return all;
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
    const kernels::DType dtype = parse_dtype(request.dtype);
    std::string names;
    for (const OpDefinition& op : ops()) {
      if (op.name != request.op) {
        names += (names.empty() ? "" : ", ") + op.name;
        continue;
      }
      if (request.backward && !op.has_backward) {
        throw std::invalid_argument("operator '" + op.name + "' has no backward: leave out --backward");
      }
      append(op.cases(request.shape, dtype, request.backward));
      return cases;
    }
    throw std::invalid_argument("unknown operator '" + request.op + "' (available: " + names + ")");
  }
  if (std::find(op_suites().begin(), op_suites().end(), request.suite) == op_suites().end()) {
    throw std::invalid_argument("unknown operator suite '" + request.suite + "'");
  }
  for (const std::string& name : request.only) {
    bool known = false;
    for (const OpDefinition& op : ops()) known = known || (op.name == name && op.suite == request.suite);
    if (!known) {
      std::string names;
      for (const OpDefinition& op : ops()) {
        if (op.suite == request.suite) names += (names.empty() ? "" : ", ") + op.name;
      }
      throw std::invalid_argument("unknown operator '" + name + "' in --ops (the " + request.suite +
                                  " suite has: " + names + ")");
    }
  }
  std::vector<kernels::DType> dtypes = {kernels::DType::f16, kernels::DType::bf16};
  if (!request.dtype.empty()) dtypes = {parse_dtype(request.dtype)};  // the whole suite in one dtype
  for (const OpDefinition& op : ops()) {
    if (op.suite != request.suite) continue;
    if (!request.only.empty() && std::find(request.only.begin(), request.only.end(), op.name) == request.only.end()) {
      continue;
    }
    for (kernels::DType dtype : dtypes) {
      for (bool backward : {false, true}) {
        if (backward && !op.has_backward) continue;
        for (const std::string& shape : op.shapes) append(op.cases(shape, dtype, backward));
      }
    }
  }
  if (cases.empty()) throw std::invalid_argument("the " + request.suite + " suite has no operators yet");
  return cases;
}

}  // namespace fusekit::suites
