// The linear layer on cuBLASLt (see linear.h for the math, the row-major to column-major mapping and
// the GELU backward path): LinearContext's plans, scratch buffers and the GEMM calls, and the choice
// of the skinny kernels (detail/skinny_linear.h) where cuBLASLt would run its align-1 kernels.
//
// Design: a plan per (sizes, transposes, dtype, epilogue, pointer alignment, accumulation), made on
// first use; the candidates of cuBLASLt's heuristic are timed once then, on the call's own operands
// (an accumulating GEMM: into a temporary D), because its first choice can run a fused epilogue as
// a separate pass (LinearContext::fastest).
#include "kernels/linear.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "kernels/bias_gelu.h"
#include "kernels/cuda_check.h"
#include "kernels/detail/cublas_check.h"
#include "kernels/detail/skinny_linear.h"

namespace fusekit::kernels {
namespace {

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
  }
  throw std::invalid_argument("linear: unknown dtype");
}

// The largest power of two up to 16 that divides the address (null pointers do not constrain).
unsigned alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  if (address == 0) return 16;
  return static_cast<unsigned>(std::min<uintptr_t>(address & (~address + 1), 16));
}

// dW^T [K, N] (+)= x^T [K, M] dy [M, N]: A = x, stored K x M; B = dy, stored N x M (op T). BGRADB sums
// op(B) over the GEMM's k (= M): db = sum_rows(dy), N elements, one per column of D.
void weight_gradient_gemm(LinearContext& context, DType dtype, const LinearShape& shape, const void* dy, const void* x,
                          void* dweight, void* dbias, bool accumulate, cudaStream_t stream) {
  context.run(
      {dtype, false, true, shape.in_stride(), shape.out_stride(), shape.rows,
       dbias ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT, x, dy, dweight, dbias, nullptr, accumulate},
      stream);
}

template <class T>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  FUSEKIT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

template <class T>
void set_preference(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
                    const T& value) {
  FUSEKIT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)));
}

bool epilogue_has_aux(cublasLtEpilogue_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

std::string describe(const LinearContext::Gemm& g) {
  return std::string(dtype_name(g.dtype)) + " m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) +
         " k=" + std::to_string(g.k) + " op(A)=" + (g.transpose_a ? "T" : "N") +
         " op(B)=" + (g.transpose_b ? "T" : "N") + " epilogue=" + std::to_string(static_cast<int>(g.epilogue));
}

void check_shape(const LinearShape& s) {
  if (s.rows <= 0 || s.out_features <= 0 || s.in_features <= 0) {
    throw std::invalid_argument("linear: rows, out_features and in_features must be > 0 (got " +
                                std::to_string(s.rows) + "x" + std::to_string(s.out_features) + "x" +
                                std::to_string(s.in_features) + ")");
  }
}

void check_operands(std::initializer_list<const void*> required) {
  for (const void* p : required) {
    if (p == nullptr) throw std::invalid_argument("linear: a required operand is null");
  }
}

// cuBLASLt's GELU aux matrix wants a leading dimension divisible by 8 (cublasLt.h, EPILOGUE_AUX_LD).
void check_gelu_stride(int features, int stride) {
  if (stride % 8 != 0) {
    throw std::invalid_argument(
        "linear: bias_gelu needs a feature size divisible by 8 (cuBLASLt's GELU aux matrix) "
        "or a padded shape (got " +
        std::to_string(features) + ")");
  }
}

}  // namespace

const char* linear_epilogue_name(LinearEpilogue epilogue) {
  return epilogue == LinearEpilogue::bias_gelu ? "bias_gelu" : "bias";
}

// ---- the cuBLASLt context: handle, workspace, plans

LinearContext::LinearContext() {
  if (const char* choice = std::getenv("FUSEKIT_GEMM_ALGORITHM"); choice != nullptr && *choice != '\0') {
    const std::string value = choice;
    if (value != "timed" && value != "heuristic") {
      throw std::invalid_argument("FUSEKIT_GEMM_ALGORITHM must be 'timed' or 'heuristic', not '" + value + "'");
    }
    time_candidates_ = value == "timed";
  }
  FUSEKIT_CUBLAS_CHECK(cublasLtCreate(&handle_));
  const cudaError_t status = cudaMalloc(&workspace_, kWorkspaceBytes);
  if (status != cudaSuccess) {
    cublasLtDestroy(handle_);
    FUSEKIT_CUDA_CHECK(status);
  }
}

