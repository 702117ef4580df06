// Which exchange a layer (or a bucket of small layers) takes: dense allreduce, or sparse top-k
// selection with the load-balanced sparse collective, by an alpha-beta cost model.
//
// A collective call costs latency + bus_bytes / bus_bandwidth, where bus_bandwidth is the link's
// bus bandwidth as nccl-tests reports it and bus_bytes follow nccl-tests' definitions
// (algbw = size / time):
//   allreduce of S bytes:                 busbw = algbw * 2(P - 1) / P  ->  bus_bytes = S * 2(P - 1) / P
//   allgather (or all-to-all), S in all:  busbw = algbw * (P - 1) / P   ->  bus_bytes = S * (P - 1) / P
// Dense: one allreduce of n * dtype bytes.
// Sparse: selection (seconds_fixed + seconds_per_byte * n * dtype bytes), then a reduce-scatter of
// each rank's k encoded entries (every rank keeps 1/P of them and sends the rest: an all-to-all of
// P * entry bytes), then an allgather of the P reduced slices. A slice holds the union of the
// ranks' entries in it, taken at its worst, min(P * k, n) / P entries (no two ranks select the same
// index), encoded in its best form, or dense 16-bit values where that is smaller.
// The non-obvious choice: entry bytes are choose_encoding's bounds, not sizes of real selections,
// so the prediction never depends on where the large gradients lie.
#pragma once

#include <cstdint>
#include <string>

#include "dp/sparse_encoding.h"
#include "dp/topk_selection.h"  // selected_entries
#include "kernels/dtype.h"

namespace fusekit::dp {

struct Link {
  double bus_bandwidth = 0;  // bytes per second, nccl-tests' busbw for large messages
  double latency = 0;        // seconds per collective call
};

struct SelectionCost {
  double seconds_per_byte = 0;  // per byte of the layer's gradient
  double seconds_fixed = 0;     // launches and the threshold's refinement, per layer
};

struct ExchangeDecision {
  bool sparse = false;
  Encoding encoding = Encoding::key_value;  // of each rank's entries, where sparse
  uint64_t k = 0;                           // entries selected per rank
  double dense_seconds = 0;
  double sparse_seconds = 0;  // selection + reduce-scatter + allgather
  double selection_seconds = 0, reduce_scatter_seconds = 0, allgather_seconds = 0;
  double dense_bytes_per_rank = 0;   // bytes each rank sends, nccl-tests' bus bytes
  double sparse_bytes_per_rank = 0;  // reduce-scatter + allgather bus bytes
  std::string reason;                // one line: the choice, both predictions and the inputs
};

// The predicted times of both exchanges of a layer of `elements` gradients of `dtype` over `ranks`
// ranks at `density` (0 < density <= 1), and the cheaper one. One rank: dense, nothing to send.
ExchangeDecision choose_exchange(const Link& link, int ranks, uint64_t elements, kernels::DType dtype, double density,
                                 const SelectionCost& selection);

// Density warm-up (Deep Gradient Compression): the density of step `step` (from 0) falls
// geometrically from `start` to `final` over `warmup_steps` steps, then stays at `final`.
double warmup_density(int64_t step, int64_t warmup_steps, double start, double final);

}  // namespace fusekit::dp
