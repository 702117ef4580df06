// AdamW over tensor lists and the mixed-precision trainer (see adamw.h for the math and layouts).
//
// Design. Both updates read and write every byte once, so they are copies with arithmetic: 16-byte
// vectors, grids of as many blocks as fit on the multiprocessors, streaming loads for what is read
// once.
//
// The tensor-list step walks a chunk table (tensor, offset, length <= 8192 elements) that the
// host builds once per list: block b takes chunks b, b + grid, ..., so a list of a few large and
// many tiny tensors (BERT's 204: one of 23M elements, a hundred of 768) spreads evenly over the
// grid in one launch. A tensor whose four pointers are 16-byte aligned runs on float4 vectors with
// a scalar tail; any other runs scalar.
//
// The trainer's step is two launches. The gradient check reads the gradients once (2 bytes per
// parameter, against the update's 28 with master weights or 22 without); each block writes its own
// "found inf/NaN" flag, and the last block to finish (one arrival counter, re-armed by that block)
// ORs the flags into one verdict word and block 0 computes the step's scalars once. The update runs
// as a programmatic dependent of the check, reads the verdict and returns at once if it is set.
// Fusing the check into the update would need the verdict before the first write, i.e. a grid-wide
// barrier after a full pass over the gradients, which is the same read. The update gives each
// thread 4 parameters, so that every float buffer moves in 16-byte vectors that are contiguous
// across a warp (with 8 a thread, each float instruction covered every other 16 bytes of a
// 1 KiB span), and each block one tile of 4 x 256 parameters, back to front, so its first gradient
// reads hit the tail the check has just left in L2.
// The step count lives on the device in two slots: the check copies "after the last step" into "at
// the start of this one", the update reads the latter and its block 0 writes the former, so no
// block reads what another writes in the same launch.
#include "kernels/adamw.h"
#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace fusekit::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kChunkElements = 8192;  // a multiple of 4: every chunk of an aligned tensor starts aligned

struct TensorDescriptor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int vectorized;  // all four pointers 16-byte aligned
};

struct ChunkDescriptor {
  int64_t offset;  // elements into the tensor
  int tensor;
  int length;
};

// The step's scalars, rounded to float once.
struct Coefficients {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, bias_correction2_sqrt;
  float velocity_correction;  // frozen: 1 / (1 - velocity^s)
  float inverse_max_step;     // frozen: 1 / the largest step in units of lr (0: uncapped)
  int frozen;                 // the frozen-variance step (AdamWTrainer::step_frozen_variance): 1; 2: no v yet, skip
};

