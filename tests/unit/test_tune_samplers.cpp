// The tuner's search space and samplers: reproducibility, TPE and GP-EI against random search, the GP's gradients, pending trials.
#include <catch2/catch.hpp>

#include "tune_support.hpp"
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "mltrain/config/study.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/tune/analysis.hpp"
#include "mltrain/tune/functions.hpp"
#include "mltrain/tune/journal.hpp"
#include "mltrain/tune/pareto.hpp"
#include "mltrain/tune/pruner.hpp"
#include "mltrain/tune/sampler.hpp"
#include "mltrain/tune/study.hpp"

using namespace mltrain::tune;

TEST_CASE("search space: unit mapping, snapping, log ints, categoricals", "[tune]") {
  auto lr = Param::floating("lr", 1e-4, 1e-1, true);
  CHECK(lr.from_unit(0.0) == Approx(1e-4));
  CHECK(lr.from_unit(1.0) == Approx(1e-1));
  CHECK(lr.from_unit(0.5) == Approx(std::sqrt(1e-4 * 1e-1)));
  CHECK(lr.to_unit(lr.from_unit(0.3)) == Approx(0.3));
  auto bs = Param::integer("bs", 16, 256, false, 16);
  CHECK(bs.snap(40) == 48);  // (40 - 16) / 16 = 1.5 -> round half away from zero: 2 steps
  CHECK(bs.snap(1000) == 256);
  CHECK(bs.to_json(48.0) == 48);
  auto st = Param::floating("p", 0.0, 1.0, false, 0.25);
  CHECK(st.grid_values() == std::vector<double>{0, 0.25, 0.5, 0.75, 1.0});
  auto c = Param::categorical("opt", {"adam", "sgd", 3});
  CHECK(c.to_json(1.0) == "sgd");
  CHECK(c.from_json(3) == 2.0);
  CHECK_THROWS_AS(c.from_json("rmsprop"), std::invalid_argument);
  CHECK_THROWS_AS(lr.from_json(0.5), std::invalid_argument);
  // log-uniform ints: small values more likely than large ones, every value legal
  auto li = Param::integer("n", 1, 100, true);
  std::mt19937_64 rng(1);
  int small = 0;
  for (int i = 0; i < 4000; ++i) {
    const double v = li.sample(rng);
    REQUIRE(v == std::round(v));
    REQUIRE(v >= 1);
    REQUIRE(v <= 100);
    small += v <= 10;
  }
  CHECK(small > 1700);  // log-uniform: ~50 % at or below 10 (uniform would give 10 %)
}

static double run_sampler(const std::string& name, const TestFunction& f, int trials,
                          uint64_t seed) {
  SamplerOptions o;
  o.name = name;
  auto s = make_sampler(o, f.space);
  std::vector<Observation> h;
  double best = INFINITY;
  for (int n = 0; n < trials; ++n) {
    const auto x = *s->sample(f.space, h, seed, n);
    const double v = f.f(x);
    best = std::min(best, v);
    h.push_back({n, x, v, false, false});
  }
  return best - f.minimum;
}

TEST_CASE("samplers: reproducible from the seed, grid visits each point once", "[tune]") {
  const auto& f = *find_test_function("branin");
  for (const char* name : {"random", "tpe", "gp"}) {
    INFO(name);
    CHECK(run_sampler(name, f, 15, 4) == run_sampler(name, f, 15, 4));
    CHECK(run_sampler(name, f, 15, 4) != run_sampler(name, f, 15, 5));
  }
  Space g = {Param::floating("a", 0, 1, false, 0.5), Param::categorical("b", {"x", "y"})};
  auto grid = make_sampler({"grid"}, g);
  std::set<std::vector<double>> seen;
  for (int n = 0; n < 6; ++n) seen.insert(*grid->sample(g, {}, 0, n));
  CHECK(seen.size() == 6);
  CHECK_FALSE(grid->sample(g, {}, 0, 6).has_value());
  CHECK_THROWS_AS(make_sampler({"grid"}, {Param::floating("c", 0, 1)}), std::invalid_argument);
}