LinearContext::~LinearContext() {
  for (auto& [key, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.d);
    cublasLtMatmulDescDestroy(plan.desc);
  }
  for (void* buffer : scratch_) cudaFree(buffer);
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

namespace {

// A plan's first use times its candidates and a scratch buffer grows by allocation: neither can be
// recorded into a CUDA graph, so a call that needs them while its stream is being captured fails
// here, with what to do, instead of deep in cudaMalloc.
void refuse_while_capturing(cudaStream_t stream, const char* what) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FUSEKIT_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  if (status != cudaStreamCaptureStatusNone) {
    throw std::logic_error(std::string("linear: ") + what +
                           " while the stream is captured into a CUDA graph; run the same calls once before "
                           "capturing them");
  }
}

}  // namespace

void* LinearContext::scratch(int slot, size_t bytes, cudaStream_t stream) {
  if (bytes > scratch_bytes_[slot]) {
    refuse_while_capturing(stream, "a scratch buffer grows");
    FUSEKIT_CUDA_CHECK(cudaFree(scratch_[slot]));  // synchronizes: no call in flight still reads it
    scratch_[slot] = nullptr;
    scratch_bytes_[slot] = 0;
    FUSEKIT_CUDA_CHECK(cudaMalloc(&scratch_[slot], bytes));
    FUSEKIT_CUDA_CHECK(cudaMemset(scratch_[slot], 0, bytes));
    // The memset runs on the legacy default stream, which a non-blocking stream does not wait for.
    FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
    scratch_bytes_[slot] = bytes;
  }
  return scratch_[slot];
}

// The heuristic's first choice is not always the fastest: for some epilogues (BGRADB, DGELU_BGRAD)
// it can pick an algorithm that runs the epilogue as a separate pass over D, several times slower
// than one that fuses it (measured on the H100: 186 us against a GEMM of 55 us). So the candidates
// are timed once, when the plan is made, on the call's own operands, and the fastest is kept. A
// GEMM with beta = 0 writes D and its epilogue outputs from A and B alone, so running it several
// times changes nothing. An accumulating one (beta = 1, C = D) would add into D once per run: its
// candidates run into a temporary D of the same size (zeroed, freed afterwards) with beta = 1, the
// same work; its bias gradient, an output only, is written again by the call itself. Where that
// temporary cannot be allocated, or the stream is being captured into a graph (which cannot
// synchronize), the heuristic's first choice stands.
cublasLtMatmulAlgo_t LinearContext::fastest(const Plan& plan, const Gemm& g,
                                            const cublasLtMatmulHeuristicResult_t* results, int count,
                                            cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FUSEKIT_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (!time_candidates_ || count == 1 || capture != cudaStreamCaptureStatusNone) return results[0].algo;
  void* d = g.d;
  std::unique_ptr<void, cudaError_t (*)(void*)> temporary(nullptr, cudaFree);
  if (g.accumulate) {
    const size_t bytes = static_cast<size_t>(g.m) * g.n * dtype_size(g.dtype);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the failed allocation: not an error of this call
      return results[0].algo;
    }
    temporary.reset(p);
    FUSEKIT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
    d = p;
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  FUSEKIT_CUDA_CHECK(cudaEventCreate(&start));
  FUSEKIT_CUDA_CHECK(cudaEventCreate(&stop));
  const float alpha = 1.f, beta = g.accumulate ? 1.f : 0.f;
  auto launch = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle_, plan.desc, &alpha, g.a, plan.a, g.b, plan.b, &beta, d, plan.d, d, plan.d, &algo,
                          workspace_, kWorkspaceBytes, stream);
  };
  int best = 0;
  float best_ms = std::numeric_limits<float>::infinity();
  for (int i = 0; i < count; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || launch(results[i].algo) != CUBLAS_STATUS_SUCCESS) continue;
    constexpr int kTimed = 3;
    FUSEKIT_CUDA_CHECK(cudaEventRecord(start, stream));
    bool ok = true;
    for (int r = 0; r < kTimed && ok; ++r) ok = launch(results[i].algo) == CUBLAS_STATUS_SUCCESS;
    FUSEKIT_CUDA_CHECK(cudaEventRecord(stop, stream));
    FUSEKIT_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    FUSEKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (ok && ms < best_ms) {
      best_ms = ms;
      best = i;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return results[best].algo;  // the temporary is freed here, after the timed runs finished (cudaFree waits)
}

