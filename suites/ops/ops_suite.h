// The operator suite: every fused operator at BERT-base/large and Swin-T/B/L shapes, forward and
// forward + backward, fp16 and bf16, fused and baseline. Or one operator at one shape and dtype.
//
// Each operator lives in its own file (suites/ops/<op>.cpp) and describes itself with an
// OpDefinition returned by its <op>_op(); the registry in ops_suite.cpp, FUSEKIT_OPERATORS, lists
// them once.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "suites/ops/operands.h"
#include "suites/runner.h"

namespace fusekit::suites {

struct OpsRequest {
  std::string op;                 // "" for a whole suite
  std::string shape;              // with op: the operator's shape syntax (OpDefinition::shape_syntax)
  std::string dtype;              // fp32 | fp16 | bf16; without op: the suite in this dtype only
  bool backward = false;          // with op: forward + backward instead of forward
  std::vector<std::string> only;  // without op: the suite's operators to run (empty: all of them)
  std::string suite = "ops";      // without op: the suite (OpDefinition::suite)
};

struct OpDefinition {
  std::string name;                 // "layernorm"
  std::string suite = "ops";        // the suite it belongs to: "ops" | "attention"
  std::string shape_syntax;         // "ROWSxCOLUMNS", for error messages
  std::vector<std::string> shapes;  // the suite's shapes
  bool has_backward = true;         // false: one case per shape and dtype (e.g. an optimizer step)
  // The cases of one shape, dtype and direction: fused, and the libtorch baseline where built in.
  // Throws std::invalid_argument for a shape it cannot parse or does not support.
  std::function<std::vector<Case>(const std::string& shape, kernels::DType dtype, bool backward)> cases;
};

// The suites operators belong to.
const std::vector<std::string>& op_suites();

// Every operator of every suite, in suite order.
const std::vector<OpDefinition>& ops();

// Throws std::invalid_argument for an unknown operator, shape or dtype.
std::vector<Case> ops_cases(const OpsRequest& request);

// One case of a selection without its variants: what the peers are handed (suites/peers.h).
struct ListedCase {
  store::CaseInfo info;   // name, op, shape, dtype, bytes, flops; variant empty
  bool backward = false;  // forward + backward ("fwd+bwd"), else forward ("fwd")
};

// The cases ops_cases(request) builds, one per name (its variants share the name), in the same
// order. Allocates no device memory and needs no GPU. Throws as ops_cases does.
std::vector<ListedCase> list_ops_cases(const OpsRequest& request);

// The case description every operator fills the same way: name "<op>/<shape>/<dtype>/<fwd|fwd+bwd>".
store::CaseInfo make_case_info(const std::string& op, const std::string& shape, kernels::DType dtype, bool backward,
                               double bytes);

// Whether the libtorch baselines were built in.
bool baselines_available();

}  // namespace fusekit::suites