TEST_CASE("TPE and GP-EI beat random search on Branin and Hartmann-6", "[tune]") {
  // Medians over 5 seeds; the full 20-seed comparison with Optuna is scripts/bench/tune/run.sh.
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (const char* fn : {"branin", "hartmann6"}) {
    const auto& f = *find_test_function(fn);
    std::vector<double> r, t, g;
    for (uint64_t s = 0; s < 5; ++s) {
      r.push_back(run_sampler("random", f, 50, s));
      t.push_back(run_sampler("tpe", f, 50, s));
      if (std::string(fn) == "branin") g.push_back(run_sampler("gp", f, 40, s));
    }
    INFO(fn << ": random " << median(r) << " tpe " << median(t));
    CHECK(median(t) < median(r));
    if (!g.empty()) CHECK(median(g) < 1e-2);  // GP-EI finds a Branin minimum in 40 evaluations
  }
}

TEST_CASE("TPE's bad-group widths: Optuna 5.0's neighbour rule, value for value", "[tune]") {
  // Golden: optuna 5.0.0's _ParzenEstimator on FloatDistribution(0, 1) with these observations
  // (its defaults: magic clip, no endpoints), the sigmas of its mixture, prior last.
  const std::vector<std::pair<std::vector<double>, std::vector<double>>> table = {
      {{0.2}, {0.8, 1.0}},
      {{0.1, 0.5, 0.55, 0.9}, {0.4, 0.4, 0.35, 0.35, 1.0}},
      {{0.3, 0.31, 0.32, 0.33, 0.34, 0.35, 0.36, 0.9},  // the clip: 1 / (8 + 2)
       {0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.54, 0.54, 1.0}},
      {{0.7, 0.1}, {0.6, 0.6, 1.0}},  // any order
      {{}, {1.0}},
  };
  for (const auto& [centres, want] : table) {
    const auto got = detail::tpe_neighbour_widths(centres);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-12));
  }
}

TEST_CASE("GP: marginal-likelihood gradient matches finite differences; EI by hand", "[tune]") {
  detail::GpModel m;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> U(0, 1);
  for (int i = 0; i < 12; ++i) {
    m.X.push_back({U(rng), U(rng)});
    m.y.push_back(std::sin(6 * m.X.back()[0]) + m.X.back()[1]);
  }
  m.log_ls = {std::log(0.3), std::log(0.7)};
  m.log_amp = 0.2, m.log_noise = std::log(1e-3);
  REQUIRE(m.factor());
  std::vector<double> g;
  m.log_marginal_likelihood(&g);
  REQUIRE(g.size() == 4);
  auto at = [&](int k, double d) {
    detail::GpModel c = m;
    double* p = k < 2 ? &c.log_ls[size_t(k)] : k == 2 ? &c.log_amp : &c.log_noise;
    *p += d;
    REQUIRE(c.factor());
    return c.log_marginal_likelihood(nullptr);
  };
  for (int k = 0; k < 4; ++k)
    CHECK(g[size_t(k)] == Approx((at(k, 1e-5) - at(k, -1e-5)) / 2e-5).epsilon(1e-4).margin(1e-6));
  // A fitted GP interpolates its (noise-free) data.
  detail::GpModel f;
  f.fit(m.X, m.y, 1);
  double mean, sd;
  f.predict(m.X[4], mean, sd);
  CHECK(mean == Approx(m.y[4]).margin(1e-2));
  CHECK(sd < 0.05);
  // EI(mean 0, sd 1, best 0) = phi(0) = 1/sqrt(2 pi); improvement 1 at sd 1: Phi(1) + phi(1)
  CHECK(detail::expected_improvement(0, 1, 0, 0) == Approx(0.3989422804));
  CHECK(detail::expected_improvement(-1, 1, 0, 0) == Approx(0.8413447461 + 0.2419707245));
}

