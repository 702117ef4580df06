// The sparse gradient exchange over NCCL: each rank holds selected entries of one flat buffer of
// `elements` gradients and every rank ends with the same dense sum of all ranks' entries, in fp32.
//
// Input, per rank, on the device: `count` entries in the plain key-value form, indices uint32
// strictly increasing below `elements` and values as 16-bit words (fp16 or bf16 bits, WireValue).
// Output: `out`, fp32, `elements` long, written whole.
//
//   allgather                  every rank's entries to every rank: ncclAllGather of the counts,
//                              then one ncclBroadcast per rank in one group (a variable-size
//                              allgather); each rank sums all entries in fp32, rank 0's first.
//   reduce_scatter_allgather   rank r reduces slice r of the index space: every rank's histogram
//                              of its indices (bins of equal width), gathered by one ncclAllGather,
//                              gives the loads, the slice edges (dp/partition.h, balanced or equal)
//                              and the counts per (sender, slice) (dp/slice_plan.h's plan_exchange:
//                              the slices end on bin edges); then each rank ncclSends
//                              each slice's entries to its owner (one group of sends and receives),
//                              the owner adds them in fp32 into its slice, source rank by source
//                              rank, rounds the sums to the 16-bit wire type once, and every slice
//                              reaches every rank by one ncclBroadcast per owner in one group, as
//                              (index, value) entries or as the dense 16-bit slice, whichever is
//                              fewer bytes (6 per nonzero entry against 2 per element). With
//                              keep < 1 each owner first keeps only its largest sums
//                              (re-selection, dp/slice_plan.h): about keep x as many gathered.
//   dense_allreduce            the baseline: ncclAllReduce (sum) of the flat buffer, in place.
// Both sparse results are deterministic and bitwise equal on every rank. allgather's is the fp32
// sum of the 16-bit values in rank order; reduce_scatter_allgather's owner adds in the same order,
// so its result (keep = 1) is exactly allgather's rounded once to the wire type (its slices travel
// as 16-bit values; a sum that rounds to zero is +0 on every rank); with keep < 1, the same where
// a sum was kept and +0 elsewhere. The slices and the forms are dp/slice_plan.h's.
//
// Bytes sent: per rank, by phase. A point-to-point send counts its bytes exactly; a collective
// counts nccl-tests' bus bytes per rank (what a ring sends): an allreduce of S bytes 2S(P - 1)/P,
// an allgather or a group of broadcasts of S bytes in all S(P - 1)/P.
//
// The non-obvious choice: every rank stays in step without a separate check. An entry list that is
// not strictly increasing below `elements` is counted on the device and that count travels with
// the first metadata collective, so every rank throws the same std::invalid_argument together
// instead of one rank leaving the others blocked in NCCL. Each collective synchronizes the
// communicator's stream where the host needs counts (once in allgather, twice in
// reduce_scatter_allgather, and twice more with keep < 1 for the re-selection's histograms); the
// caller orders its work after the call on the same stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dp/communicator.h"
#include "dp/slice_plan.h"  // SlicePartition
#include "dp/wire_value.h"
#include "kernels/dtype.h"

namespace fusekit::dp {

// How indices travel in reduce_scatter_allgather: plain uint32 (4 bytes an entry), or bucketed
// (dp/slice_plan.h: 16-bit offsets in the destination slice plus a uint32 count per 2^16 elements
// of it, about 2 bytes an entry). Both give the same result; bucketed sends fewer bytes.
enum class IndexForm { plain, bucketed };
const char* index_form_name(IndexForm form);          // "plain", "bucketed"
IndexForm parse_index_form(const std::string& name);  // std::invalid_argument otherwise

struct SparseEntries {
  const uint32_t* indices = nullptr;  // device, strictly increasing, < elements
  const uint16_t* values = nullptr;   // device, fp16 or bf16 bits
  uint64_t count = 0;
};

struct ExchangeStats {
  double bytes_sent = 0;            // this rank, every phase below
  double metadata_bytes = 0;        // counts and the histogram
  double reduce_scatter_bytes = 0;  // this rank's ncclSends, exact
  double gather_bytes = 0;          // the allgather of entries, or of the reduced slices
  std::vector<uint64_t> received;   // per rank: entries it took in (reduced slices: to reduce, own ones too)
  double imbalance = 1;             // max / mean of `received` (1 where nothing was selected)
  uint64_t result_entries = 0;      // nonzero 16-bit sums (reduce_scatter_allgather)
  int dense_slices = 0;             // slices gathered dense, the others as entries
  uint64_t reselected_from = 0;     // re-selection: this owner's nonzero fp32 sums before it (0: none)
};

class SparseCollective {
 public:
  // Workspace for buffers of `elements` (< 2^32) and up to `max_entries` entries per rank; `bins`
  // histogram bins for the partition (at most `elements` are used).
  SparseCollective(Communicator& communicator, uint64_t elements, uint64_t max_entries, WireValue type,
                   size_t bins = 4096, IndexForm index_form = IndexForm::plain);
  ~SparseCollective();
  SparseCollective(const SparseCollective&) = delete;
  SparseCollective& operator=(const SparseCollective&) = delete;