void LinearContext::run(const Gemm& g, cudaStream_t stream) {
  // The heuristic's choice holds for pointers at least as aligned as those it was made with.
  const unsigned alignment =
      std::min({alignment_of(g.a), alignment_of(g.b), alignment_of(g.d), alignment_of(g.bias), alignment_of(g.aux)});
  const Key key{static_cast<int>(g.dtype),    g.transpose_a, g.transpose_b, g.m, g.n, g.k,
                static_cast<int>(g.epilogue), alignment,     g.accumulate};
  auto found = plans_.find(key);
  if (found == plans_.end()) {
    refuse_while_capturing(stream, "a new GEMM plan is made (its candidates are timed)");
    Plan plan;
    cublasLtMatmulPreference_t preference = nullptr;
    try {
      const cudaDataType_t type = cuda_type(g.dtype);
      FUSEKIT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N);
      set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N);
      set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(g.epilogue));
      // The heuristic reads these pointers' values for their alignment.
      if (g.bias) set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
      if (epilogue_has_aux(g.epilogue)) {
        set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
        set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(g.m));
      }
      // Column-major, densely packed: a stored matrix's leading dimension is its row count.
      const uint64_t a_rows = g.transpose_a ? g.k : g.m, a_columns = g.transpose_a ? g.m : g.k;
      const uint64_t b_rows = g.transpose_b ? g.n : g.k, b_columns = g.transpose_b ? g.k : g.n;
      FUSEKIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, type, a_rows, a_columns, a_rows));
      FUSEKIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, type, b_rows, b_columns, b_rows));
      FUSEKIT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, type, g.m, g.n, g.m));

      FUSEKIT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
      set_preference(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
      for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                             CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
        set_preference(preference, attribute, static_cast<uint32_t>(alignment));
      }
      cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
      int count = 0;
      FUSEKIT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.a, plan.b, plan.d, plan.d,
                                                          preference, kCandidates, results, &count));
      if (count == 0) {
        throw std::runtime_error("linear: cuBLASLt found no algorithm for " + describe(g) + " (" +
                                 cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED) + ")");
      }
      plan.algo = fastest(plan, g, results, count, stream);
      cublasLtMatmulPreferenceDestroy(preference);
    } catch (...) {
      if (preference) cublasLtMatmulPreferenceDestroy(preference);
      if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
      if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
      if (plan.d) cublasLtMatrixLayoutDestroy(plan.d);
      if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
      throw;
    }
    found = plans_.emplace(key, plan).first;
  }
  const Plan& plan = found->second;
  if (g.bias) set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (epilogue_has_aux(g.epilogue)) set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
  // C = D with D's layout: in place where accumulating, not read where beta = 0.
  const float alpha = 1.f, beta = g.accumulate ? 1.f : 0.f;
  const cublasStatus_t status = cublasLtMatmul(handle_, plan.desc, &alpha, g.a, plan.a, g.b, plan.b, &beta, g.d, plan.d,
                                               g.d, plan.d, &plan.algo, workspace_, kWorkspaceBytes, stream);
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error("linear: cublasLtMatmul failed for " + describe(g) + ": " +
                             cublasLtGetStatusString(status));
  }
}

// ---- launchers: the row-major operands mapped onto column-major GEMMs (see linear.h)

void linear_forward(LinearContext& context, DType dtype, LinearEpilogue epilogue, const LinearShape& shape,
                    const void* x, const void* weight, const void* bias, void* y, void* pre, cudaStream_t stream) {
  check_shape(shape);
  check_operands({x, weight, bias, y});
  const bool gelu = epilogue == LinearEpilogue::bias_gelu;
  if (gelu) {
    check_gelu_stride(shape.out_features, shape.out_stride());
    check_operands({pre});
  }
  if (!gelu && linear_uses_skinny_path(shape)) {
    skinny_linear_forward(dtype, skinny_extents(shape), x, weight, bias, y, stream);
    return;
  }
  // y^T [N, M] = W [N, K] x^T [K, M]: A = W, stored K x N (op T); B = x, stored K x M.
  context.run({dtype, true, false, shape.out_stride(), shape.rows, shape.in_stride(),
               gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS, weight, x, y, const_cast<void*>(bias),
               gelu ? pre : nullptr, false},
              stream);
}

void linear_backward(LinearContext& context, DType dtype, const LinearShape& shape, const void* dy, const void* x,
                     const void* weight, void* dx, void* dweight, void* dbias, cudaStream_t stream) {
  check_shape(shape);
  check_operands({dy, x, weight, dweight});
  if (linear_uses_skinny_path(shape)) {
    skinny_linear_backward(context, dtype, skinny_extents(shape), dy, x, weight, dx, dweight, dbias, stream);
    return;
  }
  weight_gradient_gemm(context, dtype, shape, dy, x, dweight, dbias, false, stream);
  if (dx) {
    // dx^T [K, M] = W^T [K, N] dy^T [N, M]: A = W, stored K x N; B = dy, stored N x M.
    context.run({dtype, false, false, shape.in_stride(), shape.rows, shape.out_stride(), CUBLASLT_EPILOGUE_DEFAULT,
                 weight, dy, dx, nullptr, nullptr, false},
                stream);
  }
}