TEST_CASE("GP fit: a warm start at the optimum stays there; an extra start only adds", "[tune]") {
  std::mt19937_64 rng(11);
  std::vector<std::vector<double>> X;
  std::vector<double> y;
  unit_cube_data(
      rng, 30, [](const auto& x) { return std::sin(6 * x[0]) + x[1] * x[1] - 0.5 * x[2]; }, X, y);
  auto lml = [](const detail::GpModel& m) { return m.log_marginal_likelihood(nullptr); };
  detail::GpModel fresh;  // the default and two random starts, 60 iterations each
  fresh.fit(X, y, 3);
  const auto opt = fresh.theta();
  // From its own optimum the warm start stops on L-BFGS-B's tests within 1 % of it (a flat
  // direction, a length scale of ~14, may still creep).
  detail::GpModel warm;
  warm.fit(X, y, 4, &opt);
  for (size_t k = 0; k < opt.size(); ++k) CHECK(warm.theta()[k] == Approx(opt[k]).margin(0.01));
  CHECK(lml(warm) >= lml(fresh) - 1e-6);
  // From a poor warm start (the tiniest length scales, the most noise), 30 iterations end 0.16
  // below the fresh fit; either added start (fitted while the warm one is only evaluated, the
  // better kept) ends higher.
  std::vector<double> poor(5, std::log(0.01));
  poor[3] = std::log(0.05), poor[4] = std::log(0.1);
  detail::GpModel alone;
  alone.fit(X, y, 5, &poor);
  CHECK(lml(alone) < lml(fresh) - 0.1);
  for (auto restart : {detail::GpModel::Restart::prior, detail::GpModel::Restart::random}) {
    detail::GpModel added;
    added.fit(X, y, 5, &poor, restart);
    CHECK(lml(added) > lml(alone) + 0.05);
    // A good warm start survives a restart that finds worse: evaluated, it is kept.
    detail::GpModel kept;
    kept.fit(X, y, 6, &opt, restart);
    CHECK(lml(kept) >= lml(fresh) - 1e-6);
  }
}

TEST_CASE("GP: posterior and log-EI gradients match finite differences", "[tune]") {
  detail::GpModel m;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> U(0, 1);  // the test points after the data
  std::vector<std::vector<double>> X;
  std::vector<double> y;
  unit_cube_data(
      rng, 15, [](const auto& x) { return std::sin(5 * x[0]) * x[1] - x[2]; }, X, y);
  m.fit(X, y, 2);
  for (int trial = 0; trial < 5; ++trial) {
    const std::vector<double> x = {U(rng), U(rng), U(rng)};
    double mean, sd;
    std::vector<double> dm, ds;
    m.predict_grad(x, mean, sd, dm, ds);
    double m2, s2;
    m.predict(x, m2, s2);
    CHECK(mean == Approx(m2).epsilon(1e-12));
    CHECK(sd == Approx(s2).epsilon(1e-9));
    for (size_t d = 0; d < 3; ++d) {
      auto xp = x, xm = x;
      xp[d] += 1e-6, xm[d] -= 1e-6;
      double mp, sp, mm, sm;
      m.predict(xp, mp, sp), m.predict(xm, mm, sm);
      CHECK(dm[d] == Approx((mp - mm) / 2e-6).epsilon(1e-4).margin(1e-6));
      CHECK(ds[d] == Approx((sp - sm) / 2e-6).epsilon(1e-4).margin(1e-6));
    }
  }
  // d log EI / d mean and / d sd, in the body and in the Mills-ratio tail (z < -6).
  for (const auto& [mean, sd] :
       std::vector<std::pair<double, double>>{{0.3, 0.5}, {-1, 0.2}, {5, 0.5}}) {
    double gm, gs;
    detail::log_ei(mean, sd, 0.0, 0.0, &gm, &gs);
    const double h = 1e-6;
    CHECK(gm == Approx((detail::log_ei(mean + h, sd, 0, 0) - detail::log_ei(mean - h, sd, 0, 0)) /
                       (2 * h))
                    .epsilon(1e-4));
    CHECK(gs == Approx((detail::log_ei(mean, sd + h, 0, 0) - detail::log_ei(mean, sd - h, 0, 0)) /
                       (2 * h))
                    .epsilon(1e-4));
  }
}

