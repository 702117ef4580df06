// A Transformer linear layer (torch.nn.Linear) as cuBLASLt GEMMs with fused epilogues, forward and
// backward, the way an FFN uses it: up projection with bias + GELU, down projection with bias.
//
//   forward, bias:       y = x W^T + b
//   forward, bias_gelu:  pre = x W^T + b,  y = gelu(pre)     (pre written too: the backward's input)
//   backward, bias:      dx = dy W,  dW = dy^T x,  db = sum_rows(dy)   (db fused into the dW GEMM: BGRADB)
//   weight gradient:     dW = dW + dy^T x (accumulate) or dy^T x,  db = sum_rows(dy)   (linear_weight_gradient)
//   gelu:                gelu(z) = z/2 (1 + tanh(k (z + a z^3))), k = sqrt(2/pi), a = 0.044715: the tanh
//                        form, which is what cuBLASLt's GELU epilogues compute (PyTorch approximate="tanh")
//
// x: [M, K], W: [N, K] (torch.nn.Linear's weight), b: [N], y, pre, dy: [M, N]; row-major, all of one
// storage type (float, half, bfloat16), accumulation in float (CUBLAS_COMPUTE_32F; fp32 is plain
// fp32, never TF32).
//
// The backward through GELU. cuBLASLt applies gelu' only to a GEMM's *output*, with the saved
// pre-activation as its aux input (DGELU_BGRAD), so dpre = dy * gelu'(pre) cannot be fused into this
// layer's own GEMMs (they consume dpre). It fuses into the GEMM that produces dy: in an FFN, the next
// layer's input gradient. So the backward of a bias_gelu layer is, for the next layer
// (shape M x N2 x N, weight W2: [N2, N], output gradient dz: [M, N2]):
//   1. linear_gelu_backward_input:  dpre = gelu'(pre) * (dz W2),  db = sum_rows(dpre)
//      GeluBackwardPath::cublaslt_epilogue: one GEMM with the DGELU_BGRAD epilogue. On the H100
//      (CUDA 13.0) cuBLASLt runs that epilogue as a separate pass over D for every candidate
//      algorithm (182 us after a 58 us GEMM), slower than PyTorch's two kernels; so the default,
//      GeluBackwardPath::kernel, is a plain GEMM into a scratch dy followed by fusekit's bias_gelu backward (tanh form:
//      dpre and db in one pass, db without atomics).
//   2. linear_backward with dy = dpre and no db:  dW = dpre^T x,  dx = dpre W            (two plain GEMMs)
// The next layer's own dW2 and db2 come from its linear_backward as usual.
//
// Row-major onto column-major: a row-major [R, C] matrix is the column-major [C, R] matrix, its
// transpose, with leading dimension C. So cuBLASLt computes y^T = W x^T: m = N, n = M, k = K, A = W
// (column-major K x N, op T), B = x (K x M, op N), D = y^T (N x M, ld N). The bias then runs along D's
// rows, as CUBLASLT_EPILOGUE_BIAS wants it; the gradients map the same way (linear.cu).
//
// Padding (`padded`): the feature sizes N and K are rounded up to multiples of 8 (49 -> 56, as NVIDIA
// padded Swin's window GEMMs), so every row starts 16-byte aligned and the GEMMs run on tensor-core
// friendly sizes. Every [., N] and [., K] operand then has N_pad or K_pad columns (and b, db N_pad
// elements); the GEMMs run over the padded extents. The caller keeps the pad columns of the inputs
// (x, W, b, dy, dz, W2) zero; then the outputs' pad columns come out zero too (gelu(0) = 0 and a
// zero row of a GEMM operand contributes nothing), the math is unchanged, and padded tensors can flow
// from layer to layer. cuBLASLt's aux matrix (pre) needs a leading dimension divisible by 8, so the
// GELU epilogues require N % 8 == 0 or `padded`.
//
// Skinny unpadded shapes (kernels/skinny_linear.cu): unpadded, N and K <= 64, and N or K not a
// multiple of 8 (Swin's unpadded window GEMMs, 401408x49x32 and 401408x32x49). Their rows are only
// 2-byte aligned, so cuBLASLt runs its align-1 kernels, several times slower than a copy of the
// bytes would allow (forward + backward of 401408x49x32, fp16, CUDA 13.0: 626.5 us). These GEMMs
// are memory bound, so linear_forward (bias epilogue) and linear_backward take fusekit's own kernels there: whole row
// tiles copied as contiguous 16-byte vectors, mma.sync on fragments gathered in shared memory (fp32:
// FMA), and a backward that reads dy and x once for dx, dW and db (deterministic: per-block partials,
// then a reduction; workspace in scratch slot 2). Padded shapes whose padded extents are at most 64
// take them too (over the padded extents). bias_gelu keeps cuBLASLt (it needs N % 8 == 0 or padding
// anyway).
//
// Accumulating weight gradients (linear_weight_gradient): a weight used twice gets the sum of its two
// gradients, e.g. the MLM decoder tied to the word embeddings adds dy^T x into the gradient the
// embedding backward wrote. The GEMM runs with beta = 1 and C = D (in place): D = D + dy^T x in
// float, rounded once to the storage type. The bias gradient is always overwritten (cuBLASLt's
// BGRADB epilogue writes it; it has no accumulating form), which is what a tied weight with an
// untied bias needs. Always cuBLASLt: the shapes that linear_backward gives to the skinny kernels
// below (Swin's) run cuBLASLt's align-1 kernels here, correct and slower; no layer that accumulates
// has such a shape, so there is no skinny accumulating path.
//
// LinearContext owns the cuBLASLt handle, a 32 MiB workspace and a plan per (sizes, transposes,
// dtype, epilogue, pointer alignment, accumulation): descriptors and the algorithm, made on first use.
// The algorithm is the fastest of the heuristic's candidates, timed once on the call's own operands;
// an accumulating plan's candidates are timed into a temporary D (running them on the call's D would
// add into it several times), and where that cannot be allocated, or the stream is being captured,
// the heuristic's first choice stands (linear.cu, LinearContext::fastest). Timing makes the choice,
// so two contexts may pick different algorithms for one GEMM and round differently; where two runs
// must compute bit for bit alike (comparing a model's CUDA graph with its enqueued steps, say), set
// FUSEKIT_GEMM_ALGORITHM=heuristic before the contexts are made: each plan then takes the
// heuristic's first choice, untimed ("timed", the default, times them). Repeated calls set only the
// pointers; nothing is allocated per call. One context per device; it is not thread-safe.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <tuple>