// In double, as PyTorch computes the bias corrections from its double hyperparameters.
// m's bias correction counts `step` (all steps: frozen ones write m too), v's `v_step` (the AdamW
// steps, the updates v had); they differ only once a trainer has taken frozen-variance steps.
__host__ __device__ inline Coefficients make_coefficients(const AdamWOptions& o, int64_t step, int64_t v_step) {
  Coefficients c;
  c.beta1 = static_cast<float>(o.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  c.beta2 = static_cast<float>(o.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  c.eps = static_cast<float>(o.eps);
  c.decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
  c.step_size = static_cast<float>(o.lr / (1.0 - pow(o.beta1, static_cast<double>(step))));
  c.bias_correction2_sqrt = static_cast<float>(sqrt(1.0 - pow(o.beta2, static_cast<double>(v_step))));
  c.velocity_correction = 1.f;
  c.inverse_max_step = 0.f;
  c.frozen = 0;
  return c;
}

__host__ __device__ inline Coefficients make_coefficients(const AdamWOptions& o, int64_t step) {
  return make_coefficients(o, step, step);
}

// The frozen-variance step's scalars: `frozen_steps` steps since the freeze (this one included),
// `adamw_steps` AdamW steps (updates of v) before it; m = (1 - velocity) g, so one_minus_beta1
// carries 1 - velocity, and step_size is lr. With no AdamW step yet, v is zero: frozen = 2 skips.
// max_step: the largest step in units of lr (infinite: uncapped).
__host__ __device__ inline Coefficients make_frozen_coefficients(const AdamWOptions& o, double velocity,
                                                                 double max_step, int64_t frozen_steps,
                                                                 int64_t adamw_steps) {
  Coefficients c = make_coefficients(o, adamw_steps > 0 ? adamw_steps : 1);
  c.one_minus_beta1 = static_cast<float>(1.0 - velocity);
  c.step_size = static_cast<float>(o.lr);
  c.velocity_correction = static_cast<float>(1.0 / (1.0 - pow(velocity, static_cast<double>(frozen_steps))));
  c.inverse_max_step = static_cast<float>(1.0 / max_step);
  c.frozen = adamw_steps > 0 ? 1 : 2;
  return c;
}

// The trainer's device state, then one flag per block of the gradient check.
struct TrainerState {
  int64_t steps[2];           // [0] the steps taken at the start of the step in flight, [1] after the last step
  int64_t adamw_steps[2];     // the same, AdamW steps only (updates of v): the bias corrections count these
  int64_t frozen_at;          // 1 + the steps taken before this freeze's first step; 0: not frozen
  Coefficients coefficients;  // of the step in flight, written by the check's block 0
  int verdict;                // any inf/NaN among the gradients of the step in flight
  unsigned arrivals;          // check blocks finished; 0 between steps
};

// One element, in torch.optim.AdamW's order: decay first, eps after the square root. decay is
// c.decay, or 1 for a parameter without weight decay.
__device__ __forceinline__ void adamw_update(float g, float& p, float& m, float& v, const Coefficients& c,
                                             float decay) {
  p *= decay;
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  p -= c.step_size * m / (sqrtf(v) / c.bias_correction2_sqrt + c.eps);
}

// One element of the frozen-variance step: g is the velocity increment, v is read, not written. The
// denominator is at least |m^| / max_step (m^ the bias-corrected m), so that no step exceeds max_step
// x lr: where v was zero or small at the freeze, lr m^ / sqrt(v) would be huge.
__device__ __forceinline__ void frozen_variance_update(float g, float& p, float& m, float v, const Coefficients& c,
                                                       float decay) {
  p *= decay;
  m = c.one_minus_beta1 * g;
  const float m_hat = m * c.velocity_correction;
  p -= c.step_size * m_hat / (fmaxf(sqrtf(v) / c.bias_correction2_sqrt, fabsf(m_hat) * c.inverse_max_step) + c.eps);
}

// Bits of a 16-bit float's exponent: all set means inf or NaN.
template <class T>
constexpr uint32_t kExponentBits = std::is_same_v<T, __half> ? 0x7C00u : 0x7F80u;

// ---- CUDA kernels

__global__ void __launch_bounds__(kThreads)
    adamw_multi_tensor_kernel(const TensorDescriptor* __restrict__ tensors, const ChunkDescriptor* __restrict__ chunks,
                              int chunk_count, Coefficients c) {
  using V = Vec<float, 4>;
  for (int k = blockIdx.x; k < chunk_count; k += gridDim.x) {
    const ChunkDescriptor chunk = chunks[k];
    const TensorDescriptor t = tensors[chunk.tensor];
    float* __restrict__ p = t.param + chunk.offset;
    const float* __restrict__ g = t.grad + chunk.offset;
    float* __restrict__ m = t.exp_avg + chunk.offset;
    float* __restrict__ v = t.exp_avg_sq + chunk.offset;
    int scalar_from = 0;
    if (t.vectorized) {
      const int vectors = chunk.length / 4;
      for (int i = threadIdx.x; i < vectors; i += blockDim.x) {
        V pv = V::load_stream(p + 4 * i), mv = V::load_stream(m + 4 * i), vv = V::load_stream(v + 4 * i);
        const V gv = V::load_stream(g + 4 * i);
#pragma unroll
        for (int j = 0; j < 4; ++j) adamw_update(gv.v[j], pv.v[j], mv.v[j], vv.v[j], c, c.decay);
        pv.store(p + 4 * i);
        mv.store(m + 4 * i);
        vv.store(v + 4 * i);
      }
      scalar_from = vectors * 4;
    }
    for (int i = scalar_from + threadIdx.x; i < chunk.length; i += blockDim.x) {
      float pi = p[i], mi = m[i], vi = v[i];
      adamw_update(g[i], pi, mi, vi, c, c.decay);
      p[i] = pi;
      m[i] = mi;
      v[i] = vi;
    }
  }
}

// flags[block] = whether the block saw an inf or NaN among `vectors` 16-byte vectors of gradients;
// the last block to finish ORs them into state->verdict. Block 0 also starts the step count of this
// step and computes its scalars: AdamW's where velocity < 0, else the frozen-variance step's (the
// first such step records how many steps came before it).
template <class T>
__global__ void __launch_bounds__(kThreads)
    adamw_gradient_check_kernel(const T* __restrict__ grads, size_t vectors, int* __restrict__ flags,
                                TrainerState* __restrict__ state, AdamWOptions options, double velocity,
                                double max_step) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const int64_t taken = state->steps[1], adamw = state->adamw_steps[1];
    state->steps[0] = taken;
    state->adamw_steps[0] = adamw;
    if (velocity < 0) {
      state->coefficients = make_coefficients(options, taken + 1, adamw + 1);  // frozen_at: by the update
    } else {
      if (state->frozen_at == 0) state->frozen_at = taken + 1;
      const int64_t before = state->frozen_at - 1;
      state->coefficients = make_frozen_coefficients(options, velocity, max_step, taken + 1 - before, adamw);
    }
  }
  constexpr uint32_t low = kExponentBits<T>, high = kExponentBits<T> << 16;
  bool found = false;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
#pragma unroll 4
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < vectors; i += stride) {
    // A plain load (not streaming): the update reads the last of these again, from L2.
    const uint4 w = reinterpret_cast<const uint4*>(grads)[i];
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (uint32_t x : words) found |= (x & low) == low || (x & high) == high;
  }
  const int any = __syncthreads_or(found);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    flags[blockIdx.x] = any;
    __threadfence();  // the flag is visible before the arrival is counted
    last = atomicAdd(&state->arrivals, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  int seen = 0;
  for (int i = threadIdx.x; i < static_cast<int>(gridDim.x); i += blockDim.x) seen |= __ldcg(flags + i);
  const int verdict = __syncthreads_or(seen);
  if (threadIdx.x == 0) {
    state->verdict = verdict;
    state->arrivals = 0;
  }
}