TEST_CASE("GP kernel's exponential: within 2 ulp of std::exp on [-700, 0]", "[tune]") {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> U(-700, 0), V(-1, 0);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = i % 2 ? U(rng) : V(rng) * std::pow(10.0, -(i % 17));  // near 0 too
    const double want = std::exp(x);
    worst = std::max(worst, std::abs(detail::exp_nonpositive(x) - want) / want);
  }
  for (double x : {0.0, -0.0, -1e-300, -std::log(2.0), -0.5 * std::log(2.0), -700.0}) {
    const double want = std::exp(x);
    worst = std::max(worst, std::abs(detail::exp_nonpositive(x) - want) / want);
  }
  INFO("worst relative error " << worst);
  CHECK(worst <= 2 * std::numeric_limits<double>::epsilon());
  CHECK(detail::exp_nonpositive(0.0) == 1.0);
  CHECK(detail::exp_nonpositive(-5000.0) == detail::exp_nonpositive(-700.0));  // clamped
  CHECK(detail::exp_nonpositive(-5000.0) < 1e-300);
}

TEST_CASE("GP: the vectorised Cholesky, likelihood gradient and posterior are the plain loops'",
          "[tune]") {
  // 37 points (not a multiple of the vector widths or of the four rows done at once) and 70
  // predictions (two blocks of 32 and a short one): the speed-ups reorder independent sums only,
  // never one sum's terms, so every value is bitwise the plain loops'.
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> U(0, 1);
  std::vector<std::vector<double>> X;
  std::vector<double> y;
  unit_cube_data(
      rng, 37, [](const auto& x) { return std::cos(4 * x[0]) + x[1] * x[2]; }, X, y);
  detail::GpModel m;
  m.fit(X, y, 4);
  const size_t n = m.X.size();
  std::vector<double> K = m.L;  // rebuild K from the kernel, factor it one row at a time
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j <= i; ++j) {
      const double r2 = m.scaled_r2(m.X[i], m.X[j].data()), r = std::sqrt(r2);
      K[i * n + j] = std::exp(m.log_amp) * (1 + std::sqrt(5.0) * r + 5.0 / 3.0 * r2) *
                         detail::exp_nonpositive(-std::sqrt(5.0) * r) +
                     (i == j ? std::exp(m.log_noise) + 1e-10 : 0.0);
    }
  for (size_t j = 0; j < n; ++j) {
    double s = K[j * n + j];
    for (size_t k = 0; k < j; ++k) s -= K[j * n + k] * K[j * n + k];
    K[j * n + j] = std::sqrt(s);
    for (size_t i = j + 1; i < n; ++i) {
      double v = K[i * n + j];
      for (size_t k = 0; k < j; ++k) v -= K[i * n + k] * K[j * n + k];
      K[i * n + j] = v / K[j * n + j];
    }
  }
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j <= i; ++j) differ += K[i * n + j] != m.L[i * n + j];
  CHECK(differ == 0);
  std::vector<std::vector<double>> pts(70);
  for (auto& p : pts) p = {U(rng), U(rng), U(rng)};
  std::vector<double> mean, sd;
  m.predict_many(pts, mean, sd);
  REQUIRE(mean.size() == pts.size());
  for (size_t c = 0; c < pts.size(); ++c) {
    double m1, s1;
    m.predict(pts[c], m1, s1);
    CHECK(mean[c] == m1);
    CHECK(sd[c] == s1);
  }
  // The likelihood's gradient against the plain loops: L^-1 column by column, K^-1 by dot
  // products of those columns, the gradient summed pair by pair.
  std::vector<double> col(n * n, 0.0);  // column j of L^-1 at col[j * n ..]
  for (size_t j = 0; j < n; ++j)
    for (size_t i = j; i < n; ++i) {
      double v = i == j ? 1.0 : 0.0;
      for (size_t k = j; k < i; ++k) v -= m.L[i * n + k] * col[j * n + k];
      col[j * n + i] = v / m.L[i * n + i];
    }
  const size_t D = m.log_ls.size();
  const double amp = std::exp(m.log_amp), noise = std::exp(m.log_noise);
  std::vector<double> want(D + 2, 0.0), t2(D);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j <= i; ++j) {
      double kinv = 0;
      for (size_t k = i; k < n; ++k) kinv += col[i * n + k] * col[j * n + k];
      const double w = m.alpha[i] * m.alpha[j] - kinv, mult = i == j ? 0.5 : 1.0;
      double r2 = 0;
      for (size_t d = 0; d < D; ++d) {
        const double t = (m.X[i][d] - m.X[j][d]) * std::exp(-m.log_ls[d]);
        t2[d] = t * t;
        r2 += t2[d];
      }
      const double r = std::sqrt(r2), e = detail::exp_nonpositive(-std::sqrt(5.0) * r);
      const double kk = amp * (1.0 + std::sqrt(5.0) * r + 5.0 / 3.0 * r2) * e;
      const double base = amp * 5.0 / 3.0 * (1.0 + std::sqrt(5.0) * r) * e;
      for (size_t d = 0; d < D; ++d) want[d] += mult * w * base * t2[d];
      want[D] += mult * w * kk;
      if (i == j) want[D + 1] += 0.5 * w * noise;
    }
  for (size_t d = 0; d < D; ++d) want[d] += -(m.log_ls[d] - std::log(0.5)) / (1.5 * 1.5);
  want[D] += -(m.log_amp - 0.0) / (1.5 * 1.5);
  std::vector<double> got;
  m.log_marginal_likelihood(&got);
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < want.size(); ++k) CHECK(got[k] == want[k]);
}

