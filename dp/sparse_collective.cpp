// The sparse collectives' protocol over NCCL (see sparse_collective.h for the math, the layouts
// and what counts as bytes sent; the kernels are in detail/sparse_collective_kernels.cu). Metadata
// lives in one device array of 64-bit words and its pinned host mirror.
#include "dp/sparse_collective.h"

#include <algorithm>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "dp/detail/sparse_collective_kernels.h"
#include "dp/nccl_check.h"
#include "dp/slice_plan.h"
#include "kernels/cuda_check.h"
#include "profiler/range.h"

namespace fusekit::dp {
namespace {

kernels::DType wire_dtype(WireValue type) {
  return type == WireValue::f16 ? kernels::DType::f16 : kernels::DType::bf16;
}

ncclDataType_t nccl_type(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::f32:
      return ncclFloat32;
    case kernels::DType::f16:
      return ncclFloat16;
    case kernels::DType::bf16:
      return ncclBfloat16;
  }
  throw std::invalid_argument("dense allreduce: unknown dtype");
}

// Offsets into the metadata array (64-bit words).
struct MetadataLayout {
  size_t histogram, all_histograms, own_count, all_counts, own_nonzero, all_nonzero, size;
  MetadataLayout(size_t bins, size_t ranks) {
    histogram = 0;                          // bins, then the invalid entries
    all_histograms = histogram + bins + 1;  // every rank's, in rank order
    own_count = all_histograms + ranks * (bins + 1);
    all_counts = own_count + 2;
    own_nonzero = all_counts + 2 * ranks;
    all_nonzero = own_nonzero + 1;
    size = all_nonzero + ranks;
  }
};

}  // namespace

const char* index_form_name(IndexForm form) { return form == IndexForm::bucketed ? "bucketed" : "plain"; }

IndexForm parse_index_form(const std::string& name) {
  if (name == "plain") return IndexForm::plain;
  if (name == "bucketed") return IndexForm::bucketed;
  throw std::invalid_argument("index form must be plain or bucketed, not '" + name + "'");
}

SparseCollective::SparseCollective(Communicator& communicator, uint64_t elements, uint64_t max_entries, WireValue type,
                                   size_t bins, IndexForm index_form)
    : communicator_(communicator),
      elements_(elements),
      max_entries_(max_entries),
      type_(type),
      index_form_(index_form) {
  if (elements == 0 || elements >= (uint64_t{1} << 32))
    throw std::invalid_argument("sparse collective: elements must be in [1, 2^32), got " + std::to_string(elements));
  if (max_entries == 0 || max_entries > elements)
    throw std::invalid_argument("sparse collective: max_entries must be in [1, elements], got " +
                                std::to_string(max_entries));
  if (bins == 0) throw std::invalid_argument("sparse collective: no bins");
  bins_ = static_cast<size_t>(std::min<uint64_t>(bins, elements));
  width_ = static_cast<uint32_t>(bin_width(elements, bins_));
  const uint64_t ranks = static_cast<uint64_t>(communicator.size());
  const uint64_t received = ranks * max_entries;
  gather_capacity_ = gather_capacity(elements, received);
  const uint64_t tiles = detail::slice_tiles(elements);
  const MetadataLayout layout(bins_, ranks);
  FUSEKIT_CUDA_CHECK(cudaSetDevice(communicator.device()));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&received_indices_, received * sizeof(uint32_t)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&received_values_, received * sizeof(uint16_t)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&stage_, elements * sizeof(uint16_t)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&gathered_indices_, gather_capacity_ * sizeof(uint32_t)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&gathered_values_, gather_capacity_ * sizeof(uint16_t)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&tile_counts_, tiles * sizeof(unsigned)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&tile_offsets_, tiles * sizeof(unsigned)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&metadata_, layout.size * sizeof(unsigned long long)));
  FUSEKIT_CUDA_CHECK(cudaMallocHost(&host_metadata_, layout.size * sizeof(unsigned long long)));
  FUSEKIT_CUDA_CHECK(cudaMalloc(&magnitude_counts_, kMagnitudeBins * sizeof(unsigned long long)));
  FUSEKIT_CUDA_CHECK(cudaMallocHost(&host_magnitude_counts_, kMagnitudeBins * sizeof(unsigned long long)));
  if (index_form_ == IndexForm::bucketed) {
    max_buckets_ = bucket_count(elements);
    const uint64_t all_buckets = max_buckets_ + ranks;  // over all slices: each may start a bucket of its own
    const uint64_t meta = 2 * (ranks + 1) + 4;          // edges, bases; one slice's edges and base
    FUSEKIT_CUDA_CHECK(cudaMalloc(&bucket_meta_, meta * sizeof(unsigned long long)));
    FUSEKIT_CUDA_CHECK(cudaMallocHost(&host_bucket_meta_, meta * sizeof(unsigned long long)));
    FUSEKIT_CUDA_CHECK(cudaMalloc(&send_low_, max_entries * sizeof(uint16_t)));
    FUSEKIT_CUDA_CHECK(cudaMalloc(&send_counts_, all_buckets * sizeof(unsigned)));
    FUSEKIT_CUDA_CHECK(cudaMalloc(&received_low_, received * sizeof(uint16_t)));
    FUSEKIT_CUDA_CHECK(cudaMalloc(&received_counts_, ranks * max_buckets_ * sizeof(unsigned)));
    FUSEKIT_CUDA_CHECK(cudaMalloc(&received_starts_, ranks * max_buckets_ * sizeof(unsigned)));
    FUSEKIT_CUDA_CHECK(cudaMalloc(&gathered_low_, gather_capacity_ * sizeof(uint16_t)));
    FUSEKIT_CUDA_CHECK(cudaMalloc(&gathered_counts_, all_buckets * sizeof(unsigned)));
    FUSEKIT_CUDA_CHECK(cudaMalloc(&gathered_starts_, all_buckets * sizeof(unsigned)));
    FUSEKIT_CUDA_CHECK(cudaMalloc(&scan_totals_, ranks * sizeof(unsigned long long)));
  }
}

