// The tuner: search space, samplers, pruners, the study journal and driver (no LibTorch). The
// driver tests run the real mltrain binary on command trials (shell scripts) and kill it with SIGKILL.
#include <catch2/catch.hpp>

#include "temp_dir.hpp"
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

namespace fs = std::filesystem;
using namespace mltrain::tune;

static const std::string kBin = MLTRAIN_BIN;

static fs::path tmpdir(const std::string& name) {
  return mltrain::testing::fresh_temp_dir("tune_" + name);
}

// n points uniform in the unit cube (3-D, drawn in order from rng) and f at each.
template <class F>
static void unit_cube_data(std::mt19937_64& rng, int n, F f, std::vector<std::vector<double>>& X,
                           std::vector<double>& y) {
  std::uniform_real_distribution<double> U(0, 1);
  for (int i = 0; i < n; ++i) {
    X.push_back({U(rng), U(rng), U(rng)});
    y.push_back(f(X.back()));
  }
}

static int sh(const std::string& cmd) {
  const int s = std::system(cmd.c_str());
  return WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
}

static void write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

TEST_CASE(
    "journal: incremental reads skip a torn line, see other writers, start over after a truncation",
    "[tune]") {
  const fs::path dir = fs::temp_directory_path() / "mltrain_test_journal";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path p = dir / "journal.jsonl";
  using J = nlohmann::json;
  Journal a(p), b(p);  // two drivers on one study
  a.append({J{{"n", 1}}, J{{"n", 2}}});
  REQUIRE(a.read().size() == 2);
  { std::ofstream(p, std::ios::app) << R"({"n": 3, "torn)"; }  // a writer killed mid-line
  CHECK(a.read().size() == 2);                                 // no newline yet: not a record
  CHECK(b.read().size() == 2);
  b.append({J{{"n", 4}}});  // terminates the torn line first
  const auto& seen = a.read();
  REQUIRE(seen.size() == 3);
  CHECK(seen.back()["n"] == 4);
  size_t in_transaction = 0;
  a.transact([&](const std::vector<J>& recs) {
    in_transaction = recs.size();
    return std::vector<J>{J{{"n", 5}}};
  });
  CHECK(in_transaction == 3);
  CHECK(b.read().size() == 4);
  // The file as a fresh reader sees it: the same records, the torn line dropped.
  Journal c(p);
  CHECK(c.read() == b.read());
  // Replaced by hand with a shorter file: readers start over instead of reading past its end.
  {
    std::ofstream(p, std::ios::trunc) << R"({"n": 9})"
                                      << "\n";
  }
  REQUIRE(a.read().size() == 1);
  CHECK(a.read()[0]["n"] == 9);
  fs::remove_all(dir);
}

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
  // below the fresh fit; either added start (the best of the two kept) ends higher.
  std::vector<double> poor(5, std::log(0.01));
  poor[3] = std::log(0.05), poor[4] = std::log(0.1);
  detail::GpModel alone;
  alone.fit(X, y, 5, &poor);
  CHECK(lml(alone) < lml(fresh) - 0.1);
  for (auto restart : {detail::GpModel::Restart::prior, detail::GpModel::Restart::random}) {
    detail::GpModel added;
    added.fit(X, y, 5, &poor, restart);
    CHECK(lml(added) > lml(alone) + 0.05);
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
static std::vector<int> running_at_each_create(const fs::path& journal) {
  std::ifstream in(journal);
  std::string line;
  std::set<int> running;
  std::vector<int> counts;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["op"] == "create") {
      counts.push_back(int(running.size()));
      running.insert(j["trial"].get<int>());
    } else if (j["op"] == "finish") {
      running.erase(j["trial"].get<int>());
    }
  }
  return counts;
}

TEST_CASE("tune driver: in-process functions run as on max_concurrent workers; curves are pruned",
          "[tune][driver]") {
  const auto d = tmpdir("concurrent");
  const std::string base =
      kBin + " tune " + MLTRAIN_SOURCE_DIR + "/configs/tune/branin.yaml -q study.dir=" + d.string();
  REQUIRE(sh(base + " objective.function=hartmann6 sampler.name=gp study.n_trials=12 "
                    "study.max_concurrent=4 study.name=gp4") == 0);
  const auto counts = running_at_each_create(d / "gp4" / "journal.jsonl");
  REQUIRE(counts.size() == 12);
  for (size_t i = 0; i < counts.size(); ++i) CHECK(counts[i] == std::min<int>(int(i), 3));
  // A learning-curve function: 27 reports per complete trial; the median pruner stops some early.
  REQUIRE(sh(base + " objective.function=curves_crossing sampler.name=tpe study.n_trials=30 "
                    "pruner.name=median study.name=curves") == 0);
  const auto cfg = study_config_from_folder((d / "curves").string());
  int pruned = 0, complete = 0;
  for (const auto& t : read_trials(d / "curves", cfg.space)) {
    if (t.state == "COMPLETE") {
      ++complete;
      CHECK(t.intermediate.size() == 27);
      CHECK(t.value == Approx(find_test_function("curves_crossing")->f(t.x)));
    } else {
      CHECK(t.state == "PRUNED");
      CHECK(t.intermediate.size() < 27);
      ++pruned;
    }
  }
  CHECK(complete + pruned == 30);
  CHECK(pruned > 0);
}

