#include "mltrain/tune/pruner.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace mltrain::tune {
namespace {

double percentile_of(std::vector<double> v, double p) {  // linear interpolation (numpy's default)
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

class NoPruner : public Pruner {
 public:
  bool should_prune(const TrialCurve&, const std::vector<TrialCurve>&) const override {
    return false;
  }
};

// The reports' noise: the residual standard deviation of each complete trial's latter half around
// a least-squares quadratic in the report number (the trend of a learning curve's tail is smooth;
// what a quadratic cannot follow is noise), median over the trials.
double residual_sd(const std::vector<double>& y) {
  const size_t n = y.size();
  if (n < 5) return NAN;
  // Normal equations for y ~ a + b t + c t^2, t scaled to [-1, 1] so that the moments stay of
  // the order of n however long the curve (3 x 3, solved by Cramer's rule).
  const double tc = double(n - 1) / 2.0;
  double s[5] = {0, 0, 0, 0, 0}, r[3] = {0, 0, 0};
  for (size_t i = 0; i < n; ++i) {
    const double t = (double(i) - tc) / tc;
    double p = 1;
    for (int e = 0; e < 5; ++e, p *= t) s[e] += p;
    r[0] += y[i], r[1] += t * y[i], r[2] += t * t * y[i];
  }
  const double m[3][3] = {{s[0], s[1], s[2]}, {s[1], s[2], s[3]}, {s[2], s[3], s[4]}};
  auto det = [](const double a[3][3]) {
    return a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) -
           a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0]) +
           a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]);
  };
  const double d = det(m);
  double coef[3];
  for (int c = 0; c < 3; ++c) {
    double mc[3][3];
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) mc[i][j] = j == c ? r[i] : m[i][j];
    coef[c] = det(mc) / d;
  }
  double rss = 0;
  for (size_t i = 0; i < n; ++i) {
    const double t = (double(i) - tc) / tc, e = y[i] - (coef[0] + coef[1] * t + coef[2] * t * t);
    rss += e * e;
  }
  return std::sqrt(rss / double(n - 3));
}

double report_noise(const std::vector<const TrialCurve*>& curves) {
  std::vector<double> per_trial;
  for (const auto* t : curves) {
    std::vector<double> tail;
    for (size_t j = t->values.size() / 2; j < t->values.size(); ++j)
      if (std::isfinite(t->values[j])) tail.push_back(t->values[j]);
    const double sd = residual_sd(tail);
    if (std::isfinite(sd)) per_trial.push_back(sd);
  }
  return per_trial.empty() ? 0.0 : percentile_of(per_trial, 50);
}

class PercentilePruner : public Pruner {
 public:
  // Good finishers: within percentile * kGoodShare of the finals (the median: the best quarter),
  // and never fewer than kMinGood trials; a trial is pruned when it is worse than all of them by
  // more than kNoiseMargin times the reports' noise. Chosen on seeds 0-19 of
  // scripts/bench/tune/curves.py: share 0.5 against 0.75 and 1; at least 2 good finishers
  // against 1 (with one, only a new best could complete, and with 4 running the study ratcheted
  // onto its first good trial: 0.1188 against 0.1045); margin 0.5 against 0, 0.75 and 1 (0 pruned
  // trials better than the best on one report's noise; 1 spent up to 1.5x Optuna's steps).
  static constexpr double kGoodShare = 0.5;
  static constexpr size_t kMinGood = 2;
  static constexpr double kNoiseMargin = 0.5;
  explicit PercentilePruner(PrunerOptions o) : o_(std::move(o)) {}
  bool should_prune(const TrialCurve& me, const std::vector<TrialCurve>& others) const override {
    const size_t k = me.values.size();
    if (k == 0 || int(k) <= o_.n_warmup_steps) return false;
    // The reference: complete trials whose final value is within the percentile (the "good
    // finishers"). A trial is pruned when its best value so far is worse than every good finisher
    // was at this report by more than the reports' noise: it can no longer follow any of their
    // curves. Where curves keep their order this is about the percentile of the values at the
    // report (Optuna's rule); where they cross (a slow start, a better end) the good finishers'
    // own early values set the bar.
    std::vector<const TrialCurve*> complete;
    std::vector<double> finals;
    for (const auto& t : others) {
      if (t.number == me.number || !t.complete || t.values.empty()) continue;
      complete.push_back(&t);
      if (std::isfinite(t.values.back())) finals.push_back(t.values.back());
    }
    if (int(complete.size()) < o_.n_startup_trials || finals.empty()) return false;
    std::sort(finals.begin(), finals.end());
    const double cut = std::max(percentile_of(finals, o_.percentile * kGoodShare),
                                finals[std::min(kMinGood, finals.size()) - 1]);
    double bar = -INFINITY;
    for (const auto* t : complete)
      if (t->values.back() <= cut && t->values.size() >= k && std::isfinite(t->values[k - 1]))
        bar = std::max(bar, t->values[k - 1]);
    if (!std::isfinite(bar)) return false;  // no good finisher reported this far
    double best = INFINITY;
    for (double v : me.values) best = std::min(best, v);
    if (!std::isfinite(best)) return true;  // a NaN curve never recovers
    if (best <= bar) return false;  // the noise costs a pass over every curve: only when needed
    return best > bar + kNoiseMargin * report_noise(complete);
  }

