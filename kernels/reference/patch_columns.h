// Float64 reference of the patch columns (the map is in kernels/patch_columns.h).
#pragma once

#include <vector>

namespace fusekit::reference {

// images [batch, channels, height, width] -> columns [batch x (height / patch) x (width / patch),
// channels x patch x patch].
std::vector<double> patch_columns_forward(const std::vector<double>& images, int batch, int channels, int height,
                                          int width, int patch);

}  // namespace fusekit::reference