SparseCollective::~SparseCollective() {
  cudaStreamSynchronize(communicator_.stream());
  cudaFree(received_indices_);
  cudaFree(received_values_);
  cudaFree(stage_);
  cudaFree(gathered_indices_);
  cudaFree(gathered_values_);
  cudaFree(tile_counts_);
  cudaFree(tile_offsets_);
  cudaFree(metadata_);
  cudaFreeHost(host_metadata_);
  cudaFree(magnitude_counts_);
  cudaFreeHost(host_magnitude_counts_);
  cudaFree(bucket_meta_);  // cudaFree(nullptr) and cudaFreeHost(nullptr) do nothing
  cudaFreeHost(host_bucket_meta_);
  cudaFree(send_low_);
  cudaFree(send_counts_);
  cudaFree(received_low_);
  cudaFree(received_counts_);
  cudaFree(received_starts_);
  cudaFree(gathered_low_);
  cudaFree(gathered_counts_);
  cudaFree(gathered_starts_);
  cudaFree(scan_totals_);
}

void SparseCollective::check_entries(const SparseEntries& mine) const {
  if (mine.count > 0 && (mine.indices == nullptr || mine.values == nullptr))
    throw std::invalid_argument("sparse collective: " + std::to_string(mine.count) + " entries without buffers");
}

