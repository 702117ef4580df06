#include "kernels/reference/bias_dropout_residual_layernorm.h"

#include <cstddef>

#include "kernels/detail/philox.cuh"
#include "kernels/reference/layernorm.h"

namespace fusekit::reference {
namespace {

std::vector<double> residual_sum(const std::vector<double>& x, const std::vector<double>& bias,
                                 const std::vector<double>& residual, const std::vector<double>& multipliers, int rows,
                                 int columns) {
  std::vector<double> h(x.size());
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < columns; ++c) {
      const size_t i = static_cast<size_t>(r) * columns + c;
      h[i] = residual[i] + (x[i] + bias[c]) * multipliers[i];
    }
  }
  return h;
}

}  // namespace

std::vector<double> dropout_multipliers(int rows, int columns, float p, uint64_t seed, uint64_t offset) {
  const uint32_t threshold = kernels::dropout_threshold(p);
  const double scale = 1.0 / (1.0 - static_cast<double>(p));
  std::vector<double> m(static_cast<size_t>(rows) * columns);
  for (size_t i = 0; i < m.size(); ++i) m[i] = kernels::dropout_kept(seed, offset, i, threshold) ? scale : 0.0;
  return m;
}

BiasDropoutResidualLayerNormForward bias_dropout_residual_layernorm_forward(
    const std::vector<double>& x, const std::vector<double>& bias, const std::vector<double>& residual,
    const std::vector<double>& gamma, const std::vector<double>& beta, const std::vector<double>& multipliers, int rows,
    int columns, double eps) {
  BiasDropoutResidualLayerNormForward out;
  out.h = residual_sum(x, bias, residual, multipliers, rows, columns);
  LayerNormForward ln = layernorm_forward(out.h, gamma, beta, rows, columns, eps);
  out.y = std::move(ln.y);
  out.mean = std::move(ln.mean);
  out.rstd = std::move(ln.rstd);
  return out;
}

BiasDropoutResidualLayerNormBackward bias_dropout_residual_layernorm_backward(
    const std::vector<double>& dy, const std::vector<double>& dh_extra, const std::vector<double>& h,
    const std::vector<double>& gamma, const std::vector<double>& multipliers, int rows, int columns, double eps) {
  LayerNormBackward ln = layernorm_backward(dy, h, gamma, rows, columns, eps);
  BiasDropoutResidualLayerNormBackward out;
  out.dresidual = std::move(ln.dx);
  if (!dh_extra.empty()) {
    for (size_t i = 0; i < out.dresidual.size(); ++i) out.dresidual[i] += dh_extra[i];
  }
  out.dx.resize(out.dresidual.size());
  out.dbias.assign(columns, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < columns; ++c) {
      const size_t i = static_cast<size_t>(r) * columns + c;
      out.dx[i] = out.dresidual[i] * multipliers[i];
      out.dbias[c] += out.dx[i];
    }
  }
  out.dgamma = std::move(ln.dgamma);
  out.dbeta = std::move(ln.dbeta);
  return out;
}

}  // namespace fusekit::reference
