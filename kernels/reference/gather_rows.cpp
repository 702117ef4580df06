#include "kernels/reference/gather_rows.h"

#include <cmath>
#include <cstddef>

namespace fusekit::reference {

std::vector<double> gather_rows_forward(const std::vector<double>& src, const std::vector<int32_t>& indices,
                                        int rows_in, int columns) {
  std::vector<double> dst(indices.size() * static_cast<size_t>(columns), std::nan(""));
  for (size_t j = 0; j < indices.size(); ++j) {
    const int32_t r = indices[j];
    if (r < 0 || r >= rows_in) continue;
    for (int c = 0; c < columns; ++c) dst[j * columns + c] = src[static_cast<size_t>(r) * columns + c];
  }
  return dst;
}

std::vector<double> gather_rows_backward(const std::vector<double>& dy, const std::vector<int32_t>& indices,
                                         int rows_in, int columns) {
  std::vector<double> dsrc(static_cast<size_t>(rows_in) * columns, 0.0);
  for (size_t j = 0; j < indices.size(); ++j) {
    const int32_t r = indices[j];
    if (r < 0 || r >= rows_in) continue;
    for (int c = 0; c < columns; ++c) dsrc[static_cast<size_t>(r) * columns + c] += dy[j * columns + c];
  }
  return dsrc;
}

}  // namespace fusekit::reference
