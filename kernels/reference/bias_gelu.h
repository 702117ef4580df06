// Float64 reference of bias + GELU forward and backward (the math is in kernels/bias_gelu.h).
#pragma once

#include <vector>

namespace fusekit::reference {

// tanh_approximation: PyTorch's approximate="tanh"; otherwise the exact erf form.
std::vector<double> bias_gelu_forward(const std::vector<double>& x, const std::vector<double>& bias, int rows,
                                      int columns, bool tanh_approximation);

struct BiasGeluBackward {
  std::vector<double> dx, dbias;
};

BiasGeluBackward bias_gelu_backward(const std::vector<double>& dy, const std::vector<double>& x,
                                    const std::vector<double>& bias, int rows, int columns, bool tanh_approximation);

}  // namespace fusekit::reference
