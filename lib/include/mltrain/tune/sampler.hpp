#pragma once
// Samplers of `mltrain tune`. Each is a pure function of (space, finished trials, seed, trial
// number): the next point comes from an RNG seeded by (seed, number), so a resumed study samples
// exactly what an uninterrupted one would have (for one worker; with several, the history a
// trial sees depends on timing, as in every parallel tuner).
//
//   SamplerOptions o; o.name = "tpe"; auto s = make_sampler(o, space);
//   auto x = s->sample(space, history, /*seed=*/0, /*number=*/12);   // nullopt: grid exhausted
//
// Samplers minimise: the study negates values when the direction is maximize.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mltrain/config/study.hpp"
#include "mltrain/tune/space.hpp"

namespace mltrain::tune {

struct Observation {
  int number = 0;
  std::vector<double> x;
  double value = 0;      // lower is better; a pruned trial's last intermediate value
  bool pruned = false;   // stopped early: ranked after every complete trial by TPE
  bool running = false;  // started, no value yet (pending: see SamplerOptions::pending)
  int64_t reports = 0;   // intermediate values reported (ranks pruned trials: further is better)
  std::vector<double> values;  // several objectives (lower is better each); value = values[0]
};

// The study file's sampler settings (config/study.hpp declares each once, with its default and
// check), plus what only the tuner sets.
//   random (tpe) / Latin-hypercube (gp) trials before the model is used: n_startup.
//   TPE (Bergstra et al. 2011): l(x)/g(x) over n_candidates draws from l; gamma is the share of
//   trials in the "good" group (capped at 25 trials). The multivariate estimator's bandwidth is
//   Scott's rule on the good trials' spread per dimension (floor 0.1 of the range), so it narrows
//   as they cluster; defaults chosen on 40 seeds of the benchmark functions (scripts/bench/tune/).
//   GP-EI: Matern-5/2 ARD kernel, hyperparameters by marginal likelihood; xi is EI's exploration
//   offset, in standardised units.
//   pending: "liar" puts running trials in the model so that concurrent suggestions spread out.
//   TPE ranks them after every finished trial (a constant liar at the worst value, in the bad
//   group, as Optuna's constant_liar); GP-EI adds them at the model's predicted mean (kriging
//   believer, Ginsbourger et al. 2010), which makes their neighbourhood's EI vanish. "ignore":
//   left out.
struct SamplerOptions : config::SamplerSettings {
  double prior_weight = 1.0;  // TPE: the prior's weight among the Parzen components
};

class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual std::optional<std::vector<double>> sample(const Space& space,
                                                    const std::vector<Observation>& history,
                                                    uint64_t seed, int number) = 0;
  virtual std::string name() const = 0;
};

// Throws std::invalid_argument for an unknown name or a space the sampler cannot handle (the grid
// sampler needs every continuous float to list `grid` values or a `step`).
std::unique_ptr<Sampler> make_sampler(const SamplerOptions& opt, const Space& space);

// Exposed for tests.
namespace detail {
uint64_t seed_for(uint64_t seed, int number);
// TPE's g(x) widths in one unit-cube dimension for the given centres (any order), the prior's
// (1) appended: the larger gap to a neighbour or an edge, the outermost centres measured inward,
// at least 1 / min(100, n + 2).
std::vector<double> tpe_neighbour_widths(const std::vector<double>& centres);
// Matern-5/2 GP on points in the unit cube: fit hyperparameters, predict mean and sd.
struct GpModel {
  std::vector<std::vector<double>> X;
  std::vector<double> y;  // standardised
  std::vector<double> log_ls;
  double log_amp = 0, log_noise = -9;
  std::vector<double> L, alpha;  // Cholesky factor (row-major n x n) and K^-1 y
  std::vector<double> LT;        // L transposed (row j = column j of L), set by factor()
  std::vector<double> ke;        // exp(-sqrt(5) r) of each pair i >= j [i * n + j], set by factor()
  std::vector<double> ils;       // exp(-log_ls), set by factor()
  std::vector<double> Xt;        // X by coordinate [d * n + i], set by factor()
  double log_marginal_likelihood(
      std::vector<double>* grad) const;  // at the current hyperparameters
  bool factor();                         // false when K is not positive definite
  // Hyperparameters by marginal likelihood: from `warm` (a previous fit's theta: log length
  // scales, log amplitude, log noise) when given; when `restart` says so, one more start (the
  // default theta or a random one) is fitted instead and `warm` only evaluated, the better kept;
  // without `warm`, from the default and two random starts.
  // Beyond kFitPoints observations they are fitted on a subset (the best half and the latest
  // half), and the model then conditions on every point.
  static constexpr size_t kFitPoints = 64;
  enum class Restart { none, prior, random };
  void fit(const std::vector<std::vector<double>>& X, const std::vector<double>& y, uint64_t seed,
           const std::vector<double>* warm = nullptr, Restart restart = Restart::none);
  std::vector<double> theta() const;
  void predict(const std::vector<double>& x, double& mean, double& sd) const;
  // predict() at many points, bitwise the same values, several points per pass over L.
  void predict_many(const std::vector<std::vector<double>>& xs, std::vector<double>& mean,
                    std::vector<double>& sd) const;
  // The same for m points stored one after another (m x the points' width doubles).
  void predict_many(const double* xs, size_t m, std::vector<double>& mean,
                    std::vector<double>& sd) const;
  double scaled_r2(const std::vector<double>& x, const double* xi) const;
  // predict() with the gradients of mean and sd over x (dmean, dsd resized to x's size).
  void predict_grad(const std::vector<double>& x, double& mean, double& sd,
                    std::vector<double>& dmean, std::vector<double>& dsd) const;
};
double expected_improvement(double mean, double sd, double best, double xi);
// e^x for the kernel's x <= 0, without libm (vectorisable), within 2 ulp of std::exp; x below
// -700 gives e^-700.
double exp_nonpositive(double x);
// log EI, accurate far into the tail; with d/dmean and d/dsd when asked.
double log_ei(double mean, double sd, double best, double xi, double* dmean = nullptr,
              double* dsd = nullptr);
}  // namespace detail

}  // namespace mltrain::tune