TEST_CASE("pruners: accept/reject tables", "[tune]") {
  // Values are minimised. Four complete trials; D starts slowest and ends best (crossing curves).
  std::vector<TrialCurve> done = {{0, true, true, {1.0, 0.8, 0.6}},
                                  {1, true, true, {2.0, 1.5, 1.2}},
                                  {2, true, true, {3.0, 2.0, 1.8}},
                                  {3, true, true, {4.0, 1.0, 0.3}}};
  PrunerOptions o;
  o.name = "median";
  o.n_startup_trials = 4;
  auto med = make_pruner(o);
  // The good finishers: final value within the 25th percentile of finals (half the median's 50),
  // at least two: [0.3, 0.6, 1.2, 1.8] -> 0.525, D alone, so D and A. A trial is pruned when its
  // best so far is worse than every good finisher was at the same report (three reports are too
  // few to measure the noise: no margin).
  CHECK_FALSE(med->should_prune({9, false, false, {3.5}}, done));  // <= D's 4.0 (Optuna: > 2.5)
  CHECK(med->should_prune({9, false, false, {3.5, 1.2}}, done));   // best 1.2 > D's 1.0, A's 0.8
  CHECK_FALSE(med->should_prune({9, false, false, {3.5, 0.9}}, done));
  CHECK_FALSE(med->should_prune({9, false, false, {3.5, 1.0}}, done));        // equal is kept
  CHECK_FALSE(med->should_prune({9, false, false, {3.5, 1.0, 0.55}}, done));  // <= A's 0.6
  CHECK(med->should_prune({9, false, false, {3.5, 1.0, 0.65}}, done));
  CHECK(med->should_prune({9, false, false, {NAN}}, done));  // a NaN curve never recovers
  // Pruned trials do not form the reference: only complete ones do (as in Optuna).
  auto with_pruned = done;
  with_pruned.push_back({4, true, false, {0.1, 0.1}});
  CHECK(med->should_prune({9, false, false, {3.5, 1.2}}, with_pruned));
  o.n_startup_trials = 5;
  CHECK_FALSE(make_pruner(o)->should_prune({9, false, false, {3.5, 1.2}},
                                           with_pruned));  // 4 complete trials: not enough yet
  // The noise margin: half the median residual sd of the complete trials' latter halves around a
  // quadratic. E and F: +-0.1 alternating (E on a linear trend), sd 0.135224680756 each (numpy
  // polyfit, degree 2, ddof 3); G is smooth (0). Good finishers F (0.4) and E (0.45); margin
  // 0.0676.
  std::vector<TrialCurve> noisy(3);
  for (int t = 0; t < 10; ++t) {
    const double alt = t % 2 == 0 ? 0.1 : -0.1;
    noisy[0].values.push_back(1.0 + alt - 0.05 * t);
    noisy[1].values.push_back(0.5 + alt);
    noisy[2].values.push_back(2.0);
  }
  for (int i = 0; i < 3; ++i) noisy[size_t(i)].number = i, noisy[size_t(i)].complete = true;
  o.n_startup_trials = 3;
  auto noisy_med = make_pruner(o);
  CHECK_FALSE(noisy_med->should_prune({9, false, false, {1.16}}, noisy));  // E's 1.1 + 0.0676
  CHECK(noisy_med->should_prune({9, false, false, {1.17}}, noisy));
  CHECK_FALSE(noisy_med->should_prune({9, false, false, {2.0, 0.9}}, noisy));  // E's 0.85 + margin
  CHECK(noisy_med->should_prune({9, false, false, {2.0, 0.95}}, noisy));
  // A long curve (2001 reports, a steep quadratic trend): the fit stays well conditioned. numpy:
  // the latter half's residual sd is 0.10014988796753764, so the margin 0.0500749.
  std::vector<TrialCurve> long_curves(3);
  for (int i = 0; i < 3; ++i) {
    long_curves[size_t(i)].number = i, long_curves[size_t(i)].complete = true;
    for (int t = 0; t <= 2000; ++t)
      long_curves[size_t(i)].values.push_back(5.0 - 4e-3 * t + 1e-6 * t * t +
                                              (t % 2 == 0 ? 0.1 : -0.1));
  }
  CHECK_FALSE(noisy_med->should_prune({9, false, false, {5.1500}}, long_curves));  // 5.1 + 0.05007
  CHECK(noisy_med->should_prune({9, false, false, {5.1502}}, long_curves));
  // ASHA, eta 3, min_resource 1: rungs at 1, 3, 9 reports past the first (reports 2, 4, 10).
  o = PrunerOptions();
  o.name = "asha", o.reduction_factor = 3, o.min_resource = 1;
  auto asha = make_pruner(o);
  std::vector<TrialCurve> seen;
  for (int i = 0; i < 6; ++i)
    seen.push_back({i, true, true, {double(i), double(i), double(i), double(i)}});
  CHECK_FALSE(asha->should_prune({9, false, false, {9.0}}, seen));            // report 1: no rung
  CHECK_FALSE(asha->should_prune({9, false, false, {9.0, 0.5}}, seen));       // top 7/3 = 2: 2nd
  CHECK(asha->should_prune({9, false, false, {9.0, 1.5}}, seen));             // 3rd of 7: pruned
  CHECK_FALSE(asha->should_prune({9, false, false, {0.5, 0.5, 9.0}}, seen));  // report 3: no rung
  CHECK(asha->should_prune({9, false, false, {0.5, 0.5, 9.0, 9.0}}, seen));   // rung 4: worst
  CHECK_FALSE(asha->should_prune({9, false, false, {0.5, 0.5}}, {}));  // alone at a rung: promoted
  CHECK(asha->should_prune({9, false, false, {0.5, NAN}}, seen));      // diverged
  // Hyperband: several brackets, the cheapest (most aggressive) taking the most trials.
  o.name = "hyperband", o.max_resource = 9;
  std::map<int, int> per;
  for (int n = 0; n < 300; ++n) per[hyperband_bracket(o, n)]++;
  CHECK(per.size() == 3);
  CHECK(per[0] > per[1]);
  CHECK(per[1] > per[2]);
}

