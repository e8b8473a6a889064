// Samplers: random and grid here, TPE in sampler_tpe.cpp, GP-EI in sampler_gp.cpp.
#include "mltrain/tune/sampler.hpp"

#include "mltrain/tune/pareto.hpp"
#include "sampler_common.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace mltrain::tune {
namespace detail {

uint64_t seed_for(uint64_t seed, int number) {  // SplitMix64 of (seed, number)
  uint64_t z = seed * 0x9E3779B97F4A7C15ULL + uint64_t(number) + 0x632BE59BD9B4E019ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace detail
namespace {
using namespace sampling;

// ---- random and grid -------------------------------------------------------------------------

class RandomSampler : public Sampler {
 public:
  std::optional<std::vector<double>> sample(const Space& space, const std::vector<Observation>&,
                                            uint64_t seed, int number) override {
    std::mt19937_64 rng(detail::seed_for(seed, number));
    std::vector<double> x;
    for (const auto& p : space) x.push_back(p.sample(rng));
    return x;
  }
  std::string name() const override { return "random"; }
};

// Trial n takes the n-th point of a seeded permutation of the full grid (mixed-radix decoding),
// so every point is visited once, in an order that does not favour the first parameter.
class GridSampler : public Sampler {
 public:
  explicit GridSampler(const Space& space) {
    for (const auto& p : space) {
      values_.push_back(p.grid_values());
      if (values_.back().empty())
        throw std::invalid_argument(
            "the grid sampler needs `grid: [...]` or a `step` for continuous parameter '" + p.name +
            "'");
      total_ *= values_.back().size();
      if (total_ > 10'000'000)
        throw std::invalid_argument(
            "the grid has more than 10 million points; use tpe, gp or random");
    }
  }
  std::optional<std::vector<double>> sample(const Space&, const std::vector<Observation>&,
                                            uint64_t seed, int number) override {
    if (size_t(number) >= total_) return std::nullopt;
    if (order_.empty()) {
      order_.resize(total_);
      std::iota(order_.begin(), order_.end(), size_t{0});
      std::mt19937_64 rng(detail::seed_for(seed, -1));
      std::shuffle(order_.begin(), order_.end(), rng);
    }
    size_t k = order_[size_t(number)];
    std::vector<double> x;
    for (const auto& v : values_) {
      x.push_back(v[k % v.size()]);
      k /= v.size();
    }
    return x;
  }
  std::string name() const override { return "grid"; }

 private:
  std::vector<std::vector<double>> values_;
  size_t total_ = 1;
  std::vector<size_t> order_;
};

}  // namespace

std::unique_ptr<Sampler> make_sampler(const SamplerOptions& opt, const Space& space) {
  if (opt.name == "random") return std::make_unique<RandomSampler>();
  if (opt.name == "grid") return std::make_unique<GridSampler>(space);
  if (opt.name == "tpe") return sampling::make_tpe(opt);
  if (opt.name == "gp") return sampling::make_gp(opt, space);
  throw std::invalid_argument("unknown sampler '" + opt.name + "' (use grid, random, tpe or gp)");
}

}  // namespace mltrain::tune
