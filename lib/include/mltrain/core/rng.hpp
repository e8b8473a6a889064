#pragma once
// SplitMix64 (Steele et al. 2014): tiny, well mixed, identical on every platform, unlike the
// std:: distributions. Used wherever a draw must be a pure function of a key (sample order,
// augmentation), so results do not depend on threads or order.
//
//   SplitMix r{key_of(seed, epoch)};  r.below(n);  r.uniform(-1, 1);  r.beta(0.2, 0.2);
#include <cmath>
#include <cstdint>

namespace mltrain {

struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) {  // unbiased (Lemire's rejection)
    uint64_t x = next();
    __uint128_t m = static_cast<__uint128_t>(x) * n;
    uint64_t l = static_cast<uint64_t>(m);
    if (l < n) {
      const uint64_t t = -n % n;
      while (l < t) {
        x = next();
        m = static_cast<__uint128_t>(x) * n;
        l = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double a, double b) { return a + (b - a) * uniform(); }
  double gamma(double k) {  // Marsaglia-Tsang, with the k < 1 boost
    if (k < 1) return gamma(k + 1) * std::pow(uniform() + 1e-300, 1.0 / k);
    const double d = k - 1.0 / 3, c = 1 / std::sqrt(9 * d);
    for (;;) {
      double x, v;
      do {
        const double u1 = uniform() + 1e-300, u2 = uniform();
        x = std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
        v = 1 + c * x;
      } while (v <= 0);
      v = v * v * v;
      const double u = uniform();
      if (u < 1 - 0.0331 * x * x * x * x || std::log(u) < 0.5 * x * x + d * (1 - v + std::log(v)))
        return d * v;
    }
  }
  double beta(double a, double b) {
    const double x = gamma(a), y = gamma(b);
    return x / (x + y);
  }
};

// Combines a seed with a key into a new stream seed.
inline uint64_t stream_seed(uint64_t seed, uint64_t key) {
  SplitMix r{seed * 0x100000001B3ull ^ (key + 0x51ED270B27ull)};
  return r.next();
}

}  // namespace mltrain
