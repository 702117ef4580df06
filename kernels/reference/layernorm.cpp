#include "kernels/reference/layernorm.h"

#include <cmath>

namespace fusekit::reference {

LayerNormForward layernorm_forward(const std::vector<double>& x, const std::vector<double>& gamma,
                                   const std::vector<double>& beta, int rows, int columns, double eps) {
  LayerNormForward out{std::vector<double>(x.size()), std::vector<double>(rows), std::vector<double>(rows)};
  for (int r = 0; r < rows; ++r) {
    const double* xr = &x[static_cast<size_t>(r) * columns];
    double mean = 0;
    for (int c = 0; c < columns; ++c) mean += xr[c];
    mean /= columns;
    double var = 0;
    for (int c = 0; c < columns; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= columns;
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < columns; ++c)
      out.y[static_cast<size_t>(r) * columns + c] = (xr[c] - mean) * rstd * gamma[c] + beta[c];
    out.mean[r] = mean;
    out.rstd[r] = rstd;
  }
  return out;
}

LayerNormBackward layernorm_backward(const std::vector<double>& dy, const std::vector<double>& x,
                                     const std::vector<double>& gamma, int rows, int columns, double eps) {
  const LayerNormForward f = layernorm_forward(x, gamma, std::vector<double>(columns, 0.0), rows, columns, eps);
  LayerNormBackward out{std::vector<double>(x.size()), std::vector<double>(columns), std::vector<double>(columns)};
  std::vector<double> xhat(columns), g(columns);
  for (int r = 0; r < rows; ++r) {
    const size_t offset = static_cast<size_t>(r) * columns;
    double mean_g = 0, mean_gx = 0;
    for (int c = 0; c < columns; ++c) {
      xhat[c] = (x[offset + c] - f.mean[r]) * f.rstd[r];
      g[c] = dy[offset + c] * gamma[c];
      mean_g += g[c];
      mean_gx += g[c] * xhat[c];
      out.dgamma[c] += dy[offset + c] * xhat[c];
      out.dbeta[c] += dy[offset + c];
    }
    mean_g /= columns;
    mean_gx /= columns;
    for (int c = 0; c < columns; ++c) out.dx[offset + c] = f.rstd[r] * (g[c] - mean_g - xhat[c] * mean_gx);
  }
  return out;
}

}  // namespace fusekit::reference