#include "kernels/dtype.h"

namespace fusekit::kernels {

enum class LinearEpilogue { bias, bias_gelu };

const char* linear_epilogue_name(LinearEpilogue epilogue);  // "bias" | "bias_gelu"

inline int linear_padded_size(int features) { return (features + 7) / 8 * 8; }

struct LinearShape {
  int rows = 0;          // M: tokens
  int out_features = 0;  // N
  int in_features = 0;   // K
  bool padded = false;   // feature sizes rounded up to multiples of 8 (see above)

  // Row strides, in elements, of the [., N] and [., K] operands: the extents the GEMMs run over.
  int out_stride() const { return padded ? linear_padded_size(out_features) : out_features; }
  int in_stride() const { return padded ? linear_padded_size(in_features) : in_features; }
};

class LinearContext {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  LinearContext();  // on the current device; reads FUSEKIT_GEMM_ALGORITHM (above), throws
                    // std::invalid_argument for a value other than "timed" or "heuristic"
  ~LinearContext();
  bool times_candidates() const { return time_candidates_; }
  LinearContext(const LinearContext&) = delete;
  LinearContext& operator=(const LinearContext&) = delete;

  // Internal: one GEMM D = op(A) op(B) (+ D where accumulating) with an epilogue, column-major,
  // through a cached plan.
  struct Gemm {
    DType dtype;
    bool transpose_a, transpose_b;
    int m, n, k;
    cublasLtEpilogue_t epilogue;
    const void *a, *b;
    void* d;
    void* bias;       // bias (input) or bias gradient (output), or null
    void* aux;        // GELU pre-activation (output of GELU_AUX_BIAS, input of DGELU_BGRAD), or null
    bool accumulate;  // beta = 1 with C = D: D = op(A) op(B) + D; else beta = 0 (D is not read)
  };
  void run(const Gemm& gemm, cudaStream_t stream);

  size_t plans() const { return plans_.size(); }  // plans made so far (tests check the cache)

