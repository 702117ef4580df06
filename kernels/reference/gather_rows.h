// Float64 reference of the row gather and its backward (the math is in kernels/gather_rows.h).
// Row-major: src and dsrc [rows_in, columns], dst and dy [indices.size(), columns].
#pragma once

#include <cstdint>
#include <vector>

namespace fusekit::reference {

// dst[j, :] = src[indices[j], :]; NaN across row j where indices[j] is outside [0, rows_in).
std::vector<double> gather_rows_forward(const std::vector<double>& src, const std::vector<int32_t>& indices,
                                        int rows_in, int columns);

// The forward's gradient: dsrc[r, :] = sum of dy[j, :] over the j with indices[j] == r (0 for rows
// no index names); a row j whose index is out of range contributes nothing. For distinct indices,
// which the kernel requires, the sum has at most one term: the kernel's scatter.
std::vector<double> gather_rows_backward(const std::vector<double>& dy, const std::vector<int32_t>& indices,
                                         int rows_in, int columns);

}  // namespace fusekit::reference
