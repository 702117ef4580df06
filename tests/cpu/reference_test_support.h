// Helpers the float64 reference tests share (CPU only).
#pragma once

#include <cstddef>
#include <random>
#include <vector>

namespace fusekit::test {

// n values offset + scale * N(0, 1).
inline std::vector<double> random_vector(size_t n, std::mt19937_64& rng, double scale = 1.0, double offset = 0.0) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = offset + scale * normal(rng);
  return v;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace fusekit::test