// A trial script: reports `steps` intermediate values of a quadratic in x (lower is better),
// marks each run in runs.log, can crash or diverge on request.
// True once every process listed in `pids` (one per line) has exited: no such process, or a
// zombie nobody has reaped yet. Polls for at most `seconds`.
static bool all_gone(const fs::path& pids, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    bool alive = false;
    std::ifstream in(pids);
    for (pid_t pid; in >> pid && !alive;) {
      std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
      std::string comm_and_rest;
      if (!std::getline(stat, comm_and_rest)) continue;  // gone
      const size_t close = comm_and_rest.rfind(')');
      alive = close == std::string::npos || comm_and_rest.substr(close + 2, 1) != "Z";
    }
    if (!alive) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

static std::string trial_script(const fs::path& d, double sleep_s) {
  const auto p = d / "trial.sh";
  write(p,
        "#!/bin/sh\n"
        "x=$MLTRAIN_PARAM_X\n"
        "echo \"$MLTRAIN_TRIAL_NUMBER $x\" >> " +
            (d / "runs.log").string() + "\necho $$ >> " + (d / "pids.log").string() +
            "\n"
            "case \"$MLTRAIN_PARAM_MODE\" in crash) echo 'boom: out of cheese' >&2; exit 3;; nan) "
            "echo '{\"step\": 1, \"loss\": null}'; exit 0;; esac\n"
            "for s in 1 2 3; do sleep " +
            std::to_string(sleep_s) +
            "; "
            "awk -v x=\"$x\" -v s=$s 'BEGIN { printf \"{\\\"step\\\": %d, \\\"loss\\\": "
            "%.17g}\\n\", s, (x - 0.3) ^ 2 + 1 / s }'; done\n");
  fs::permissions(p, fs::perms::owner_all);
  return p.string();
}

// A random-sampler study of trial_script over x in [0, 1] (stale after 60 s); returns the command
// that runs (and, run again, resumes) it.
static std::string random_study(const fs::path& d, double sleep_s, const std::string& study) {
  const auto script = trial_script(d, sleep_s);
  write(d / "s.yaml", "study: {name: s, dir: " + d.string() + ", " + study +
                          ", stale_after_s: 60}\n"
                          "sampler: {name: random}\n"
                          "objective: {metric: loss, direction: minimize}\n"
                          "trial: {command: [" +
                          script +
                          "]}\n"
                          "space:\n  x: {type: float, low: 0, high: 1}\n");
  return kBin + " tune " + (d / "s.yaml").string() + " -q";
}

TEST_CASE("tune driver: command trials, failures recorded, outputs written", "[tune][driver]") {
  const auto d = tmpdir("driver");
  const auto script = trial_script(d, 0.0);
  write(d / "s.yaml", "study: {name: s, dir: " + d.string() +
                          ", n_trials: 8, seed: 1, max_concurrent: 2}\n"
                          "sampler: {name: tpe, n_startup: 3}\n"
                          "objective: {metric: loss, direction: minimize}\n"
                          "trial: {command: [" +
                          script +
                          "]}\n"
                          "space:\n  x: {type: float, low: 0, high: 1}\n  mode: {type: "
                          "categorical, choices: [ok, ok2, ok3, crash, nan]}\n");
  REQUIRE(sh(kBin + " tune " + (d / "s.yaml").string() + " -q --json > " +
             (d / "out.json").string()) == 0);
  std::ifstream in(d / "out.json");
  const auto s = nlohmann::json::parse(in);
  CHECK(s["trials"] == 8);
  const auto cfg = study_config_from_folder((d / "s").string());
  const auto trials = read_trials(d / "s", cfg.space);
  REQUIRE(trials.size() == 8);
  for (const auto& t : trials) {
    INFO("trial " << t.number << " " << t.params.dump() << " " << t.state << " " << t.reason);
    const std::string mode = t.params["mode"];
    if (mode == "crash") {
      CHECK(t.state == "FAIL");
      CHECK(t.reason.find("exit status 3: boom: out of cheese") != std::string::npos);
    } else if (mode == "nan") {
      CHECK(t.state == "FAIL");
      CHECK(t.reason.find("diverged") != std::string::npos);
    } else {
      CHECK(t.state == "COMPLETE");
      CHECK(t.intermediate.size() == 3);
      const double x = t.params["x"];
      CHECK(t.value == Approx((x - 0.3) * (x - 0.3) + 1.0 / 3).margin(1e-9));
    }
  }
  for (const char* f : {"trials.csv", "trials.jsonl", "best.yaml", "importance.json", "history.svg",
                        "importance.svg", "parallel.svg"})
    CHECK(fs::exists(d / "s" / f));
  // Bad study files: exit 2 naming the file, line and key.
  write(d / "bad.yaml",
        "study: {name: b, dir: " + d.string() +
            "}\nsampler: {name: tpe, n_candidtes: 3}\nspace:\n  x: {type: float, low: 1, high: 0}\n"
            "trial: {command: [/bin/true]}\n");
  REQUIRE(sh(kBin + " tune " + (d / "bad.yaml").string() + " 2> " + (d / "err.txt").string()) == 2);
  std::ifstream e(d / "err.txt");
  const std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  CHECK(err.find("bad.yaml:2:22: sampler.n_candidtes: unknown key") != std::string::npos);
  CHECK(err.find("space.x: low must be below high") != std::string::npos);
  CHECK(sh(kBin + " tune " + (d / "s.yaml").string() + " sampler.name=annealing 2>/dev/null") == 2);
}

TEST_CASE("tune driver: cross-validated trials run their folds as a group and report the mean",
          "[tune][driver][folds]") {
  const auto d = tmpdir("folds");
  // Fold i of a trial reports loss = (x - 0.3)^2 + 0.1 * i + 1 / s at steps 1..3.
  const auto p = d / "fold.sh";
  write(p,
        "#!/bin/sh\n"
        "echo \"$MLTRAIN_TRIAL_NUMBER $MLTRAIN_FOLD $MLTRAIN_FOLDS $MLTRAIN_FOLD_SEED\" >> " +
            (d / "folds.log").string() +
            "\nfor s in 1 2 3; do awk -v x=\"$MLTRAIN_PARAM_X\" -v f=$MLTRAIN_FOLD -v s=$s "
            "'BEGIN { printf \"{\\\"step\\\": %d, \\\"loss\\\": %.17g}\\n\", s, (x - 0.3) ^ 2 + "
            "0.1 * f + 1 / s "
            "}'; done\n");
  fs::permissions(p, fs::perms::owner_all);
  write(d / "s.yaml", "study: {name: s, dir: " + d.string() +
                          ", n_trials: 3, seed: 5}\n"
                          "sampler: {name: random}\n"
                          "objective: {metric: loss, direction: minimize, folds: 3}\n"
                          "trial: {command: [" +
                          p.string() + "]}\nspace:\n  x: {type: float, low: 0, high: 1}\n");
  REQUIRE(sh(kBin + " tune " + (d / "s.yaml").string() + " -q > /dev/null") == 0);
  const auto cfg = study_config_from_folder((d / "s").string());
  const auto trials = read_trials(d / "s", cfg.space);
  REQUIRE(trials.size() == 3);
  for (const auto& t : trials) {
    const double x = t.params["x"];
    INFO(t.number << " " << t.reason);
    REQUIRE(t.state == "COMPLETE");
    // Mean over folds 0, 1, 2 at the last step; reports are the running fold means.
    CHECK(t.value == Approx((x - 0.3) * (x - 0.3) + 0.1 + 1.0 / 3).margin(1e-12));
    REQUIRE(t.intermediate.size() == 3);
    CHECK(t.intermediate[0].second == Approx((x - 0.3) * (x - 0.3) + 0.1 + 1.0).margin(1e-12));
    CHECK(t.attrs["loss_std"].get<double>() == Approx(0.1).margin(1e-12));  // sd of 0, .1, .2
    CHECK(t.attrs["folds"]["loss"].size() == 3);
  }
  // Every fold of every trial ran once, with the study's seed.
  std::ifstream in(d / "folds.log");
  std::multiset<std::string> runs;
  for (std::string line; std::getline(in, line);) runs.insert(line);
  CHECK(runs.size() == 9);
  for (int t = 0; t < 3; ++t)
    for (int f = 0; f < 3; ++f)
      CHECK(runs.count(std::to_string(t) + " " + std::to_string(f) + " 3 5") == 1);
  std::ifstream b(d / "s" / "best.yaml");
  const std::string best((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>());
  CHECK(best.find("# folds (3): loss [") != std::string::npos);
}

TEST_CASE("tune: folds larger than the data stop the study with exit 2 naming data.folds",
          "[tune][driver][folds]") {
  const auto d = tmpdir("folds_bad");
  // From the source folder: the study's trial.train is a path relative to it.
  const std::string cmd = "cd " + std::string(MLTRAIN_SOURCE_DIR) + " && " + kBin +
                          " tune configs/tune/fashion_mnist_mlp.yaml -q study.dir=" + d.string() +
                          " study.n_trials=3 objective.folds=10 pruner.name=none "
                          "'trial.overrides=[data.limit_train=5]' "
                          "2> " +
                          (d / "err.txt").string();
  CHECK(sh(cmd) == 2);
  std::ifstream e(d / "err.txt");
  const std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  INFO(err);
  CHECK(err.find("data.folds: 10 folds of 5 training samples leave a fold empty") !=
        std::string::npos);
  CHECK(err.find("fix: use at most 5 folds") != std::string::npos);
  // A test function has no data: refused when the study file is read.
  CHECK(sh(kBin + " tune " + MLTRAIN_SOURCE_DIR +
           "/configs/tune/branin.yaml objective.folds=3 -q "
           "study.dir=" +
           d.string() + " 2> " + (d / "err2.txt").string()) == 2);
  std::ifstream e2(d / "err2.txt");
  const std::string err2((std::istreambuf_iterator<char>(e2)), std::istreambuf_iterator<char>());
  CHECK(err2.find("objective.folds") != std::string::npos);
}

TEST_CASE("Pareto fronts: dominance, non-dominated ranks, hypervolume by hand", "[tune][pareto]") {
  CHECK(dominates({1, 2}, {2, 2}));
  CHECK_FALSE(dominates({1, 2}, {1, 2}));  // equal: neither dominates
  CHECK_FALSE(dominates({1, 3}, {2, 2}));
  CHECK(nondominated_ranks({{1, 4}, {2, 2}, {4, 1}, {3, 3}, {4, 4}}) ==
        std::vector<int>{0, 0, 0, 1, 2});
  // Staircase below (4, 4): 3 x 1 + 2 x 1 + 1 x 1 = 6; a point outside the reference adds nothing.
  CHECK(hypervolume({{1, 3}, {2, 2}, {3, 1}, {5, 0}}, {4, 4}) == Approx(6));
  CHECK(hypervolume({{1, 1, 1}}, {2, 2, 2}) == Approx(1));
  // Two boxes of 4 and 2 sharing a unit cube: 5.
  CHECK(hypervolume({{0, 0, 1}, {1, 1, 0}}, {2, 2, 2}) == Approx(5));
  // The good group's boundary front by hypervolume contribution: the knee first.
  CHECK(select_best({{0, 3}, {1, 1}, {3, 0}, {4, 4}}, 1) == std::vector<size_t>{1});
  CHECK(select_best({{0, 3}, {1, 1}, {3, 0}, {4, 4}}, 4).back() == 3);  // the dominated one last
}

TEST_CASE(
    "several objectives: Pareto front outputs, pruning spares the front, a metric never "
    "reported stops the study",
    "[tune][driver][pareto]") {
  const auto d = tmpdir("pareto");
  const std::string base =
      kBin + " tune " + MLTRAIN_SOURCE_DIR + "/configs/tune/branin.yaml -q study.dir=" + d.string();
  REQUIRE(sh(base + " objective.function=zdt1 study.n_trials=40 study.name=z > /dev/null") == 0);
  std::ifstream pj(d / "z" / "pareto.json");
  const auto front = nlohmann::json::parse(pj);
  REQUIRE(front["front"].size() >= 2);
  const auto cfg = study_config_from_folder((d / "z").string());
  const auto trials = read_trials(d / "z", cfg.space);
  for (const auto& f : front["front"]) {  // nobody dominates a front member; values are ZDT1's
    const auto x = trials[f["number"].get<size_t>()].x;
    const std::vector<double> v = f["values"];
    CHECK(v == find_test_function("zdt1")->fm(x));
    for (const auto& t : trials) CHECK_FALSE(dominates(t.values, v));
  }
  CHECK(front["hypervolume"].get<double>() > 0);
  CHECK(fs::exists(d / "z" / "pareto.svg"));
  std::ifstream csv(d / "z" / "trials.csv");
  std::string header;
  std::getline(csv, header);
  CHECK(header.rfind("number,state,value,f1,f2,x1", 0) == 0);

  // loss falls with x, size grows with x: every "good" trial is on the front of (loss, size) and
  // is never pruned, though the median pruner on loss alone stops some; "bad" ones are dominated.
  const auto p = d / "two.sh";
  write(p,
        "#!/bin/sh\nb=0; [ \"$MLTRAIN_PARAM_MODE\" = bad ] && b=5\n"
        "for s in 1 2 3 4 5; do awk -v x=\"$MLTRAIN_PARAM_X\" -v s=$s -v b=$b 'BEGIN { printf "
        "\"{\\\"step\\\": %d, \\\"loss\\\": %.17g, \\\"size\\\": %.17g}\\n\", s, 1 - x + b + 1 / "
        "s, x + b "
        "}'; done\n");
  fs::permissions(p, fs::perms::owner_all);
  auto study = [&](const std::string& name, const std::string& objective) {
    write(d / (name + ".yaml"), "study: {name: " + name + ", dir: " + d.string() +
                                    ", n_trials: 16, seed: 3}\nsampler: {name: random}\n"
                                    "pruner: {name: median, n_startup_trials: 2}\nobjective: " +
                                    objective + "\ntrial: {command: [" + p.string() +
                                    "]}\nspace:\n  x: {type: float, low: 0, high: 1}\n"
                                    "  mode: {type: categorical, choices: [good, good2, bad]}\n");
    REQUIRE(sh(kBin + " tune " + (d / (name + ".yaml")).string() + " -q > /dev/null") == 0);
    const auto c = study_config_from_folder((d / name).string());
    return read_trials(d / name, c.space);
  };
  int pruned_good = 0, pruned_bad = 0;
  for (const auto& t : study("single", "{metric: loss, direction: minimize}"))
    if (t.state == "PRUNED" && t.params["mode"] != "bad") ++pruned_good;
  CHECK(pruned_good > 0);  // loss alone: good trials with small x are pruned
  pruned_good = 0;
  for (const auto& t : study("both",
                             "[{metric: loss, direction: minimize}, {metric: size, "
                             "direction: minimize}]")) {
    INFO("trial " << t.number << " " << t.params.dump() << " " << t.state);
    if (t.params["mode"] == "bad") {
      pruned_bad += t.state == "PRUNED";
    } else {
      CHECK(t.state == "COMPLETE");
      CHECK(t.values.size() == 2);
    }
  }
  CHECK(pruned_bad > 0);  // dominated trials are still pruned

  // An objective the trials never report: exit 2 naming the key.
  write(d / "missing.yaml", "study: {name: m, dir: " + d.string() +
                                ", n_trials: 3}\nsampler: {name: random}\n"
                                "objective: [{metric: loss, direction: minimize}, {metric: "
                                "latency_ms, direction: minimize}]\ntrial: {command: [" +
                                p.string() + "]}\nspace:\n  x: {type: float, low: 0, high: 1}\n");
  CHECK(sh(kBin + " tune " + (d / "missing.yaml").string() + " -q 2> " +
           (d / "err.txt").string()) == 2);
  std::ifstream e(d / "err.txt");
  const std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  CHECK(err.find("objective.metrics[1].metric") != std::string::npos);
  CHECK(err.find("latency_ms") != std::string::npos);
  // GP optimises one objective: refused at config time.
  CHECK(sh(kBin + " tune " + (d / "missing.yaml").string() + " sampler.name=gp -q 2>/dev/null") ==
        2);
}

TEST_CASE("tune driver: SIGKILL mid-study, rerun completes with no trial lost or run twice",
          "[tune][driver]") {
  const auto d = tmpdir("resume");
  const std::string cmd = random_study(d, 0.3, "n_trials: 6, seed: 2, max_concurrent: 2");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd + " >/dev/null 2>&1").c_str(), nullptr);
    ::_exit(127);
  }
  // Kill the driver once two trials have finished and others are running.
  const auto journal = d / "s" / "journal.jsonl";
  for (int i = 0; i < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream j(journal);
    std::string all((std::istreambuf_iterator<char>(j)), std::istreambuf_iterator<char>());
    size_t n = 0, at = 0;
    while ((at = all.find("\"op\":\"finish\"", at)) != std::string::npos) ++n, ++at;
    if (n >= 2) break;
  }
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
  {
    std::ifstream pids(d / "pids.log");
    int started = 0;
    for (pid_t p; pids >> p;) ++started;
    REQUIRE(started >= 2);  // the two that finished before the driver was killed, at least
  }
  REQUIRE(all_gone(d / "pids.log", 30));  // the trials die with their driver (PDEATHSIG)
  auto before = read_trials(d / "s", study_config_from_folder((d / "s").string()).space);
  int complete_before = 0, running_before = 0;
  for (const auto& t : before)
    complete_before += t.state == "COMPLETE", running_before += t.state == "RUNNING";
  REQUIRE(complete_before >= 2);
  REQUIRE(complete_before < 6);
  REQUIRE(sh(cmd + " > /dev/null 2>&1") == 0);  // the same command resumes
  const auto after = read_trials(d / "s", study_config_from_folder((d / "s").string()).space);
  int complete = 0, stale = 0;
  std::map<std::string, int> x_complete;
  for (const auto& t : after) {
    if (t.state == "COMPLETE") ++complete, x_complete[t.params["x"].dump()]++;
    if (t.state == "FAIL") {
      CHECK(t.reason.rfind("stale", 0) == 0);
      ++stale;
    }
  }
  CHECK(complete == 6);            // n_trials reached: nothing lost
  CHECK(stale == running_before);  // each interrupted trial failed as stale ...
  for (const auto& t : after)
    if (t.state == "FAIL") {  // ... and was retried with the same parameters
      bool retried = false;
      for (const auto& u : after)
        retried |= u.retry_of == t.number && u.params == t.params && u.state == "COMPLETE";
      CHECK(retried);
    }
  for (const auto& [x, n] : x_complete) CHECK(n == 1);  // no finished trial run again
  // Every trial process that started: the completed ones before the kill ran exactly once.
  std::ifstream runs(d / "runs.log");
  std::map<int, int> started;
  int num;
  std::string x;
  while (runs >> num >> x) started[num]++;
  for (const auto& t : before)
    if (t.state == "COMPLETE") CHECK(started[t.number] == 1);
  CHECK(int(after.size()) == 6 + stale);
}

