// Float64 reference of the mean over tokens (the math is in kernels/token_mean.h).
#pragma once

#include <vector>

namespace fusekit::reference {

// x [batch, tokens, features] -> y [batch, features].
std::vector<double> token_mean_forward(const std::vector<double>& x, int batch, int tokens, int features);
// dy [batch, features] -> dx [batch, tokens, features].
std::vector<double> token_mean_backward(const std::vector<double>& dy, int batch, int tokens, int features);

}  // namespace fusekit::reference