// The point a sampler suggests next with `running` pending, for pending = liar or ignore.

static std::vector<double> suggest_with_pending(const std::string& name, const std::string& pending,
                                                const TestFunction& f,
                                                std::vector<Observation> hist, int number) {
  SamplerOptions o;
  o.name = name;
  o.pending = pending;
  return *make_sampler(o, f.space)->sample(f.space, hist, 0, number);
}

static double unit_distance(const Space& space, const std::vector<double>& a,
                            const std::vector<double>& b) {
  double s = 0;
  for (size_t d = 0; d < space.size(); ++d) {
    const double t = space[d].to_unit(a[d]) - space[d].to_unit(b[d]);
    s += t * t;
  }
  return std::sqrt(s);
}

TEST_CASE("pending trials: GP kriging believer and TPE constant liar spread concurrent suggestions",
          "[tune]") {
  const auto& f = *find_test_function("branin");
  std::vector<Observation> hist;
  {
    SamplerOptions o;
    o.name = "random";
    auto r = make_sampler(o, f.space);
    for (int n = 0; n < 20; ++n) {
      const auto x = *r->sample(f.space, hist, 7, n);
      hist.push_back({n, x, f.f(x), false, false});
    }
  }
  // GP: the point it would suggest is already running. Ignored, it is suggested again (a
  // duplicate); believed, EI vanishes there and the next suggestion is elsewhere.
  const auto first = suggest_with_pending("gp", "liar", f, hist, 20);
  auto with_running = hist;
  with_running.push_back({20, first, 0.0, false, true});
  const auto naive = suggest_with_pending("gp", "ignore", f, with_running, 21);
  const auto believer = suggest_with_pending("gp", "liar", f, with_running, 21);
  INFO("first " << first[0] << "," << first[1] << " naive " << naive[0] << "," << naive[1]
                << " believer " << believer[0] << "," << believer[1]);
  CHECK(unit_distance(f.space, naive, first) < 0.01);
  CHECK(unit_distance(f.space, believer, first) > 0.02);
  // TPE: three trials running near the good group's centre. As liars they join the bad group, so
  // the suggestions (20 numbers) keep further from them on average.
  std::vector<Observation> sorted = hist;
  std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.value < b.value; });
  auto tpe_hist = hist;
  for (int k = 0; k < 3; ++k) tpe_hist.push_back({20 + k, sorted[size_t(k)].x, 0.0, false, true});
  double liar = 0, ignore = 0;
  for (int n = 23; n < 43; ++n) {
    const auto a = suggest_with_pending("tpe", "liar", f, tpe_hist, n);
    const auto b = suggest_with_pending("tpe", "ignore", f, tpe_hist, n);
    double da = INFINITY, db = INFINITY;
    for (int k = 0; k < 3; ++k) {
      da = std::min(da, unit_distance(f.space, a, sorted[size_t(k)].x));
      db = std::min(db, unit_distance(f.space, b, sorted[size_t(k)].x));
    }
    liar += da / 20, ignore += db / 20;
  }
  INFO("mean distance to a running trial: liar " << liar << " ignore " << ignore);
  CHECK(liar > 1.5 * ignore);
}

// Replays a study journal: for each create record, the trials running at that moment.
