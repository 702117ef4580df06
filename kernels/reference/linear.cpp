#include "kernels/reference/linear.h"

#include <cmath>

namespace fusekit::reference {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kCubic = 0.044715;

// out[r, c] = sum_i a[r, i] b[c, i]: a [rows, inner], b [columns, inner], row-major.
std::vector<double> matmul_transposed(const std::vector<double>& a, const std::vector<double>& b, int rows, int columns,
                                      int inner) {
  std::vector<double> out(static_cast<size_t>(rows) * columns);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < columns; ++c) {
      double sum = 0;
      for (int i = 0; i < inner; ++i)
        sum += a[static_cast<size_t>(r) * inner + i] * b[static_cast<size_t>(c) * inner + i];
      out[static_cast<size_t>(r) * columns + c] = sum;
    }
  }
  return out;
}

// out[r, c] = sum_i a[r, i] b[i, c]: a [rows, inner], b [inner, columns], row-major.
std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int rows, int columns,
                           int inner) {
  std::vector<double> out(static_cast<size_t>(rows) * columns, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < inner; ++i) {
      const double v = a[static_cast<size_t>(r) * inner + i];
      for (int c = 0; c < columns; ++c)
        out[static_cast<size_t>(r) * columns + c] += v * b[static_cast<size_t>(i) * columns + c];
    }
  }
  return out;
}

}  // namespace

double gelu_tanh(double z) { return 0.5 * z * (1 + std::tanh(std::sqrt(2 / kPi) * (z + kCubic * z * z * z))); }

double gelu_tanh_grad(double z) {
  const double k = std::sqrt(2 / kPi), t = std::tanh(k * (z + kCubic * z * z * z));
  return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k * (1 + 3 * kCubic * z * z);
}

LinearForward linear_forward(const std::vector<double>& x, const std::vector<double>& weight,
                             const std::vector<double>& bias, int rows, int out_features, int in_features, bool gelu) {
  LinearForward out;
  out.pre = matmul_transposed(x, weight, rows, out_features, in_features);
  for (size_t i = 0; i < out.pre.size(); ++i) out.pre[i] += bias[i % out_features];
  out.y = out.pre;
  if (gelu) {
    for (double& v : out.y) v = gelu_tanh(v);
  }
  return out;
}

LinearBackward linear_backward(const std::vector<double>& dy, const std::vector<double>& x,
                               const std::vector<double>& weight, int rows, int out_features, int in_features) {
  LinearBackward out;
  out.dx = matmul(dy, weight, rows, in_features, out_features);
  // dW [N, K] = dy^T x: transpose dy once, then a plain product.
  std::vector<double> dy_t(dy.size());
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < out_features; ++c)
      dy_t[static_cast<size_t>(c) * rows + r] = dy[static_cast<size_t>(r) * out_features + c];
  }
  out.dweight = matmul(dy_t, x, out_features, in_features, rows);
  out.dbias.assign(out_features, 0.0);
  for (size_t i = 0; i < dy.size(); ++i) out.dbias[i % out_features] += dy[i];
  return out;
}

LinearBackward linear_weight_gradient(const std::vector<double>& dy, const std::vector<double>& x,
                                      const std::vector<double>& dweight_in, int rows, int out_features,
                                      int in_features) {
  LinearBackward out;
  out.dweight =
      dweight_in.empty() ? std::vector<double>(static_cast<size_t>(out_features) * in_features, 0.0) : dweight_in;
  out.dbias.assign(out_features, 0.0);
  for (int r = 0; r < rows; ++r) {
    const double* x_row = x.data() + static_cast<size_t>(r) * in_features;
    for (int n = 0; n < out_features; ++n) {
      const double g = dy[static_cast<size_t>(r) * out_features + n];
      out.dbias[n] += g;
      double* dw_row = out.dweight.data() + static_cast<size_t>(n) * in_features;
      for (int k = 0; k < in_features; ++k) dw_row[k] += g * x_row[k];
    }
  }
  return out;
}

GeluBackwardInput linear_gelu_backward_input(const std::vector<double>& dz, const std::vector<double>& weight_next,
                                             const std::vector<double>& pre, int rows, int next_features,
                                             int features) {
  GeluBackwardInput out;
  out.dpre = matmul(dz, weight_next, rows, features, next_features);
  out.dbias.assign(features, 0.0);
  for (size_t i = 0; i < out.dpre.size(); ++i) {
    out.dpre[i] *= gelu_tanh_grad(pre[i]);
    out.dbias[i % features] += out.dpre[i];
  }
  return out;
}

}  // namespace fusekit::reference