TEST_CASE("journal replay: hostile records are skipped, never fatal or huge", "[tune][journal]") {
  // Found by tests/fuzz/fuzz_journal.cpp: a create without params threw out_of_range past the
  // driver; a trial number of 2e9 resized the trial table to 2e9 entries.
  const auto d = tmpdir("hostile_journal");
  fs::create_directories(d / "s");
  write(d / "s" / "journal.jsonl",
        "{\"op\":\"create\",\"trial\":0,\"params\":{\"x\":0.5},\"worker\":\"w\"}\n"
        "{\"op\":\"create\",\"trial\":1}\n"                                   // no params
        "{\"op\":\"create\",\"trial\":2000000000,\"params\":{}}\n"            // past any journal
        "{\"op\":\"create\",\"trial\":\"2\",\"params\":{}}\n"                 // a string number
        "{\"op\":\"report\",\"trial\":0,\"step\":1e300,\"value\":1}\n"        // a float step
        "[1, 2, 3]\n\"text\"\n17\n"                                           // not objects
        "{\"op\":\"create\",\"trial\":1,\"params\":{},\"retry_of\":1e300}\n"  // float
        "{\"op\":\"finish\",\"trial\":0,\"state\":7}\n"  // a state of the wrong type
        "{\"op\":\"finish\",\"trial\":0,\"state\":\"COMPLETE\",\"value\":0.25}\n");
  const Space space = {Param::floating("x", 0, 1)};
  std::vector<TrialState> trials;
  REQUIRE_NOTHROW(trials = read_trials(d / "s", space));
  REQUIRE(trials.size() == 1);
  CHECK(trials[0].state == "COMPLETE");
  CHECK(trials[0].value == 0.25);
  REQUIRE(trials[0].intermediate.size() == 1);
  CHECK(trials[0].intermediate[0].first == 0);  // the float step counted as the next one
  // A line another driver (or program) wrote that is not JSON at all: the study resumes over it,
  // with a warning naming the journal and the offset.
  const std::string run =
      kBin + " tune " + MLTRAIN_SOURCE_DIR +
      "/configs/tune/branin.yaml -q study.n_trials=4 study.name=g study.dir=" + d.string();
  REQUIRE(sh(run + " study.n_trials=2 > /dev/null 2>&1") == 0);
  { std::ofstream(d / "g" / "journal.jsonl", std::ios::app) << "garbage {from another driver\n"; }
  REQUIRE(sh(run + " > /dev/null 2> " + (d / "err.txt").string()) == 0);
  std::ifstream e(d / "err.txt");
  const std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  CHECK(err.find("journal.jsonl offset ") != std::string::npos);
  CHECK(err.find("skipped a line that is not a JSON record (garbage {from another driver)") !=
        std::string::npos);
  CHECK(read_trials(d / "g", find_test_function("branin")->space).size() == 4);
}