  ExchangeStats allgather(const SparseEntries& mine, float* out);
  // keep < 1: each owner keeps about that fraction of its slice's nonzero sums, the largest
  // (dp/slice_plan.h's re-selection); the others are zero in `out` on every rank. The caller
  // returns its entries there to its residual (ErrorFeedback::return_unapplied).
  ExchangeStats reduce_scatter_allgather(const SparseEntries& mine, float* out,
                                         SlicePartition partition = SlicePartition::balanced, double keep = 1.0);

  uint64_t elements() const { return elements_; }
  IndexForm index_form() const { return index_form_; }
  WireValue wire() const { return type_; }
  // The slice edges in elements of the last reduce_scatter_allgather (P + 1 of them).
  const std::vector<uint64_t>& slice_edges() const { return edges_; }

 private:
  void check_entries(const SparseEntries& mine) const;

  Communicator& communicator_;
  uint64_t elements_, max_entries_;
  WireValue type_;
  size_t bins_;
  uint32_t width_;
  std::vector<uint64_t> edges_;
  // device
  uint32_t* received_indices_ = nullptr;  // P * max_entries
  uint16_t* received_values_ = nullptr;
  uint16_t* stage_ = nullptr;             // elements: the rounded slices, 16-bit
  uint32_t* gathered_indices_ = nullptr;  // gather_capacity_: the slices sent as entries
  uint16_t* gathered_values_ = nullptr;
  uint64_t gather_capacity_ = 0;
  unsigned* tile_counts_ = nullptr;  // per tile of the largest slice
  unsigned* tile_offsets_ = nullptr;
  unsigned long long* metadata_ = nullptr;  // histogram (bins + 1), loads (bins + 1), counts
  // host, pinned
  unsigned long long* host_metadata_ = nullptr;
  // The bucketed index form: edges and bucket bases (device and pinned), what is sent, received
  // and gathered in it.
  IndexForm index_form_ = IndexForm::plain;
  uint64_t max_buckets_ = 0;  // bucket_count(elements): of any one slice
  unsigned long long* bucket_meta_ = nullptr;
  unsigned long long* host_bucket_meta_ = nullptr;
  uint16_t* send_low_ = nullptr;
  unsigned* send_counts_ = nullptr;
  uint16_t* received_low_ = nullptr;
  unsigned* received_counts_ = nullptr;  // per source rank, max_buckets_ each
  unsigned* received_starts_ = nullptr;
  uint16_t* gathered_low_ = nullptr;
  unsigned* gathered_counts_ = nullptr;
  unsigned* gathered_starts_ = nullptr;
  unsigned long long* scan_totals_ = nullptr;            // scratch, per rank
  unsigned long long* magnitude_counts_ = nullptr;       // device, kMagnitudeBins: re-selection
  unsigned long long* host_magnitude_counts_ = nullptr;  // pinned
};

// The dense baseline: ncclAllReduce (sum) of `elements` of `dtype` at `buffer`, in place, on the
// communicator's stream.
ExchangeStats dense_allreduce(Communicator& communicator, void* buffer, uint64_t elements, kernels::DType dtype);

}  // namespace fusekit::dp
