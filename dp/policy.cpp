// The exchange policy's cost model (see policy.h for the formulas).
#include "dp/policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace fusekit::dp {
namespace {

double collective_seconds(const Link& link, double bus_bytes) { return link.latency + bus_bytes / link.bus_bandwidth; }

std::string format_seconds(double s) {
  char text[32];
  if (s >= 1e-3)
    std::snprintf(text, sizeof text, "%.3g ms", s * 1e3);
  else
    std::snprintf(text, sizeof text, "%.3g us", s * 1e6);
  return text;
}

}  // namespace

ExchangeDecision choose_exchange(const Link& link, int ranks, uint64_t elements, kernels::DType dtype, double density,
                                 const SelectionCost& selection) {
  if (ranks < 1) throw std::invalid_argument("policy: ranks must be >= 1");
  if (!(density > 0 && density <= 1)) throw std::invalid_argument("policy: density must be in (0, 1]");
  if (!(link.bus_bandwidth > 0) || link.latency < 0) throw std::invalid_argument("policy: bad link figures");
  ExchangeDecision d;
  d.k = selected_entries(elements, density);
  d.encoding = choose_encoding(elements, d.k);
  const double P = ranks;
  const double gradient_bytes = static_cast<double>(elements) * static_cast<double>(kernels::dtype_size(dtype));
  char inputs[200];
  std::snprintf(
      inputs, sizeof inputs, "%llu %s elements at density %g (k = %llu), %d ranks, %.3g GB/s bus bandwidth, %s latency",
      static_cast<unsigned long long>(elements), kernels::dtype_name(dtype), density,
      static_cast<unsigned long long>(d.k), ranks, link.bus_bandwidth / 1e9, format_seconds(link.latency).c_str());
  if (ranks == 1 || elements == 0) {
    d.reason = std::string("dense: nothing to exchange (") + inputs + ")";
    return d;
  }
  d.dense_bytes_per_rank = gradient_bytes * 2 * (P - 1) / P;
  d.dense_seconds = collective_seconds(link, d.dense_bytes_per_rank);

  const double entry_bytes = static_cast<double>(kLayerHeaderBytes + payload_bytes_bound(d.encoding, elements, d.k));
  const double reduce_scatter_bytes = entry_bytes * (P - 1) / P;
  const uint64_t slice = (elements + ranks - 1) / ranks;
  const uint64_t union_entries = std::min<uint64_t>(d.k * ranks, elements);
  const uint64_t slice_entries = std::min<uint64_t>((union_entries + ranks - 1) / ranks, slice);
  const double slice_bytes =
      std::min(static_cast<double>(kLayerHeaderBytes +
                                   payload_bytes_bound(choose_encoding(slice, slice_entries), slice, slice_entries)),
               static_cast<double>(slice * kWireValueBytes));
  const double allgather_bytes = slice_bytes * P * (P - 1) / P;
  d.selection_seconds = selection.seconds_fixed + selection.seconds_per_byte * gradient_bytes;
  d.reduce_scatter_seconds = collective_seconds(link, reduce_scatter_bytes);
  d.allgather_seconds = collective_seconds(link, allgather_bytes);
  d.sparse_seconds = d.selection_seconds + d.reduce_scatter_seconds + d.allgather_seconds;
  d.sparse_bytes_per_rank = reduce_scatter_bytes + allgather_bytes;
  d.sparse = d.sparse_seconds < d.dense_seconds;

  std::string sparse_part = std::string("sparse ") + encoding_name(d.encoding) + " " +
                            format_seconds(d.sparse_seconds) + " (selection " + format_seconds(d.selection_seconds) +
                            ", reduce-scatter " + format_seconds(d.reduce_scatter_seconds) + ", allgather " +
                            format_seconds(d.allgather_seconds) + ")";
  std::string dense_part = "dense allreduce " + format_seconds(d.dense_seconds);
  if (d.sparse) {
    d.reason = sparse_part + " < " + dense_part + ": " + inputs;
  } else {
    const bool latency_bound = 2 * link.latency + selection.seconds_fixed >= d.dense_seconds;
    d.reason = dense_part + " <= " + sparse_part + (latency_bound ? ", latency-bound: " : ": ") + inputs;
  }
  return d;
}

double warmup_density(int64_t step, int64_t warmup_steps, double start, double final) {
  if (!(start > 0 && final > 0)) throw std::invalid_argument("policy: densities must be > 0");
  if (warmup_steps <= 0 || step >= warmup_steps) return final;
  const double t = static_cast<double>(std::max<int64_t>(step, 0)) / static_cast<double>(warmup_steps);
  return start * std::pow(final / start, t);
}

}  // namespace fusekit::dp