TEST_CASE("tune driver: killed inside a journal append (MLTRAIN_FAULT), rerun loses nothing",
          "[tune][driver][fault]") {
  // journal.write: half of an append's bytes reach the file (a torn line); journal.fsync: all of
  // them, not yet synced. The k-th append is the one killed, mid-study, each k a different record.
  for (const std::string point : {"journal.write@5", "journal.write@9", "journal.fsync@6"}) {
    DYNAMIC_SECTION(point) {
      const auto d = tmpdir("journal_fault");
      const std::string cmd = random_study(d, 0.0, "n_trials: 5, seed: 3, max_concurrent: 1");
      REQUIRE(sh("MLTRAIN_FAULT=" + point + " " + cmd + " > " + (d / "killed.log").string() +
                 " 2>&1") == 128 + SIGKILL);
      std::ifstream log(d / "killed.log");
      const std::string out((std::istreambuf_iterator<char>(log)),
                            std::istreambuf_iterator<char>());
      CHECK(out.find("[fault] killed at " + point) != std::string::npos);
      REQUIRE(all_gone(d / "pids.log", 30));
      const auto space = study_config_from_folder((d / "s").string()).space;
      const auto before = read_trials(d / "s", space);
      REQUIRE(sh(cmd + " > /dev/null 2>&1") == 0);  // the same command resumes
      const auto after = read_trials(d / "s", space);
      int complete = 0;
      std::map<std::string, int> x_complete;
      for (const auto& t : after) {
        CHECK(t.number >= 0);  // every trial number was created (once: replay keeps one state)
        if (t.state == "COMPLETE") ++complete, x_complete[t.params["x"].dump()]++;
        if (t.state == "FAIL") CHECK(t.reason.rfind("stale", 0) == 0);
      }
      CHECK(complete == 5);
      for (const auto& [x, n] : x_complete) CHECK(n == 1);
      for (const auto& t : before)  // what was complete before the kill is kept, not rerun
        if (t.state == "COMPLETE") CHECK(after[size_t(t.number)].state == "COMPLETE");
      // The journal holds whole records only, but for the torn one, which readers skip.
      std::ifstream j(d / "s" / "journal.jsonl");
      int torn = 0;
      for (std::string line; std::getline(j, line);) torn += !nlohmann::json::accept(line);
      CHECK(torn == (point.rfind("journal.write", 0) == 0 ? 1 : 0));
    }
  }
}

