// Float64 reference of bias + dropout + residual + LayerNorm, forward and backward (the math is in
// kernels/bias_dropout_residual_layernorm.h), with the dropout mask regenerated from the same
// Philox stream the kernels draw (kernels/detail/philox.cuh).
#pragma once

#include <cstdint>
#include <vector>

namespace fusekit::reference {

// m[r * columns + c] = kept / (1 - p): 0 for dropped elements, 1 / (1 - p) for kept ones.
std::vector<double> dropout_multipliers(int rows, int columns, float p, uint64_t seed, uint64_t offset);

struct BiasDropoutResidualLayerNormForward {
  std::vector<double> h, y, mean, rstd;
};

// h = residual + (x + bias) * m, y = LayerNorm(h): the same for both orders (pre-LN writes h too).
BiasDropoutResidualLayerNormForward bias_dropout_residual_layernorm_forward(
    const std::vector<double>& x, const std::vector<double>& bias, const std::vector<double>& residual,
    const std::vector<double>& gamma, const std::vector<double>& beta, const std::vector<double>& multipliers, int rows,
    int columns, double eps);

struct BiasDropoutResidualLayerNormBackward {
  std::vector<double> dx, dresidual, dbias, dgamma, dbeta;
};

// From h, the forward's (post-LN: recomputed; pre-LN: as written). dh_extra: empty for none (post-LN),
// else [rows, columns] added to dh (pre-LN).
BiasDropoutResidualLayerNormBackward bias_dropout_residual_layernorm_backward(
    const std::vector<double>& dy, const std::vector<double>& dh_extra, const std::vector<double>& h,
    const std::vector<double>& gamma, const std::vector<double>& multipliers, int rows, int columns, double eps);

}  // namespace fusekit::reference