ExchangeStats SparseCollective::allgather(const SparseEntries& mine, float* out) {
  check_entries(mine);
  const int ranks = communicator_.size(), me = communicator_.rank();
  cudaStream_t stream = communicator_.stream();
  ncclComm_t comm = communicator_.comm();
  const MetadataLayout layout(bins_, ranks);
  const kernels::DType wire = wire_dtype(type_);
  unsigned long long* own = metadata_ + layout.own_count;
  unsigned long long* host = host_metadata_;

  // Counts and invalid entries of every rank: [count, invalid] per rank.
  detail::validate_and_histogram(mine.indices, mine.count, static_cast<uint32_t>(elements_), 1, own + 1, 0, stream);
  host[layout.own_count] = mine.count;
  FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(own, host + layout.own_count, sizeof *own, cudaMemcpyHostToDevice, stream));
  FUSEKIT_NCCL_CHECK(ncclAllGather(own, metadata_ + layout.all_counts, 2, ncclUint64, comm, stream));
  FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(host + layout.all_counts, metadata_ + layout.all_counts, 2 * ranks * sizeof *host,
                                     cudaMemcpyDeviceToHost, stream));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<uint64_t> counts(ranks), offsets(ranks + 1, 0);
  for (int r = 0; r < ranks; ++r) {
    counts[r] = host[layout.all_counts + 2 * r];
    if (host[layout.all_counts + 2 * r + 1] > 0)
      throw std::invalid_argument("sparse collective: rank " + std::to_string(r) + " has " +
                                  std::to_string(host[layout.all_counts + 2 * r + 1]) +
                                  " entries out of order or at or above " + std::to_string(elements_));
    if (counts[r] > max_entries_)
      throw std::invalid_argument("sparse collective: rank " + std::to_string(r) + " has " + std::to_string(counts[r]) +
                                  " entries, more than the " + std::to_string(max_entries_) + " the workspace holds");
    offsets[r + 1] = offsets[r] + counts[r];
  }

  FUSEKIT_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < ranks; ++r) {
    if (counts[r] == 0) continue;
    uint32_t* indices = received_indices_ + offsets[r];
    uint16_t* values = received_values_ + offsets[r];
    FUSEKIT_NCCL_CHECK(ncclBroadcast(r == me ? static_cast<const void*>(mine.indices) : indices, indices, counts[r],
                                     ncclUint32, r, comm, stream));
    FUSEKIT_NCCL_CHECK(ncclBroadcast(r == me ? static_cast<const void*>(mine.values) : values, values, counts[r],
                                     ncclFloat16, r, comm, stream));
  }
  FUSEKIT_NCCL_CHECK(ncclGroupEnd());

  FUSEKIT_CUDA_CHECK(cudaMemsetAsync(out, 0, elements_ * sizeof(float), stream));
  for (int r = 0; r < ranks; ++r) {
    detail::scatter_add(received_indices_ + offsets[r], received_values_ + offsets[r], counts[r], wire, out, stream);
  }

  ExchangeStats stats;
  stats.metadata_bytes = allgather_bus_bytes(2.0 * 8 * ranks, ranks);
  stats.gather_bytes = allgather_bus_bytes(static_cast<double>(kEntryBytes * offsets[ranks]), ranks);
  stats.bytes_sent = stats.metadata_bytes + stats.gather_bytes;
  stats.received.assign(ranks, offsets[ranks]);
  return stats;
}

