#include "kernels/reference/patch_columns.h"

#include <cstddef>

namespace fusekit::reference {

std::vector<double> patch_columns_forward(const std::vector<double>& images, int batch, int channels, int height,
                                          int width, int patch) {
  const int grid_h = height / patch, grid_w = width / patch, k = channels * patch * patch;
  std::vector<double> columns(static_cast<size_t>(batch) * grid_h * grid_w * k);
  size_t o = 0;
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < grid_h; ++i) {
      for (int j = 0; j < grid_w; ++j) {
        for (int c = 0; c < channels; ++c) {
          for (int y = 0; y < patch; ++y) {
            for (int x = 0; x < patch; ++x) {
              columns[o++] =
                  images[((static_cast<size_t>(b) * channels + c) * height + i * patch + y) * width + j * patch + x];
            }
          }
        }
      }
    }
  }
  return columns;
}

}  // namespace fusekit::reference
