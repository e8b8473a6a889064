#pragma once
// Shared by the samplers' sources (sampler.cpp: random, grid and make_sampler; sampler_tpe.cpp;
// sampler_gp.cpp): the normal distribution's helpers and each sampler's factory.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "mltrain/tune/sampler.hpp"

namespace mltrain::tune::sampling {

inline constexpr double kSqrt2 = 1.4142135623730951;
inline constexpr double kLogSqrt2Pi = 0.91893853320467274;
inline double norm_cdf(double z) { return 0.5 * std::erfc(-z / kSqrt2); }
inline double norm_logpdf(double z) { return -0.5 * z * z - kLogSqrt2Pi; }
inline double logsumexp(const std::vector<double>& v) {
  double m = -std::numeric_limits<double>::infinity();
  for (double x : v) m = std::max(m, x);
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (double x : v) s += std::exp(x - m);
  return m + std::log(s);
}

std::unique_ptr<Sampler> make_tpe(const SamplerOptions& opt);
std::unique_ptr<Sampler> make_gp(const SamplerOptions& opt, const Space& space);

}  // namespace mltrain::tune::sampling
