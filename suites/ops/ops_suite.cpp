#include "suites/ops/ops_suite.h"

#include <algorithm>
#include <optional>

#include <stdexcept>

namespace fusekit::suites {

bool baselines_available() {
#ifdef FUSEKIT_WITH_TORCH
  return true;
#else
  return false;
#endif
}

// The registry: every operator, in suite order (the order a suite's cases run in), named by its
// file suites/ops/<op>.cpp, which defines <op>_op(). Swin's window partition, merge and patch
// merging share suites/ops/swin_window.cpp. Adding an operator adds one entry here (CMake finds
// its files in their folders); the suites and the peers' listing (fusekit cases) follow from it.
#define FUSEKIT_OPERATORS(X)         \
  X(layernorm)                       \
  X(bias_gelu)                       \
  X(softmax)                         \
  X(bias_dropout_residual_layernorm) \
  X(cross_entropy)                   \
  X(adamw)                           \
  X(linear)                          \
  X(embedding_layernorm)             \
  X(window_partition)                \
  X(window_merge)                    \
  X(patch_merging)                   \
  X(window_attention)                \
  X(qkv_projection)                  \
  X(bert_attention)                  \
  X(bert_step)                       \
  X(swin_step)

#define FUSEKIT_DECLARE_OPERATOR(name) OpDefinition name##_op();
FUSEKIT_OPERATORS(FUSEKIT_DECLARE_OPERATOR)
#undef FUSEKIT_DECLARE_OPERATOR

const std::vector<OpDefinition>& ops() {
#define FUSEKIT_DEFINE_OPERATOR(name) name##_op(),
  static const std::vector<OpDefinition> all = {FUSEKIT_OPERATORS(FUSEKIT_DEFINE_OPERATOR)};
#undef FUSEKIT_DEFINE_OPERATOR
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
  static const std::vector<std::string> all = {"ops", "attention", "models"};
  return all;
}

namespace {

// Calls `visit(op, shape, dtype, backward)` for every case the request selects, in suite order: per
// operator, per dtype, forward then forward + backward, per shape. Throws std::invalid_argument for
// an unknown operator, suite or dtype, before visiting any case.
template <class Visit>
void for_each_selected_case(const OpsRequest& request, Visit visit) {
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
      visit(op, request.shape, dtype, request.backward);
      return;
    }
    throw std::invalid_argument("unknown operator '" + request.op + "' (available: " + names + ")");
  }
  if (std::find(op_suites().begin(), op_suites().end(), request.suite) == op_suites().end()) {
    throw std::invalid_argument("unknown operator suite '" + request.suite + "'");
  }
  // --ops entries: NAME[:DTYPE][@SHAPE]. NAME alone: the operator in the suite's dtypes (or
  // --dtype's) at all its shapes; :DTYPE: in that dtype only; @SHAPE: at that shape only (one of the
  // suite's, e.g. bert_step@bert-base:b64:s128). An operator named twice runs what each entry asks.
  struct Selection {
    std::string name;
    std::optional<kernels::DType> dtype;
    std::optional<std::string> shape;
  };
  std::vector<Selection> selected;
  for (const std::string& entry : request.only) {
    const size_t at = entry.find('@');
    const std::string head = entry.substr(0, at);
    const size_t colon = head.find(':');
    Selection selection{head.substr(0, colon), std::nullopt, std::nullopt};
    const OpDefinition* definition = nullptr;
    for (const OpDefinition& op : ops()) {
      if (op.name == selection.name && op.suite == request.suite) definition = &op;
    }
    if (definition == nullptr) {
      std::string names;
      for (const OpDefinition& op : ops()) {
        if (op.suite == request.suite) names += (names.empty() ? "" : ", ") + op.name;
      }
      throw std::invalid_argument("unknown operator '" + selection.name + "' in --ops (the " + request.suite +
                                  " suite has: " + names + ")");
    }
    if (colon != std::string::npos) {
      try {
        selection.dtype = parse_dtype(head.substr(colon + 1));
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("--ops " + entry + ": " + e.what());
      }
      if (!request.dtype.empty() && *selection.dtype != parse_dtype(request.dtype)) {
        throw std::invalid_argument("--ops " + entry + " asks for another dtype than --dtype " + request.dtype);
      }
    }
    if (at != std::string::npos) {
      selection.shape = entry.substr(at + 1);
      const std::vector<std::string>& shapes = definition->shapes;
      if (std::find(shapes.begin(), shapes.end(), *selection.shape) == shapes.end()) {
        std::string known;
        for (const std::string& shape : shapes) known += (known.empty() ? "" : ", ") + shape;
        throw std::invalid_argument("--ops " + entry + ": the " + request.suite + " suite has no shape '" +
                                    *selection.shape + "' of " + selection.name + " (it has: " + known +
                                    "; an entry is NAME[:DTYPE][@SHAPE])");
      }
    }
    selected.push_back(std::move(selection));
  }
  std::vector<kernels::DType> dtypes = {kernels::DType::f16, kernels::DType::bf16};
  if (!request.dtype.empty()) dtypes = {parse_dtype(request.dtype)};  // the whole suite in one dtype
  bool any = false;
  for (const OpDefinition& op : ops()) {
    if (op.suite != request.suite) continue;
    // Per dtype (fp16 before bf16 before fp32 whatever the order of the entries), direction and shape.
    for (kernels::DType d : {kernels::DType::f16, kernels::DType::bf16, kernels::DType::f32}) {
      const bool in_suite = std::find(dtypes.begin(), dtypes.end(), d) != dtypes.end();
      for (bool backward : {false, true}) {
        if (backward && !op.has_backward) continue;
        for (const std::string& shape : op.shapes) {
          bool wanted = request.only.empty() && in_suite;
          for (const Selection& s : selected) {
            wanted = wanted ||
                     (s.name == op.name && (s.dtype ? *s.dtype == d : in_suite) && (!s.shape || *s.shape == shape));
          }
          if (!wanted) continue;
          visit(op, shape, d, backward);
          any = true;
        }
      }
    }
  }
  if (!any) throw std::invalid_argument("the " + request.suite + " suite has no operators yet");
}

}  // namespace

std::vector<Case> ops_cases(const OpsRequest& request) {
  std::vector<Case> cases;
  for_each_selected_case(request,
                         [&](const OpDefinition& op, const std::string& shape, kernels::DType dtype, bool backward) {
                           for (Case& c : op.cases(shape, dtype, backward)) cases.push_back(std::move(c));
                         });
  return cases;
}

std::vector<ListedCase> list_ops_cases(const OpsRequest& request) {
  std::vector<ListedCase> listed;
  // Building a case's variants allocates no device memory (that is their setup's work); the
  // variants share one description, which is the listed case's.
  auto list = [&](const OpDefinition& op, const std::string& shape, kernels::DType dtype, bool backward) {
    const std::vector<Case> variants = op.cases(shape, dtype, backward);
    if (variants.empty()) throw std::logic_error("operator '" + op.name + "' built no case for " + shape);
    ListedCase c;
    c.info = variants.front().info;
    c.info.variant.clear();
    c.backward = backward;
    listed.push_back(std::move(c));
  };
  for_each_selected_case(request, list);
  return listed;
}

}  // namespace fusekit::suites
