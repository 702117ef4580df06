// Float64 reference of LayerNorm forward and backward (the math is in kernels/layernorm.h).
#pragma once

#include <vector>

namespace fusekit::reference {

struct LayerNormForward {
  std::vector<double> y, mean, rstd;
};

LayerNormForward layernorm_forward(const std::vector<double>& x, const std::vector<double>& gamma,
                                   const std::vector<double>& beta, int rows, int columns, double eps);

struct LayerNormBackward {
  std::vector<double> dx, dgamma, dbeta;
};

LayerNormBackward layernorm_backward(const std::vector<double>& dy, const std::vector<double>& x,
                                     const std::vector<double>& gamma, int rows, int columns, double eps);

}  // namespace fusekit::reference
