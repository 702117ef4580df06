// The host bookkeeping of the balanced sparse reduce-scatter + allgather (dp/sparse_collective.h),
// which every rank computes alike from the same collective results, so no rank needs to be told:
//
//   plan_slices   from this rank's histogram and the bins' loads summed over ranks: the slices
//                 (dp/partition.h, balanced or equal, cut on bin edges), and this rank's count and
//                 offset of entries in each slice. Slices end on bin edges, so the histogram's bins
//                 give the counts exactly: no search through the indices.
//   plan_gather   from each slice's count of nonzero 16-bit sums: whether it travels dense (2 bytes
//                 an element) or as (index, value) entries (6 bytes an entry), the fewer bytes
//                 (ties dense), and where the entry slices lie in the gather buffer.
//   re-selection (keep < 1) before the gather, each owner keeps about `keep` of its slice's
//                 nonzero sums, the largest in magnitude (a global top-k by slices, as gTop-k and
//                 Ok-Topk do): a histogram of the sums' magnitudes in bins of an eighth of an octave
//                 (a float's exponent and 3 mantissa bits) finds the bin where the count is reached,
//                 a second histogram splits that bin 2048 ways, and the threshold is the lower edge
//                 of the fine bin where it is reached (reselect_level below, twice): the sums under
//                 it become zero and are not gathered, and the senders take their entries there back
//                 into their error-feedback residuals (ErrorFeedback::return_unapplied), so nothing
//                 is lost, only delayed. Two levels because the sums of top-k selections crowd just
//                 above the ranks' own thresholds: one coarse bin there can hold 40% of them.
// Entry slices have fewer than a third as many entries as elements, so together they never
// exceed gather_capacity: the buffer is sized once.
//
// Bytes follow nccl-tests' bus bytes per rank: an allreduce of S bytes 2S(P - 1)/P, an allgather
// (or a group of broadcasts) of S bytes in all S(P - 1)/P.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dp/partition.h"
#include "dp/slice_plan_constants.h"  // kMagnitudeBins, kMagnitudeShift

namespace fusekit::dp {

enum class SlicePartition { balanced, equal };

constexpr size_t kEntryBytes = 6;  // uint32 index + 16-bit value

struct SlicePlan {
  Partition partition;                 // in bins; loads = entries each slice's owner reduces
  std::vector<uint64_t> edges;         // P + 1 element edges
  std::vector<uint64_t> send_counts;   // P: this rank's entries in each slice
  std::vector<uint64_t> send_offsets;  // P + 1: where they start among its sorted entries
};

// `own_histogram` and `loads` have the same number of bins over `elements` indices.
SlicePlan plan_slices(std::span<const uint64_t> own_histogram, std::span<const uint64_t> loads, int ranks,
                      uint64_t elements, SlicePartition kind);

// From every rank's histogram at once (`histograms`: ranks rows of `stride` >= bins words, row s
// rank s's bins first, as an allgather of the histograms lays them out): the loads, this rank's
// plan, and count(s, r), the entries rank s sends to slice r, for every pair. One allgather of the
// histograms thus gives what an allreduce of them and an allgather of the send counts gave, in one
// round trip instead of two: the slices end on bin edges, so every rank's counts follow from its
// histogram (plan_slices).
struct ExchangePlan {
  SlicePlan mine;                // rank `me`'s
  std::vector<uint64_t> loads;   // bins: the entries in each bin over all ranks
  std::vector<uint64_t> counts;  // ranks x ranks, row-major: counts[s * ranks + r] = count(s, r)
};
ExchangePlan plan_exchange(std::span<const uint64_t> histograms, size_t stride, size_t bins, int ranks, int me,
                           uint64_t elements, SlicePartition kind);

struct GatherPlan {
  std::vector<bool> dense;        // per slice
  std::vector<uint64_t> offsets;  // P + 1: the entry slices' starts in the gather buffer
  double bytes = 0;               // every slice's bytes, together
  int dense_slices = 0;           // non-empty slices sent dense
  uint64_t entries = 0;           // nonzero sums in all slices
};

// `edges`: P + 1 element edges; `nonzero`: P counts, each at most its slice's length.
GatherPlan plan_gather(std::span<const uint64_t> edges, std::span<const uint64_t> nonzero);

// The gather buffer's entries for `elements` and at most `received` entries in all.
uint64_t gather_capacity(uint64_t elements, uint64_t received);

// The sums an owner keeps of `nonzero`: ceil(keep * nonzero), at least 1 where nonzero > 0;
// std::invalid_argument unless 0 < keep <= 1.
uint64_t reselect_count(uint64_t nonzero, double keep);

// One level of the threshold search, over kMagnitudeBins counts: the highest bin b at which the
// count of values in bins >= b reaches `count`, and `above`, the count in bins > b (so count - above
// of bin b's values are still needed). keep_all where the histogram holds no more than `count`
// (then bin 0, above 0).
struct ReselectLevel {
  bool keep_all = false;
  uint32_t bin = 0;
  uint64_t above = 0;
};
ReselectLevel reselect_level(std::span<const uint64_t> histogram, uint64_t count);

// The threshold (the smallest magnitude bit pattern kept) from the two levels: coarse = the level
// over the coarse bins for `count`, fine = the level over that bin's fine histogram for
// count - coarse.above. 0 (keep all) where coarse.keep_all. The kept count is >= count and exceeds
// it by less than the population of one fine bin (ties aside: equal magnitudes are kept together).
uint32_t reselect_threshold(const ReselectLevel& coarse, const ReselectLevel& fine);

// The bucketed index form (kBucketShift): the buckets of a slice of `length` elements,
// ceil(length / 2^16); the bytes of `entries` entries of such a slice in that form with 16-bit
// values (2 for the offset, 2 for the value, 4 per bucket), against kEntryBytes each in key-value.
uint64_t bucket_count(uint64_t length);
double bucketed_bytes(uint64_t entries, uint64_t length);
// The host reference of the GPU encoder and decoder: strictly increasing indices in [begin, end)
// to their low 16 bits (of index - begin) and per-bucket counts, and back. bucket_encode throws
// std::invalid_argument for an index outside the slice or out of order, bucket_decode for counts
// that do not add up to the entries sent.
void bucket_encode(std::span<const uint32_t> indices, uint64_t begin, uint64_t end, std::vector<uint16_t>& low,
                   std::vector<uint32_t>& counts);
std::vector<uint32_t> bucket_decode(std::span<const uint16_t> low, std::span<const uint32_t> counts, uint64_t begin);

double allgather_bus_bytes(double bytes, int ranks);
double allreduce_bus_bytes(double bytes, int ranks);

}  // namespace fusekit::dp