// ---------------------------------------------------------------- study files on the schema

TEST_CASE("study files: accept/reject table, every problem with file:line:col",
          "[tune][study_file]") {
  const auto d = tmpdir("study_table");
  const std::string ok_trial = "trial: {command: [/bin/true]}\n";
  const std::string ok_space = "space:\n  x: {type: float, low: 0, high: 1}\n";
  struct Row {
    std::string yaml;
    std::vector<std::string> overrides;
    std::vector<std::string> expect;  // empty: accepted; else substrings of the one ConfigError
  };
  const std::vector<Row> rows = {
      {ok_trial + ok_space, {}, {}},
      {"objective: {function: branin}\n", {}, {}},
      {"study: {timeout: 30m}\n" + ok_trial + ok_space, {}, {}},
      {"smapler: {name: tpe}\n" + ok_trial + ok_space,
       {},
       {"s.yaml:1:1: smapler: unknown key (did you mean 'sampler'?)"}},
      {"study: {n_trails: 3}\n" + ok_trial + ok_space,
       {},
       {"s.yaml:1:9: study.n_trails: unknown key (did you mean 'n_trials'?)"}},
      {ok_trial + ok_space,
       {"sampler.name=annealing"},
       {"override 'sampler.name=annealing': sampler.name: 'annealing' is not one of: grid, random, "
        "tpe, gp"}},
      {"study: {timeout: 600}\n" + ok_trial + ok_space,
       {},
       {"s.yaml:1:18: study.timeout: '600' has no unit: write 600s"}},
      {"study: {timeout: 2ep}\n" + ok_trial + ok_space,
       {},
       {"study.timeout: unknown unit 'ep' in '2ep' (a duration takes s, m or h)"}},
      {"study: {n_trials: 0}\n" + ok_trial + ok_space,
       {},
       {"s.yaml:1:19: study.n_trials: must be > 0"}},
      {ok_trial + "space:\n  x: {type: float, low: 1, high: 0}\n",
       {},
       {"s.yaml:3:3: space.x: low must be below high (1 >= 0)"}},
      {ok_trial + "space:\n  x: {type: float, low: 0, high: 1, log: true}\n",
       {},
       {"s.yaml:3:25: space.x.low: a log-scaled parameter needs low > 0"}},
      {ok_trial + "space:\n  c: {type: categorical, choices: []}\n",
       {},
       {"space.c.choices: a categorical parameter needs a non-empty list of choices"}},
      {ok_trial + "space:\n  x: {low: 0, high: 1}\n",
       {},
       {"s.yaml:3:3: space.x: missing type; use float, int or categorical"}},
      {ok_trial + "space:\n  x: {type: double, low: 0, high: 1}\n",
       {},
       {"s.yaml:3:13: space.x.type: 'double' is not one of: float, int, categorical"}},
      {ok_trial + "space:\n  n: {type: int, low: 0.5, high: 4}\n",
       {},
       {"space.n: an int parameter needs integer low and high"}},
      {ok_trial + "space:\n  x: {type: float, low: 0, high: 1, grid: [0.5, 2]}\n",
       {},
       {"space.x.grid: value 2 is outside [low, high]"}},
      {"trial: {command: [/bin/true]}\nobjective: {function: branin}\n",
       {},
       {"trial: choose one of trial.train, trial.command and objective.function"}},
      {ok_space, {}, {"objective: nothing to tune"}},
      {"trial: {train: nope.yaml}\n" + ok_space,
       {},
       {"s.yaml:1:16: trial.train: 'nope.yaml' does not exist"}},
      {"objective: {function: bananas}\n",
       {},
       {"s.yaml:1:23: objective.function: unknown test function 'bananas' (have: "}},
      {"sampler: {name: grid}\n" + ok_trial + ok_space,
       {},
       {"sampler.name: the grid sampler needs `grid: [...]` or a `step`"}},
      {ok_trial + ok_space,
       {"sampler.n_candidtes=3"},
       {"sampler.n_candidtes: unknown key (did you mean 'sampler.n_candidates'?)"}},
      {"study: {seed: 1, seed: 2}\n" + ok_trial + ok_space,
       {},
       {"s.yaml:1:18: study.seed: duplicate key (first set at line 1)"}},
      {"sampler: {gamma: 1.5}\n" + ok_trial + ok_space, {}, {"sampler.gamma: must be in (0, 1)"}},
      {ok_trial + "space: [x, y]\n",
       {},
       {"s.yaml:2:8: space: expected a mapping of names to settings"}},
      {"study: {name: a/b, max_retry: -1}\n" + ok_trial + ok_space,
       {},
       {"study.name: must be a non-empty name without '/'", "study.max_retry: must be >= 0",
        "2 config errors"}},
  };
  REQUIRE(rows.size() >= 15);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const auto path = d / "s.yaml";
    write(path, r.yaml);
    INFO("row " << i << ":\n" << r.yaml);
    if (r.expect.empty()) {
      CHECK_NOTHROW(load_study_config(path.string(), r.overrides));
      continue;
    }
    try {
      load_study_config(path.string(), r.overrides);
      FAIL("accepted");
    } catch (const mltrain::ConfigError& e) {
      const std::string what = e.what();
      INFO(what);
      for (const auto& s : r.expect) CHECK(what.find(s) != std::string::npos);
      CHECK(std::string(e.fix()).find("mltrain config schema --study") != std::string::npos);
    }
  }
}

