// Layer-wise top-k selection of gradients on the GPU with error feedback: per layer, about the
// density * n entries of largest magnitude of residual + gradient, found by a threshold that a
// sample estimates and counting passes refine (no sort), written as (index, value) pairs.
//
//   per layer of n elements, k = ceil(density * n) clamped to [1, n]:
//   residual += gradient                                   (error feedback: the unsent remainder)
//   t = a threshold with count(|residual| >= t) in [low, cap], low = ceil(0.8 k), cap = floor(1.25 k)
//   sent = {(i, residual[i]) : |residual[i]| >= t}, in increasing i; residual[i] = 0 for those i
// so sent + residual == gradient + old residual exactly, element by element (the sum is one float
// addition, stored once).
//
// Layout: `layers` are (offset, size) spans of one flat buffer of gradients (fp32, fp16 or bf16)
// and of the fp32 residual of the same length. Outputs: int32 indices local to the layer and fp32
// values, layer l's entries from output_offset(l), room for cap(max_density) of them.
//
// The threshold. A strided sample of up to 1024 elements per layer, sorted in shared memory,
// gives an estimate (exact where the layer has no more elements than that). Each counting pass
// counts |x| >= t for 16 candidate thresholds at once (a compare per candidate per element,
// counts in registers, no atomics per element), and a one-thread-per-layer step picks the
// candidate whose count is nearest k within [low, cap], or places the next 16 inside the bracket
// found, or in half-octave steps beyond it (dp/topk_threshold.h, which a CPU test runs too). The
// first pass also performs residual += gradient, so a layer whose estimate was good costs one read
// of the gradient and one read and write of the residual; the refinement is bounded at 4 counting
// passes. The documented tolerance: every count is <= cap (the outputs never overflow), and is
// >= low unless 4 passes did not find such a threshold (ties: many equal magnitudes straddling
// the k-th), in which case the largest count <= cap that was seen is taken. Magnitudes compare as
// float bit patterns, which order non-negative floats as their values do; gradients are assumed
// finite.
//
// Compaction is stable: each pass's per-tile counts (tiles of 8192 elements, one block each)
// are kept, an exclusive scan over the tiles of each layer gives every tile's output offset, and a
// block-wide scan orders the entries inside a tile.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/dtype.h"

namespace fusekit::dp {

struct LayerSpan {
  int64_t offset = 0;  // elements into the flat buffers
  int64_t size = 0;    // >= 1, < 2^31
};

struct LayerSelectionResult {
  int64_t k = 0;        // the target, ceil(density * n) clamped to [1, n]
  int64_t count = 0;    // entries selected and written
  float threshold = 0;  // selected = {i : |residual + gradient| >= threshold}; +inf where none
  int passes = 0;       // counting passes the layer took (1 to 4)
  int64_t output_offset = 0;
};

constexpr int kSelectionCandidates = 16;
constexpr int kSelectionPasses = 4;
constexpr int kSelectionSampleSize = 1024;
constexpr int kSelectionTile = 8192;

// Entries a layer of n elements selects at `density`: ceil(density * n), at least 1 and at most n
// (so that no layer is starved); 0 for an empty layer. The kernels compute the same in double.
inline uint64_t selected_entries(uint64_t n, double density) {
  if (n == 0) return 0;
  const double k = std::ceil(density * static_cast<double>(n));
  return k < 1 ? 1 : k > static_cast<double>(n) ? n : static_cast<uint64_t>(k);
}

// The tolerance around k: [low, cap].
inline int64_t selection_low(int64_t k) { return k - k / 5; }
inline int64_t selection_cap(int64_t k) { return k + k / 4; }

class TopkSelection {
 public:
  // Builds the tile table and allocates the outputs for densities up to max_density.
  TopkSelection(std::vector<LayerSpan> layers, double max_density);
  ~TopkSelection();
  TopkSelection(const TopkSelection&) = delete;
  TopkSelection& operator=(const TopkSelection&) = delete;

  // residual += gradient, then the selection above at `density` (0 < density <= max_density).
  // `gradient` holds elements of `dtype`; both buffers cover every layer.
  // With `second_moment` (fp32, the same flat layout: AdamW's v, frozen) the selection ranks each
  // entry by the step AdamW would take with it, |residual| / (sqrt(v) + eps) (eps > 0), instead of
  // |residual|; the thresholds (LayerSelectionResult::threshold) are then of that score, and the
  // values sent are still the residual's. Per layer a constant factor of the residual (the loss
  // scale) does not change the ranking; AdamW's bias correction of v goes into eps (the caller's).
  // The score ignores the frozen step's cap (kernels/adamw.h), so coordinates whose v is about zero
  // (rows the dense steps never touched) rank first: their step, capped, is still the largest.
  void select(const void* gradient, kernels::DType dtype, float* residual, double density, cudaStream_t stream,
              const float* second_moment = nullptr, float eps = 0);

  size_t layers() const { return layers_.size(); }
  const LayerSpan& layer(size_t l) const { return layers_.at(l); }
  int64_t output_offset(size_t l) const { return output_offsets_.at(l); }
  int64_t output_capacity() const { return output_capacity_; }
  const int32_t* indices() const { return indices_; }  // device, output_capacity() entries
  const float* values() const { return values_; }      // device, output_capacity() entries

  // The last selection's per-layer results; synchronizes with `stream`.
  std::vector<LayerSelectionResult> results(cudaStream_t stream) const;

 private:
  std::vector<LayerSpan> layers_;
  std::vector<int64_t> output_offsets_;
  int64_t output_capacity_ = 0;
  double max_density_ = 0;
  int tiles_ = 0;
  void* layer_table_ = nullptr;       // device: per-layer descriptors
  void* states_ = nullptr;            // device: per-layer selection state
  int* tile_layers_ = nullptr;        // device: the layer of each tile
  unsigned* tile_counts_ = nullptr;   // device: tiles x kSelectionCandidates
  unsigned* tile_offsets_ = nullptr;  // device: tiles
  int32_t* indices_ = nullptr;
  float* values_ = nullptr;
};

}  // namespace fusekit::dp