  // Device scratch of at least `bytes`, owned by the context and kept between calls (it grows; the
  // first calls at a size allocate, later ones do not). slot: 0, 1 or 2, independent buffers.
  // Slot 1 stays zero (linear_gelu_backward_input); slot 2 is the GELU backward's workspace there and
  // the skinny backward's partials: calls that share a context must run on one stream, in order.
  // A buffer that must grow while `stream` is captured into a CUDA graph throws std::logic_error,
  // as does the first GEMM of a plan (run the calls once before capturing them).
  void* scratch(int slot, size_t bytes, cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<int, bool, bool, int, int, int, int, unsigned, bool>;  // ..., alignment, accumulate
  static constexpr int kCandidates = 8;  // heuristic results timed when a plan is made

  cublasLtMatmulAlgo_t fastest(const Plan& plan, const Gemm& g, const cublasLtMatmulHeuristicResult_t* results,
                               int count, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  bool time_candidates_ = true;
  void* workspace_ = nullptr;
  void* scratch_[3] = {nullptr, nullptr, nullptr};
  size_t scratch_bytes_[3] = {0, 0, 0};
  std::map<Key, Plan> plans_;
};

// y: [M, N]; pre: [M, N] for bias_gelu (written), ignored (may be null) for bias.
void linear_forward(LinearContext& context, DType dtype, LinearEpilogue epilogue, const LinearShape& shape,
                    const void* x, const void* weight, const void* bias, void* y, void* pre, cudaStream_t stream);

// dx: [M, K] (null: not computed, e.g. for a first layer), dweight: [N, K], dbias: [N] (null: not
// computed, e.g. after linear_gelu_backward_input made it).
void linear_backward(LinearContext& context, DType dtype, const LinearShape& shape, const void* dy, const void* x,
                     const void* weight, void* dx, void* dweight, void* dbias, cudaStream_t stream);

// The weight gradient alone (see "Accumulating weight gradients" above): dweight [N, K] = dy^T x, or
// with accumulate dweight += dy^T x; dbias [N] = sum_rows(dy), always overwritten (null: not
// computed). dy: [M, N], x: [M, K]. Padded shapes: the operands' pad columns zero, as everywhere
// here; accumulating adds zero to dweight's pad entries. Throws std::invalid_argument for sizes <= 0
// or a null dy, x or dweight.
void linear_weight_gradient(LinearContext& context, DType dtype, const LinearShape& shape, const void* dy,
                            const void* x, void* dweight, void* dbias, bool accumulate, cudaStream_t stream);

// Without the bias: y = x W^T ([M, N]), one cuBLASLt GEMM with no epilogue, for a layer whose bias
// the next kernel adds (the post-LN sublayers: kernels/bias_dropout_residual_layernorm.h adds it with
// the dropout and the residual). Every shape through cuBLASLt (the skinny path is not taken).
void linear_forward_no_bias(LinearContext& context, DType dtype, const LinearShape& shape, const void* x,
                            const void* weight, void* y, cudaStream_t stream);

// The input gradient alone: dx [M, K] = dy W, or with accumulate dx += dy W (beta = 1, C = D: the
// sum in float, rounded once), where a tensor feeds two branches (a Transformer layer's input: the
// residual stream and the projection) and the second branch's gradient adds into the first's.
// dy: [M, N], weight: [N, K]. Every shape through cuBLASLt.
void linear_input_gradient(LinearContext& context, DType dtype, const LinearShape& shape, const void* dy,
                           const void* weight, void* dx, bool accumulate, cudaStream_t stream);

// The gradient through the GELU of the layer before `next`, fused into next's input-gradient GEMM:
// dpre = gelu'(pre) * (dz W_next), dbias = sum_rows(dpre). next = M x N2 x N; dz: [M, N2];
// weight_next: [N2, N]; pre (the earlier layer's saved pre-activation), dpre: [M, N]; dbias: [N].
// The QKV projection of an attention layer as one linear layer: the query, key and value weights
// ([hidden, in_features] each, as torch.nn.Linear holds them, their rows ordered [heads, head_dim])
// and biases ([hidden]) arranged once, at load, into one weight [3 * hidden, in_features] and one
// bias [3 * hidden]. linear_forward with them writes [tokens, 3, heads, head_dim]: the packed layout
// the attention kernels read, with no transpose. Unpadded sizes.
void pack_qkv_projection(DType dtype, int hidden, int in_features, const void* const weights[3],
                         const void* const biases[3], void* weight, void* bias, cudaStream_t stream);

enum class GeluBackwardPath { kernel, cublaslt_epilogue };  // see the top of this file

void linear_gelu_backward_input(LinearContext& context, DType dtype, const LinearShape& next, const void* dz,
                                const void* weight_next, const void* pre, void* dpre, void* dbias, cudaStream_t stream,
                                GeluBackwardPath path = GeluBackwardPath::kernel);

}  // namespace fusekit::kernels