// One tile of kTrainerTile parameters a block, 4 a thread, tiles back to front; launched as a
// programmatic dependent of the check. Elements below decay_end take weight decay (a multiple of 8:
// a thread's 4 are all below it or all above).
constexpr int kTrainerElements = 4;
constexpr int kTrainerTile = kTrainerElements * kThreads;

template <class T, bool kMaster>
__global__ void __launch_bounds__(kThreads)
    adamw_trainer_kernel(T* __restrict__ params, const T* __restrict__ grads, float* __restrict__ master,
                         float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq, size_t elements, size_t decay_end,
                         TrainerState* __restrict__ state, float inv_scale) {
  wait_for_prior_grid();  // the check's verdict, step count and scalars
  const Coefficients c = state->coefficients;
  const bool skip = state->verdict != 0 || c.frozen == 2;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    state->steps[1] = state->steps[0] + (skip ? 0 : 1);
    state->adamw_steps[1] = state->adamw_steps[0] + (skip || c.frozen ? 0 : 1);
    if (!skip && !c.frozen) state->frozen_at = 0;  // an AdamW step taken unfreezes (a skipped one does not)
  }
  if (skip) return;

  using VT = Vec<T, kTrainerElements>;
  using VF = Vec<float, kTrainerElements>;
  const size_t tile = gridDim.x - 1 - blockIdx.x;  // back to front (see the top of the file)
  const size_t e = tile * kTrainerTile + static_cast<size_t>(threadIdx.x) * kTrainerElements;
  if (e >= elements) return;  // elements is a multiple of 8: a thread's 4 are all in or all out
  const VT g = VT::load(grads + e);
  VF m = VF::load_stream(exp_avg + e), v = VF::load_stream(exp_avg_sq + e);
  float p[kTrainerElements];
  if constexpr (kMaster) {
    const VF pv = VF::load_stream(master + e);
#pragma unroll
    for (int j = 0; j < kTrainerElements; ++j) p[j] = pv.v[j];
  } else {
    const VT pv = VT::load_stream(params + e);
#pragma unroll
    for (int j = 0; j < kTrainerElements; ++j) p[j] = to_float(pv.v[j]);
  }
  const float decay = e < decay_end ? c.decay : 1.f;
  VT out;
  if (c.frozen) {
#pragma unroll
    for (int j = 0; j < kTrainerElements; ++j) {
      frozen_variance_update(to_float(g.v[j]) * inv_scale, p[j], m.v[j], v.v[j], c, decay);
      out.v[j] = from_float<T>(p[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kTrainerElements; ++j) {
      adamw_update(to_float(g.v[j]) * inv_scale, p[j], m.v[j], v.v[j], c, decay);
      out.v[j] = from_float<T>(p[j]);
    }
  }
  out.store(params + e);
  m.store(exp_avg + e);
  if (!c.frozen) v.store(exp_avg_sq + e);
  if constexpr (kMaster) {
    VF pv;
#pragma unroll
    for (int j = 0; j < kTrainerElements; ++j) pv.v[j] = p[j];
    pv.store(master + e);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) widen_kernel(const T* __restrict__ in, float* __restrict__ out, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    out[i] = to_float(in[i]);
  }
}

// ---- kernel launchers

void check_options(const AdamWOptions& o) {
  // The negated comparisons also reject NaN.
  if (!(o.lr >= 0) || !(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1) || !(o.eps >= 0) ||
      !(o.weight_decay >= 0)) {
    throw std::invalid_argument("adamw: need lr >= 0, 0 <= beta1, beta2 < 1, eps >= 0 and weight_decay >= 0 (got lr " +
                                std::to_string(o.lr) + ", betas " + std::to_string(o.beta1) + ", " +
                                std::to_string(o.beta2) + ", eps " + std::to_string(o.eps) + ", weight_decay " +
                                std::to_string(o.weight_decay) + ")");
  }
}

template <class T>
int check_grid() {
  static const int blocks = resident_blocks(adamw_gradient_check_kernel<T>, kThreads);
  return blocks;
}

template <class T, bool kMaster>
void trainer_step_typed(T* params, const T* grads, float* master, float* exp_avg, float* exp_avg_sq, size_t elements,
                        size_t decay_end, int* flags, int flag_count, TrainerState* state, const AdamWOptions& options,
                        double velocity, double max_step, float inv_scale, cudaStream_t stream) {
  const size_t vectors = elements / (16 / sizeof(T));
  adamw_gradient_check_kernel<T>
      <<<flag_count, kThreads, 0, stream>>>(grads, vectors, flags, state, options, velocity, max_step);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  // At least one block: block 0 carries the step count even over an empty buffer.
  const size_t tiles = std::max<size_t>((elements + kTrainerTile - 1) / kTrainerTile, 1);
  if (tiles > static_cast<size_t>(INT_MAX)) throw std::invalid_argument("adamw trainer: too many parameters");
  launch_after_prior(adamw_trainer_kernel<T, kMaster>, dim3(static_cast<unsigned>(tiles)), dim3(kThreads), 0, stream,
                     params, grads, master, exp_avg, exp_avg_sq, elements, decay_end, state, inv_scale);
}

}  // namespace