void linear_weight_gradient(LinearContext& context, DType dtype, const LinearShape& shape, const void* dy,
                            const void* x, void* dweight, void* dbias, bool accumulate, cudaStream_t stream) {
  check_shape(shape);
  check_operands({dy, x, dweight});
  weight_gradient_gemm(context, dtype, shape, dy, x, dweight, dbias, accumulate, stream);  // any shape: see linear.h
}

void linear_forward_no_bias(LinearContext& context, DType dtype, const LinearShape& shape, const void* x,
                            const void* weight, void* y, cudaStream_t stream) {
  check_shape(shape);
  check_operands({x, weight, y});
  // As linear_forward: y^T [N, M] = W [N, K] x^T [K, M].
  context.run({dtype, true, false, shape.out_stride(), shape.rows, shape.in_stride(), CUBLASLT_EPILOGUE_DEFAULT, weight,
               x, y, nullptr, nullptr, false},
              stream);
}

void linear_input_gradient(LinearContext& context, DType dtype, const LinearShape& shape, const void* dy,
                           const void* weight, void* dx, bool accumulate, cudaStream_t stream) {
  check_shape(shape);
  check_operands({dy, weight, dx});
  // As linear_backward's dx: dx^T [K, M] = W^T [K, N] dy^T [N, M].
  context.run({dtype, false, false, shape.in_stride(), shape.rows, shape.out_stride(), CUBLASLT_EPILOGUE_DEFAULT,
               weight, dy, dx, nullptr, nullptr, accumulate},
              stream);
}

void pack_qkv_projection(DType dtype, int hidden, int in_features, const void* const weights[3],
                         const void* const biases[3], void* weight, void* bias, cudaStream_t stream) {
  if (hidden <= 0 || in_features <= 0) {
    throw std::invalid_argument("pack_qkv_projection: sizes must be > 0 (got hidden " + std::to_string(hidden) +
                                ", in_features " + std::to_string(in_features) + ")");
  }
  check_operands({weights[0], weights[1], weights[2], biases[0], biases[1], biases[2], weight, bias});
  const size_t s = dtype_size(dtype), weight_bytes = static_cast<size_t>(hidden) * in_features * s;
  for (int part = 0; part < 3; ++part) {
    FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(weight) + part * weight_bytes, weights[part], weight_bytes,
                                       cudaMemcpyDeviceToDevice, stream));
    FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(bias) + part * hidden * s, biases[part], hidden * s,
                                       cudaMemcpyDeviceToDevice, stream));
  }
}

void linear_gelu_backward_input(LinearContext& context, DType dtype, const LinearShape& next, const void* dz,
                                const void* weight_next, const void* pre, void* dpre, void* dbias, cudaStream_t stream,
                                GeluBackwardPath path) {
  check_shape(next);
  check_operands({dz, weight_next, pre, dpre, dbias});
  check_gelu_stride(next.in_features, next.in_stride());
  if (path == GeluBackwardPath::kernel) {
    // dy^T [N, M] = W2^T [N, N2] dz^T [N2, M] into scratch, then dpre = dy * gelu'(pre) and
    // dbias = sum_rows(dpre) in one pass (bias_gelu's backward with x = pre and a zero bias; the pad
    // columns of dy and pre are zero, so those of dpre and dbias are too).
    const int rows = next.rows, columns = next.in_stride();
    const size_t bytes = static_cast<size_t>(rows) * columns * dtype_size(dtype);
    void* dy = context.scratch(0, bytes, stream);
    const void* zeros = context.scratch(1, columns * dtype_size(dtype), stream);  // never written: stays zero
    void* workspace = context.scratch(2, bias_gelu_backward_workspace_bytes(rows, columns), stream);
    context.run({dtype, false, false, columns, rows, next.out_stride(), CUBLASLT_EPILOGUE_DEFAULT, weight_next, dz, dy,
                 nullptr, nullptr, false},
                stream);
    bias_gelu_backward(dtype, GeluApproximation::tanh, dy, pre, zeros, dpre, dbias, rows, columns, workspace, stream);
    return;
  }
  // next's input gradient, dpre^T [N, M] = W2^T [N, N2] dz^T [N2, M], with gelu'(pre) applied to D and
  // D's row sums (over M) written to dbias: DGELU_BGRAD, pre as the aux input (ld N, like D).
  context.run({dtype, false, false, next.in_stride(), next.rows, next.out_stride(), CUBLASLT_EPILOGUE_DGELU_BGRAD,
               weight_next, dz, dpre, dbias, const_cast<void*>(pre), false},
              stream);
}

}  // namespace fusekit::kernels