ExchangeStats SparseCollective::reduce_scatter_allgather(const SparseEntries& mine, float* out,
                                                         SlicePartition partition, double keep) {
  if (!(keep > 0 && keep <= 1))
    throw std::invalid_argument("sparse collective: keep must be in (0, 1], not " + std::to_string(keep));
  check_entries(mine);
  const int ranks = communicator_.size(), me = communicator_.rank();
  cudaStream_t stream = communicator_.stream();
  ncclComm_t comm = communicator_.comm();
  const MetadataLayout layout(bins_, ranks);
  unsigned long long* host = host_metadata_;
  const int bins = static_cast<int>(bins_);
  const kernels::DType wire = wire_dtype(type_);
  ExchangeStats stats;

  // Phases as NVTX ranges (dp.plan, dp.reduce_scatter, dp.reselect, dp.count, dp.gather): each ends
  // where the host waits for the stream or hands the next NCCL calls over, so a trace's wall time
  // per range says where an exchange spends its time.
  std::optional<profiler::ScopedRange> phase;
  phase.emplace("dp.plan");
  // 1. Every rank's histogram of its indices (and its invalid entries), gathered: the loads of the
  // bins, the slices (the same on every rank) and every rank's count for each slice, from this one
  // round trip (dp/slice_plan.h's plan_exchange: the slices end on bin edges).
  detail::validate_and_histogram(mine.indices, mine.count, static_cast<uint32_t>(elements_), width_,
                                 metadata_ + layout.histogram, bins, stream);
  FUSEKIT_NCCL_CHECK(ncclAllGather(metadata_ + layout.histogram, metadata_ + layout.all_histograms, bins_ + 1,
                                   ncclUint64, comm, stream));
  const size_t row = bins_ + 1;
  FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(host + layout.all_histograms, metadata_ + layout.all_histograms,
                                     ranks * row * sizeof *host, cudaMemcpyDeviceToHost, stream));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  stats.metadata_bytes += allgather_bus_bytes(8.0 * ranks * row, ranks);
  uint64_t invalid = 0;
  for (int s = 0; s < ranks; ++s) invalid += host[layout.all_histograms + s * row + bins_];
  if (invalid > 0)
    throw std::invalid_argument("sparse collective: " + std::to_string(invalid) +
                                " entries out of order or at or above " + std::to_string(elements_) + " (" +
                                std::to_string(host[layout.all_histograms + me * row + bins_]) + " of them on rank " +
                                std::to_string(me) + ")");

  // 2. This rank's plan, and count(s, r): entries rank s sends to the owner of slice r.
  const std::vector<uint64_t> histograms(host + layout.all_histograms, host + layout.all_histograms + ranks * row);
  const ExchangePlan exchange = plan_exchange(histograms, row, bins_, ranks, me, elements_, partition);
  const SlicePlan& plan = exchange.mine;
  edges_ = plan.edges;
  auto count = [&](int s, int r) { return exchange.counts[static_cast<size_t>(s) * ranks + r]; };
  for (int s = 0; s < ranks; ++s) {
    uint64_t total = 0;
    for (int r = 0; r < ranks; ++r) total += count(s, r);
    if (total > max_entries_)
      throw std::invalid_argument("sparse collective: rank " + std::to_string(s) + " has " + std::to_string(total) +
                                  " entries, more than the " + std::to_string(max_entries_) + " the workspace holds");
  }
  const std::vector<uint64_t>& send_offsets = plan.send_offsets;
  std::vector<uint64_t> receive_offsets(ranks + 1, 0);  // by source rank; none from itself
  for (int r = 0; r < ranks; ++r) receive_offsets[r + 1] = receive_offsets[r] + (r == me ? 0 : count(r, me));

  phase.reset();
  phase.emplace("dp.reduce_scatter");
  // 3. Each slice's entries to its owner: plain indices, or bucketed (16-bit offsets and per-bucket
  // counts of the destination slice, decoded back into received_indices_ after the exchange).
  const bool bucketed = index_form_ == IndexForm::bucketed;
  std::vector<uint64_t> buckets(ranks), bucket_base(ranks + 1, 0);
  for (int r = 0; r < ranks; ++r) {
    buckets[r] = bucket_count(edges_[r + 1] - edges_[r]);
    bucket_base[r + 1] = bucket_base[r] + buckets[r];
  }
  if (bucketed) {
    for (int r = 0; r <= ranks; ++r) {
      host_bucket_meta_[r] = edges_[r];
      host_bucket_meta_[ranks + 1 + r] = bucket_base[r];
    }
    FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(bucket_meta_, host_bucket_meta_, 2 * (ranks + 1) * sizeof *host_bucket_meta_,
                                       cudaMemcpyHostToDevice, stream));
    FUSEKIT_CUDA_CHECK(cudaMemsetAsync(send_counts_, 0, bucket_base[ranks] * sizeof(unsigned), stream));
    detail::bucket_encode(mine.indices, mine.count, bucket_meta_, bucket_meta_ + ranks + 1, ranks, send_low_,
                          send_counts_, stream);
  }
  FUSEKIT_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < ranks; ++r) {
    if (r == me) continue;
    if (count(me, r) > 0) {
      if (bucketed) {
        FUSEKIT_NCCL_CHECK(ncclSend(send_low_ + send_offsets[r], count(me, r), ncclFloat16, r, comm, stream));
        FUSEKIT_NCCL_CHECK(ncclSend(send_counts_ + bucket_base[r], buckets[r], ncclUint32, r, comm, stream));
        stats.reduce_scatter_bytes += bucketed_bytes(count(me, r), edges_[r + 1] - edges_[r]);
      } else {
        FUSEKIT_NCCL_CHECK(ncclSend(mine.indices + send_offsets[r], count(me, r), ncclUint32, r, comm, stream));
        stats.reduce_scatter_bytes += static_cast<double>(kEntryBytes * count(me, r));
      }
      FUSEKIT_NCCL_CHECK(ncclSend(mine.values + send_offsets[r], count(me, r), ncclFloat16, r, comm, stream));
    }
    if (count(r, me) > 0) {
      if (bucketed) {
        FUSEKIT_NCCL_CHECK(ncclRecv(received_low_ + receive_offsets[r], count(r, me), ncclFloat16, r, comm, stream));
        FUSEKIT_NCCL_CHECK(ncclRecv(received_counts_ + r * max_buckets_, buckets[me], ncclUint32, r, comm, stream));
      } else {
        FUSEKIT_NCCL_CHECK(ncclRecv(received_indices_ + receive_offsets[r], count(r, me), ncclUint32, r, comm, stream));
      }
      FUSEKIT_NCCL_CHECK(ncclRecv(received_values_ + receive_offsets[r], count(r, me), ncclFloat16, r, comm, stream));
    }
  }
  FUSEKIT_NCCL_CHECK(ncclGroupEnd());
  if (bucketed) {
    for (int s = 0; s < ranks; ++s) {
      if (s == me || count(s, me) == 0) continue;
      const int slice_buckets = static_cast<int>(buckets[me]);
      detail::bucket_scan(received_counts_ + s * max_buckets_, slice_buckets, received_starts_ + s * max_buckets_,
                          scan_totals_ + s, stream);
      detail::bucket_decode(received_low_ + receive_offsets[s], count(s, me), received_starts_ + s * max_buckets_,
                            slice_buckets, edges_[me], received_indices_ + receive_offsets[s], stream);
    }
  }

  // 4. The owner's sums, source rank by source rank, rounded to the wire; their nonzero count.
  const uint64_t begin = edges_[me], end = edges_[me + 1];
  FUSEKIT_CUDA_CHECK(cudaMemsetAsync(out, 0, elements_ * sizeof(float), stream));
  for (int s = 0; s < ranks; ++s) {
    const bool own = s == me;
    detail::scatter_add(own ? mine.indices + send_offsets[me] : received_indices_ + receive_offsets[s],
                        own ? mine.values + send_offsets[me] : received_values_ + receive_offsets[s], count(s, me),
                        wire, out, stream);
  }
  uint32_t keep_bits = 0;
  if (keep < 1) {  // re-selection: the threshold of this slice's largest sums, in two levels
    phase.reset();
    phase.emplace("dp.reselect");
    const auto histogram = [&](int coarse_bin) {
      detail::magnitude_histogram(out, begin, end, coarse_bin, magnitude_counts_, stream);
      FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(host_magnitude_counts_, magnitude_counts_,
                                         kMagnitudeBins * sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream));
      FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
      return std::vector<uint64_t>(host_magnitude_counts_, host_magnitude_counts_ + kMagnitudeBins);
    };
    const std::vector<uint64_t> coarse_counts = histogram(-1);
    uint64_t sums = 0;
    for (uint64_t c : coarse_counts) sums += c;
    stats.reselected_from = sums;
    const uint64_t count = reselect_count(sums, keep);
    const ReselectLevel coarse = reselect_level(coarse_counts, count);
    ReselectLevel fine{true, 0, 0};
    if (!coarse.keep_all) fine = reselect_level(histogram(static_cast<int>(coarse.bin)), count - coarse.above);
    keep_bits = reselect_threshold(coarse, fine);
  }
  phase.reset();
  phase.emplace("dp.count");
  detail::round_slice(out, stage_, begin, end, wire, tile_counts_, tile_offsets_, metadata_ + layout.own_nonzero,
                      stream, keep_bits);
  FUSEKIT_NCCL_CHECK(
      ncclAllGather(metadata_ + layout.own_nonzero, metadata_ + layout.all_nonzero, 1, ncclUint64, comm, stream));
  FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(host + layout.all_nonzero, metadata_ + layout.all_nonzero, ranks * sizeof *host,
                                     cudaMemcpyDeviceToHost, stream));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  stats.metadata_bytes += allgather_bus_bytes(8.0 * ranks, ranks);

  phase.reset();
  phase.emplace("dp.gather");
  // 5. Every slice to every rank, as entries where 6 bytes per nonzero sum beat 2 per element.
  const std::vector<uint64_t> nonzero(host + layout.all_nonzero, host + layout.all_nonzero + ranks);
  const GatherPlan gather = plan_gather(edges_, nonzero);
  const std::vector<bool>& dense = gather.dense;
  const std::vector<uint64_t>& gather_offsets = gather.offsets;
  if (gather_offsets[ranks] > gather_capacity_)
    throw std::logic_error("sparse collective: " + std::to_string(gather_offsets[ranks]) +
                           " entries to gather, more than the bound " + std::to_string(gather_capacity_));
  if (!dense[me] && nonzero[me] > 0) {
    detail::compact_slice(stage_, begin, end, tile_offsets_, gathered_indices_ + gather_offsets[me],
                          gathered_values_ + gather_offsets[me], stream);
    if (bucketed) {  // this slice alone: its edges and a base of 0 after the ranks' edges and bases
      unsigned long long* one = host_bucket_meta_ + 2 * (ranks + 1);
      one[0] = begin;
      one[1] = end;
      one[2] = 0;
      one[3] = 0;
      FUSEKIT_CUDA_CHECK(
          cudaMemcpyAsync(bucket_meta_ + 2 * (ranks + 1), one, 4 * sizeof *one, cudaMemcpyHostToDevice, stream));
      FUSEKIT_CUDA_CHECK(
          cudaMemsetAsync(gathered_counts_ + bucket_base[me], 0, buckets[me] * sizeof(unsigned), stream));
      detail::bucket_encode(gathered_indices_ + gather_offsets[me], nonzero[me], bucket_meta_ + 2 * (ranks + 1),
                            bucket_meta_ + 2 * (ranks + 1) + 2, 1, gathered_low_ + gather_offsets[me],
                            gathered_counts_ + bucket_base[me], stream);
    }
  }
  FUSEKIT_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < ranks; ++r) {
    const uint64_t length = edges_[r + 1] - edges_[r];
    if (dense[r] && length > 0) {
      FUSEKIT_NCCL_CHECK(ncclBroadcast(stage_ + edges_[r], stage_ + edges_[r], length, ncclFloat16, r, comm, stream));
    } else if (!dense[r] && nonzero[r] > 0) {
      if (bucketed) {
        FUSEKIT_NCCL_CHECK(ncclBroadcast(gathered_low_ + gather_offsets[r], gathered_low_ + gather_offsets[r],
                                         nonzero[r], ncclFloat16, r, comm, stream));
        FUSEKIT_NCCL_CHECK(ncclBroadcast(gathered_counts_ + bucket_base[r], gathered_counts_ + bucket_base[r],
                                         buckets[r], ncclUint32, r, comm, stream));
      } else {
        FUSEKIT_NCCL_CHECK(ncclBroadcast(gathered_indices_ + gather_offsets[r], gathered_indices_ + gather_offsets[r],
                                         nonzero[r], ncclUint32, r, comm, stream));
      }
      FUSEKIT_NCCL_CHECK(ncclBroadcast(gathered_values_ + gather_offsets[r], gathered_values_ + gather_offsets[r],
                                       nonzero[r], ncclFloat16, r, comm, stream));
    }
  }
  FUSEKIT_NCCL_CHECK(ncclGroupEnd());
  if (bucketed) {
    for (int r = 0; r < ranks; ++r) {
      if (r == me || dense[r] || nonzero[r] == 0) continue;
      const int slice_buckets = static_cast<int>(buckets[r]);
      detail::bucket_scan(gathered_counts_ + bucket_base[r], slice_buckets, gathered_starts_ + bucket_base[r],
                          scan_totals_ + r, stream);
      detail::bucket_decode(gathered_low_ + gather_offsets[r], nonzero[r], gathered_starts_ + bucket_base[r],
                            slice_buckets, edges_[r], gathered_indices_ + gather_offsets[r], stream);
    }
  }
  for (int r = 0; r < ranks; ++r) {
    if (r == me) continue;  // the owner's slice is in out already
    if (dense[r]) {
      detail::widen(stage_, edges_[r], edges_[r + 1], wire, out, stream);
    } else {
      detail::scatter(gathered_indices_ + gather_offsets[r], gathered_values_ + gather_offsets[r], nonzero[r], wire,
                      out, stream);
    }
  }

  double gather_bytes = gather.bytes;
  if (bucketed) {  // the entry slices in the bucketed form (the choice of form stays the 6-byte one)
    gather_bytes = 0;
    for (int r = 0; r < ranks; ++r) {
      const uint64_t length = edges_[r + 1] - edges_[r];
      gather_bytes += dense[r]         ? 2.0 * static_cast<double>(length)
                      : nonzero[r] > 0 ? bucketed_bytes(nonzero[r], length)
                                       : 0.0;
    }
  }
  stats.gather_bytes = allgather_bus_bytes(gather_bytes, ranks);
  stats.dense_slices = gather.dense_slices;
  stats.result_entries = gather.entries;
  stats.bytes_sent = stats.metadata_bytes + stats.reduce_scatter_bytes + stats.gather_bytes;
  stats.received = plan.partition.loads;
  stats.imbalance = plan.partition.imbalance;
  return stats;
}

ExchangeStats dense_allreduce(Communicator& communicator, void* buffer, uint64_t elements, kernels::DType dtype) {
  FUSEKIT_NCCL_CHECK(
      ncclAllReduce(buffer, buffer, elements, nccl_type(dtype), ncclSum, communicator.comm(), communicator.stream()));
  ExchangeStats stats;
  stats.gather_bytes =
      allreduce_bus_bytes(static_cast<double>(elements) * kernels::dtype_size(dtype), communicator.size());
  stats.bytes_sent = stats.gather_bytes;
  stats.received.assign(communicator.size(), elements);
  return stats;
}

}  // namespace fusekit::dp
