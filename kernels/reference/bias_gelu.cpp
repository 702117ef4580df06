#include "kernels/reference/bias_gelu.h"

#include <cmath>

namespace fusekit::reference {
namespace {

constexpr double kPi = 3.14159265358979323846;

double gelu(double z, bool tanh_approximation) {
  if (!tanh_approximation) return 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
  return 0.5 * z * (1 + std::tanh(std::sqrt(2 / kPi) * (z + 0.044715 * z * z * z)));
}

double gelu_grad(double z, bool tanh_approximation) {
  if (!tanh_approximation)
    return 0.5 * (1 + std::erf(z / std::sqrt(2.0))) + z * std::exp(-0.5 * z * z) / std::sqrt(2 * kPi);
  const double k = std::sqrt(2 / kPi), t = std::tanh(k * (z + 0.044715 * z * z * z));
  return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k * (1 + 3 * 0.044715 * z * z);
}

}  // namespace

std::vector<double> bias_gelu_forward(const std::vector<double>& x, const std::vector<double>& bias, int rows,
                                      int columns, bool tanh_approximation) {
  std::vector<double> y(x.size());
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < columns; ++c) {
      const size_t i = static_cast<size_t>(r) * columns + c;
      y[i] = gelu(x[i] + bias[c], tanh_approximation);
    }
  }
  return y;
}

BiasGeluBackward bias_gelu_backward(const std::vector<double>& dy, const std::vector<double>& x,
                                    const std::vector<double>& bias, int rows, int columns, bool tanh_approximation) {
  BiasGeluBackward out{std::vector<double>(x.size()), std::vector<double>(columns, 0.0)};
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < columns; ++c) {
      const size_t i = static_cast<size_t>(r) * columns + c;
      out.dx[i] = dy[i] * gelu_grad(x[i] + bias[c], tanh_approximation);
      out.dbias[c] += out.dx[i];
    }
  }
  return out;
}

}  // namespace fusekit::reference