FlatLayout flat_layout(const std::vector<size_t>& sizes, size_t alignment_elements) {
  if (alignment_elements == 0) throw std::invalid_argument("flat_layout: alignment must be > 0");
  FlatLayout layout;
  layout.offsets.reserve(sizes.size());
  for (size_t size : sizes) {
    layout.offsets.push_back(layout.elements);
    layout.elements += (size + alignment_elements - 1) / alignment_elements * alignment_elements;
  }
  return layout;
}

// ---- AdamW over a list of float tensors

AdamWTensorList::AdamWTensorList(const std::vector<AdamWTensor>& tensors) {
  if (tensors.size() > static_cast<size_t>(INT_MAX)) throw std::invalid_argument("adamw: too many tensors");
  std::vector<TensorDescriptor> descriptors;
  std::vector<ChunkDescriptor> chunks;
  descriptors.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWTensor& t = tensors[i];
    if (t.count > 0 && (!t.param || !t.grad || !t.exp_avg || !t.exp_avg_sq)) {
      throw std::invalid_argument("adamw: tensor " + std::to_string(i) + " has a null pointer");
    }
    const bool vectorized = aligned16(t.param) && aligned16(t.grad) && aligned16(t.exp_avg) && aligned16(t.exp_avg_sq);
    descriptors.push_back({t.param, t.grad, t.exp_avg, t.exp_avg_sq, vectorized ? 1 : 0});
    for (size_t offset = 0; offset < t.count; offset += kChunkElements) {
      const int length = static_cast<int>(std::min<size_t>(kChunkElements, t.count - offset));
      chunks.push_back({static_cast<int64_t>(offset), static_cast<int>(i), length});
    }
    elements_ += t.count;
  }
  if (chunks.size() > static_cast<size_t>(INT_MAX)) throw std::invalid_argument("adamw: too many elements");
  tensor_count_ = static_cast<int>(descriptors.size());
  chunk_count_ = static_cast<int>(chunks.size());
  if (chunk_count_ == 0) return;
  const size_t descriptor_bytes = (descriptors.size() * sizeof(TensorDescriptor) + 15) / 16 * 16;
  const size_t chunk_bytes = chunks.size() * sizeof(ChunkDescriptor);
  FUSEKIT_CUDA_CHECK(cudaMalloc(&table_, descriptor_bytes + chunk_bytes));
  auto* bytes = static_cast<char*>(table_);
  try {
    FUSEKIT_CUDA_CHECK(
        cudaMemcpy(bytes, descriptors.data(), descriptors.size() * sizeof(TensorDescriptor), cudaMemcpyHostToDevice));
    FUSEKIT_CUDA_CHECK(cudaMemcpy(bytes + descriptor_bytes, chunks.data(), chunk_bytes, cudaMemcpyHostToDevice));
  } catch (...) {
    cudaFree(table_);
    throw;
  }
}