 private:
  PrunerOptions o_;
};

// Asynchronous successive halving over one set of trials. A trial is judged when its report count
// reaches a rung: it continues when its value there ranks within the top floor(n / eta) (at least
// one) of the n trials that reached that rung so far, itself included.
class AshaPruner : public Pruner {
 public:
  AshaPruner(PrunerOptions o, int bracket = -1) : o_(std::move(o)), bracket_(bracket) {}
  bool should_prune(const TrialCurve& me, const std::vector<TrialCurve>& others) const override {
    const int eta = static_cast<int>(std::max<int64_t>(2, o_.reduction_factor));
    const int b =
        bracket_ >= 0 ? bracket_ : (o_.name == "hyperband" ? hyperband_bracket(o_, me.number) : 0);
    const int64_t r0 = int64_t(o_.min_resource) * int64_t(std::pow(eta, b));
    // Rungs at r0 * eta^j reports past the first (the first report is the start line: a trial's
    // value after one evaluation says least about where it ends; Optuna's steps count the same
    // way, from 0).
    const int64_t k = int64_t(me.values.size());
    if (k - 1 < r0) return false;
    int64_t rung = r0;
    while (rung * eta <= k - 1) rung *= eta;
    if (rung != k - 1) return false;  // judged only when a rung is reached
    if (o_.max_resource > 0 && k >= o_.max_resource) return false;
    std::vector<double> at;
    for (const auto& t : others) {
      if (t.number == me.number) continue;
      if (o_.name == "hyperband" && hyperband_bracket(o_, t.number) != b) continue;
      if (int64_t(t.values.size()) >= k) at.push_back(t.values[size_t(k - 1)]);
    }
    const double mine = me.values[size_t(k - 1)];
    if (!std::isfinite(mine)) return true;
    at.push_back(mine);
    std::sort(at.begin(), at.end());
    const size_t top = std::max<size_t>(1, at.size() / size_t(eta));
    return mine > at[top - 1];  // promoted when in the top 1/eta at this rung
  }

 private:
  PrunerOptions o_;
  int bracket_;
};

}  // namespace

int hyperband_bracket(const PrunerOptions& o, int trial_number) {
  const int eta = static_cast<int>(std::max<int64_t>(2, o.reduction_factor));
  const int64_t max_r =
      o.max_resource > 0 ? o.max_resource : 27 * std::max<int64_t>(1, o.min_resource);
  int n = 1;  // brackets: min_resource * eta^b <= max_resource
  while (std::max<int64_t>(1, o.min_resource) * int64_t(std::pow(eta, n)) <= max_r) ++n;
  // Trials spread over brackets in proportion to each bracket's share of the budget (Li et al.:
  // bracket b starts ~eta^(s-b) / (s-b+1) times as many trials), deterministically by number.
  std::vector<double> w;
  double total = 0;
  for (int b = 0; b < n; ++b) {
    w.push_back(std::pow(eta, n - 1 - b) / double(n - b));
    total += w.back();
  }
  const double u = std::fmod(double(trial_number) * 0.6180339887498949, 1.0) * total;
  double acc = 0;
  for (int b = 0; b < n; ++b) {
    acc += w[size_t(b)];
    if (u < acc) return b;
  }
  return n - 1;
}

std::unique_ptr<Pruner> make_pruner(const PrunerOptions& o) {
  if (o.name == "none") return std::make_unique<NoPruner>();
  if (o.name == "median") {
    auto m = o;
    m.percentile = 50;
    return std::make_unique<PercentilePruner>(m);
  }
  if (o.name == "percentile") return std::make_unique<PercentilePruner>(o);
  if (o.name == "asha") return std::make_unique<AshaPruner>(o, 0);
  if (o.name == "hyperband") return std::make_unique<AshaPruner>(o);
  throw std::invalid_argument("unknown pruner '" + o.name +
                              "' (use none, median, percentile, asha or hyperband)");
}

}  // namespace mltrain::tune