TEST_CASE(
    "study files: durations through Period's parser; the resolved study.yaml reads back to the "
    "same bytes",
    "[tune][study_file]") {
  const auto d = tmpdir("study_yaml");
  write(d / "s.yaml",
        "study: {name: s, dir: " + d.string() +
            ", timeout: 1.5h}\nsampler: {name: gp, xi: 0.01}\n"
            "trial: {command: [/bin/echo, 'a b']}\n"
            "space:\n  optim.lr: {type: float, low: 1.0e-4, high: 0.1, log: true}\n"
            "  data.batch_size: {type: categorical, choices: [64, 128, '256', true]}\n");
  const auto c = load_study_config((d / "s.yaml").string(), {"study.timeout=45m"});
  CHECK(c.timeout_s == 2700);
  REQUIRE(c.space.size() == 2);
  CHECK(c.space[0].name == "optim.lr");
  CHECK(c.space[1].choices == std::vector<nlohmann::json>{64, 128, "256", true});
  const std::string yaml = mltrain::config::to_yaml(c.file);
  CHECK(yaml.find("timeout: 2700s") != std::string::npos);
  write(d / "again.yaml", yaml);
  const auto back = load_study_config((d / "again.yaml").string(), {});
  CHECK(mltrain::config::to_yaml(back.file) == yaml);
  CHECK(back.space[1].choices == c.space[1].choices);
  // A test function's space is written out, so the folder says what was searched.
  write(d / "f.yaml", "objective: {function: branin}\n");
  const auto f = load_study_config((d / "f.yaml").string(), {});
  CHECK(mltrain::config::to_yaml(f.file).find("space:\n  x1:") != std::string::npos);
}

TEST_CASE("mltrain config schema --study lists every study key with its type and default",
          "[tune][study_file]") {
  const auto d = tmpdir("study_schema");
  REQUIRE(sh(kBin + " config schema --study > " + (d / "schema.txt").string()) == 0);
  std::ifstream in(d / "schema.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == mltrain::config::study_schema_text());
  for (const char* key : {"study.timeout  ", "sampler.name  ", "pruner.reduction_factor  ",
                          "objective.direction  ", "trial.command  ", "space.<name>.low  "})
    CHECK(text.find(key) != std::string::npos);
  CHECK(text.find("duration (90s | 30m | 2h | never)") != std::string::npos);
  CHECK(text.find("optim.lr") == std::string::npos);  // not the experiment's schema
}