AdamWTensorList::~AdamWTensorList() {
  if (table_) cudaFree(table_);
}

void adamw_step(const AdamWTensorList& list, const AdamWOptions& options, int64_t step, cudaStream_t stream) {
  check_options(options);
  if (step < 1) throw std::invalid_argument("adamw: step must be >= 1 (got " + std::to_string(step) + ")");
  if (list.chunk_count_ == 0) return;
  const auto* tensors = static_cast<const TensorDescriptor*>(list.table_);
  const size_t descriptor_bytes = (list.tensor_count_ * sizeof(TensorDescriptor) + 15) / 16 * 16;
  const auto* chunks =
      reinterpret_cast<const ChunkDescriptor*>(static_cast<const char*>(list.table_) + descriptor_bytes);
  static const int resident = resident_blocks(adamw_multi_tensor_kernel, kThreads);
  const int blocks = std::min(list.chunk_count_, resident);
  adamw_multi_tensor_kernel<<<blocks, kThreads, 0, stream>>>(tensors, chunks, list.chunk_count_,
                                                             make_coefficients(options, step));
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

// ---- The mixed-precision trainer

AdamWTrainer::AdamWTrainer(DType dtype, const std::vector<size_t>& sizes, bool master_weights, size_t decayed_tensors)
    : dtype_(dtype), sizes_(sizes), decayed_tensors_(decayed_tensors == kAllTensors ? sizes.size() : decayed_tensors) {
  if (dtype == DType::f32) {
    throw std::invalid_argument("adamw trainer: parameters must be fp16 or bf16 (fp32 tensors: adamw_step)");
  }
  if (decayed_tensors_ > sizes.size()) {
    throw std::invalid_argument("adamw trainer: " + std::to_string(decayed_tensors) + " decayed tensors of " +
                                std::to_string(sizes.size()));
  }
  // 8 elements of 16 bits: every offset a multiple of 8, which the update's one compare relies on.
  layout_ = flat_layout(sizes, 16 / dtype_size(dtype));
  decay_end_ = decayed_tensors_ < sizes.size() ? layout_.offsets[decayed_tensors_] : layout_.elements;
  check_blocks_ = dispatch_16bit_dtype(dtype, "adamw trainer", [](auto type) {
    using T = typename decltype(type)::type;
    return check_grid<T>();
  });
  const size_t n = std::max<size_t>(layout_.elements, 1);
  auto allocate = [](auto** p, size_t bytes) {
    FUSEKIT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(p), bytes));
    FUSEKIT_CUDA_CHECK(cudaMemset(*p, 0, bytes));
  };
  try {
    allocate(&parameters_, n * dtype_size(dtype));
    allocate(&gradients_, n * dtype_size(dtype));
    if (master_weights) allocate(&master_, n * sizeof(float));
    allocate(&exp_avg_, n * sizeof(float));
    allocate(&exp_avg_sq_, n * sizeof(float));
    allocate(&state_, sizeof(TrainerState) + check_blocks_ * sizeof(int));
    flags_ = reinterpret_cast<int*>(static_cast<char*>(state_) + sizeof(TrainerState));
  } catch (...) {
    for (void* p : {parameters_, gradients_, static_cast<void*>(master_), static_cast<void*>(exp_avg_),
                    static_cast<void*>(exp_avg_sq_), state_}) {
      if (p) cudaFree(p);
    }
    throw;
  }
}

AdamWTrainer::~AdamWTrainer() {
  for (void* p : {parameters_, gradients_, static_cast<void*>(master_), static_cast<void*>(exp_avg_),
                  static_cast<void*>(exp_avg_sq_), state_}) {
    if (p) cudaFree(p);
  }
}

void* AdamWTrainer::parameter(size_t tensor) const {
  return static_cast<char*>(parameters_) + offset(tensor) * dtype_size(dtype_);
}

void* AdamWTrainer::gradient(size_t tensor) const {
  return static_cast<char*>(gradients_) + offset(tensor) * dtype_size(dtype_);
}

void AdamWTrainer::load_master_weights(cudaStream_t stream) {
  if (!master_ || layout_.elements == 0) return;
  const int blocks = static_cast<int>(
      std::min<size_t>((layout_.elements + kThreads - 1) / kThreads, static_cast<size_t>(8 * multiprocessors())));
  dispatch_16bit_dtype(dtype_, "adamw trainer", [&](auto type) {
    using T = typename decltype(type)::type;
    widen_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(parameters_), master_, layout_.elements);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

void AdamWTrainer::step(const AdamWOptions& options, float loss_scale, cudaStream_t stream) {
  launch_step(options, -1.0, 1.0, loss_scale, stream);
  ++unfrozen_calls_;
}

void AdamWTrainer::step_frozen_variance(const AdamWOptions& options, double velocity_factor, float loss_scale,
                                        cudaStream_t stream, double max_step) {
  if (!(max_step >= 1)) {
    throw std::invalid_argument("adamw trainer: the largest frozen step must be >= 1 lr (got " +
                                std::to_string(max_step) + ")");
  }
  if (!(velocity_factor >= 0 && velocity_factor < 1)) {
    throw std::invalid_argument("adamw trainer: the velocity factor must be in [0, 1) (got " +
                                std::to_string(velocity_factor) + ")");
  }
  if (unfrozen_calls_ == 0) {
    throw std::logic_error(
        "adamw trainer: a frozen-variance step needs AdamW steps before it (the second moment is zero)");
  }
  launch_step(options, velocity_factor, max_step, loss_scale, stream);
}

void AdamWTrainer::launch_step(const AdamWOptions& options, double velocity, double max_step, float loss_scale,
                               cudaStream_t stream) {
  check_options(options);
  if (!(loss_scale > 0) || !std::isfinite(loss_scale)) {
    throw std::invalid_argument("adamw trainer: loss_scale must be finite and > 0 (got " + std::to_string(loss_scale) +
                                ")");
  }
  const float inv_scale = 1.0f / loss_scale;
  dispatch_16bit_dtype(dtype_, "adamw trainer", [&](auto type) {
    using T = typename decltype(type)::type;
    auto* p = static_cast<T*>(parameters_);
    const auto* g = static_cast<const T*>(gradients_);
    if (master_) {
      trainer_step_typed<T, true>(p, g, master_, exp_avg_, exp_avg_sq_, layout_.elements, decay_end_, flags_,
                                  check_blocks_, static_cast<TrainerState*>(state_), options, velocity, max_step,
                                  inv_scale, stream);
    } else {
      trainer_step_typed<T, false>(p, g, nullptr, exp_avg_, exp_avg_sq_, layout_.elements, decay_end_, flags_,
                                   check_blocks_, static_cast<TrainerState*>(state_), options, velocity, max_step,
                                   inv_scale, stream);
    }
  });
}

int64_t AdamWTrainer::step_count(cudaStream_t stream) const {
  int64_t count = 0;
  FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(&count, &static_cast<TrainerState*>(state_)->steps[1], sizeof(count),
                                     cudaMemcpyDeviceToHost, stream));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return count;
}

}  // namespace fusekit::kernels
