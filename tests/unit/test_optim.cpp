// optim: optimizers and LR schedules against PyTorch 1.13 goldens, parameter groups, 1-bit
// compression.
#include <catch2/catch.hpp>

#include "temp_dir.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mltrain/core/error.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"
#include "mltrain/optim/schedule.hpp"

using namespace mltrain;

#ifndef MLTRAIN_SOURCE_DIR
#define MLTRAIN_SOURCE_DIR "."
#endif

TEST_CASE("optimizers match PyTorch 1.13 trajectories (25 steps, float64)", "[optim]") {
  std::ifstream in(std::string(MLTRAIN_SOURCE_DIR) + "/tests/golden/optim.json");
  REQUIRE(in.good());
  auto golden = nlohmann::json::parse(in);
  for (auto& [name, c] : golden["cases"].items()) {
    INFO(name);
    config::OptimConfig oc;
    auto& j = c["config"];
    oc.name = j["name"];
    oc.lr = j["lr"];
    oc.weight_decay = j["weight_decay"];
    if (j.contains("momentum")) oc.momentum = j["momentum"];
    if (j.contains("nesterov")) oc.nesterov = j["nesterov"];
    if (j.contains("beta1")) oc.beta1 = j["beta1"], oc.beta2 = j["beta2"], oc.eps = j["eps"];
    auto start = c["start"].get<std::vector<double>>();
    auto p = torch::tensor(start, torch::kDouble).reshape({3, 4}).set_requires_grad(true);
    auto opt = optim::Optimizer::create(oc, {{"p", p}});
    for (auto& g : c["grads"]) {
      p.mutable_grad() =
          torch::tensor(g.get<std::vector<double>>(), torch::kDouble).reshape({3, 4});
      opt->step(oc.lr);
    }
    auto want =
        torch::tensor(c["final"].get<std::vector<double>>(), torch::kDouble).reshape({3, 4});
    CHECK(torch::allclose(p.detach(), want, 1e-12, 1e-12));
  }
  auto& ce = golden["cross_entropy"];
  auto logits =
      torch::tensor(ce["logits"].get<std::vector<double>>(), torch::kDouble).reshape({6, 5});
  auto target = torch::tensor(ce["target"].get<std::vector<int64_t>>(), torch::kInt64);
  CHECK(torch::nn::functional::cross_entropy(logits, target).item<double>() ==
        Approx(ce["loss"].get<double>()).epsilon(1e-12));
}

TEST_CASE("optimizer: param groups by glob, state round trip, mismatch rejected", "[optim]") {
  config::OptimConfig oc;
  oc.name = "sgd";
  oc.momentum = 0.9;
  oc.weight_decay = 0.1;
  oc.param_groups = {{"*.bias", 2.0, 0.0}};
  auto w = torch::ones({2}).set_requires_grad(true), b = torch::ones({2}).set_requires_grad(true);
  auto opt = optim::Optimizer::create(oc, {{"fc.weight", w}, {"fc.bias", b}});
  CHECK(opt->slots()[0].lr_mult == 1.0);
  CHECK(opt->slots()[1].lr_mult == 2.0);
  CHECK(opt->slots()[1].weight_decay == 0.0);
  w.mutable_grad() = torch::ones({2});
  b.mutable_grad() = torch::ones({2});
  opt->step(0.1);
  CHECK(w[0].item<float>() == Approx(1 - 0.1 * (1 + 0.1)));
  CHECK(b[0].item<float>() == Approx(1 - 0.2));
  auto state = opt->state();
  std::map<std::string, torch::Tensor> m(state.begin(), state.end());
  auto opt2 = optim::Optimizer::create(oc, {{"fc.weight", w}, {"fc.bias", b}});
  opt2->load_state(m);
  CHECK(opt2->steps() == 1);
  m.erase("fc.bias/momentum_buffer");
  CHECK_THROWS_AS(opt2->load_state(m), CheckpointError);
  oc.param_groups = {{"conv*", 1.0, -1}};
  CHECK_THROWS_WITH(optim::Optimizer::create(oc, {{"fc.weight", w}}),
                    Catch::Contains("matches no parameter"));
}

// Channels-last convolution weights take Adam's fused kernel too (it walks memory flat, so any
// dense layout the parameter, gradient and moments share will do), and element by element it is
// the same arithmetic: the same values in either layout end bitwise equal, also across a state
// round trip (a checkpoint stores the moments contiguous; they come back in the weight's layout).
// The unfused formula rounds differently, so the comparison would catch a fall back to it.
TEST_CASE("Adam: channels-last weights take the fused kernel, bit for bit", "[optim]") {
  for (const std::string name : {"adam", "adamw"}) {
    INFO(name);
    config::OptimConfig oc;
    oc.name = name;
    oc.lr = 3e-3;
    oc.weight_decay = 0.01;
    torch::manual_seed(7);
    const auto start = torch::randn({8, 16, 3, 3});
    std::vector<torch::Tensor> grads;
    for (int i = 0; i < 10; ++i) grads.push_back(torch::randn({8, 16, 3, 3}));
    auto run = [&](bool channels_last) {
      auto p = channels_last ? start.contiguous(torch::MemoryFormat::ChannelsLast) : start.clone();
      p.set_requires_grad(true);
      auto opt = optim::Optimizer::create(oc, {{"conv.weight", p}});
      for (int i = 0; i < 10; ++i) {
        p.mutable_grad() = channels_last ? grads[i].contiguous(torch::MemoryFormat::ChannelsLast)
                                         : grads[i].clone();
        opt->step(oc.lr);
        if (i == 4) {  // a resume half way: moments saved contiguous, loaded back
          std::map<std::string, torch::Tensor> st;
          for (auto& [k, v] : opt->state()) st[k] = v.contiguous();
          opt = optim::Optimizer::create(oc, {{"conv.weight", p}});
          opt->load_state(st);
          for (auto& t : opt->buffers_of("conv.weight")) CHECK(t.strides() == p.strides());
        }
      }
      return p.detach().contiguous();
    };
    const auto flat = run(false), cl = run(true);
    CHECK(torch::equal(flat, cl));
    // The unfused formula (the fallback) on the same data: not bitwise the same, so the check
    // above tells the two paths apart.
    auto q = start.clone(), m = torch::zeros_like(q), v = torch::zeros_like(q);
    for (int i = 0; i < 10; ++i) {
      const double t = i + 1, bc1 = 1 - std::pow(oc.beta1, t), bc2 = 1 - std::pow(oc.beta2, t);
      auto g = grads[i];
      if (name == "adamw")
        q.mul_(1 - oc.lr * oc.weight_decay);
      else
        g = g.add(q, oc.weight_decay);
      m.mul_(oc.beta1).add_(g, 1 - oc.beta1);
      v.mul_(oc.beta2).addcmul_(g, g, 1 - oc.beta2);
      q.addcdiv_(m, (v.sqrt() / std::sqrt(bc2)).add_(oc.eps), -oc.lr / bc1);
    }
    CHECK(torch::allclose(q, flat, 1e-5, 1e-6));
    CHECK_FALSE(torch::equal(q, flat));
  }
}

TEST_CASE("every schedule matches PyTorch's LR at each of 2001 steps within 1e-9 x base LR",
          "[schedule]") {
  std::ifstream in(std::string(MLTRAIN_SOURCE_DIR) + "/tests/golden/optim.json");
  auto golden = nlohmann::json::parse(in);
  int cases = 0;
  for (auto& [name, c] : golden["schedules"].items()) {
    INFO(name);
    auto& j = c["config"];
    config::ScheduleConfig sc;
    sc.name = j["name"];
    using P = config::Period;
    if (j.contains("step_size")) sc.step_size = P::steps(j["step_size"]);
    if (j.contains("gamma")) sc.gamma = j["gamma"];
    if (j.contains("milestones"))
      for (auto m : j["milestones"]) sc.milestones.push_back(P::steps(m));
    if (j.contains("eta_min")) sc.eta_min = j["eta_min"];
    if (j.contains("t0")) sc.t0 = P::steps(j["t0"]), sc.t_mult = j["t_mult"];
    if (j.contains("pct_start")) sc.pct_start = j["pct_start"], sc.anneal = j["anneal"];
    if (j.contains("warmup"))
      sc.warmup = P::steps(j["warmup"]), sc.warmup_start = j["warmup_start"];
    if (j.contains("step_size_down")) sc.step_size_down = P::steps(j["step_size_down"]);
    if (j.contains("cyclic_mode")) sc.cyclic_mode = j["cyclic_mode"];
    if (j.contains("power")) sc.power = j["power"];
    if (j.contains("patience")) {
      sc.patience = j["patience"], sc.threshold = j["threshold"], sc.cooldown = j["cooldown"],
      sc.min_lr = j["min_lr"];
      sc.mode = j["mode"];
    }
    const double base = c["lr"];
    const int64_t total = j.value("total", 2001);
    optim::Schedule sched(sc, base, total, /*steps_per_epoch=*/1);
    std::map<int64_t, double> evals;
    if (j.contains("evals"))
      for (auto& e : j["evals"]) evals[e[0].get<int64_t>()] = e[1].get<double>();
    const auto want = c["values"].get<std::vector<double>>();
    REQUIRE(want.size() == 2001);
    double worst = 0;
    for (int64_t t = 0; t < 2001; ++t) {
      worst = std::max(worst, std::abs(sched.lr(t) - want[t]));
      // PyTorch's scheduler sees the metric after step t; it changes the LR from step t + 1.
      if (evals.count(t)) sched.observe(t + 1, evals[t]);
    }
    CHECK(worst <= 1e-9 * base);
    ++cases;
  }
  CHECK(cases == 15);
  // PyTorch 1.13's recursive cosine stays within rounding of its closed form over 2000 steps.
  CHECK(golden["cosine_recursive_drift"].get<double>() < 1e-12);
}

TEST_CASE("plateau schedule is a pure function of its recorded history", "[schedule]") {
  config::ScheduleConfig sc;
  sc.name = "plateau";
  sc.patience = 0;
  sc.gamma = 0.5;
  optim::Schedule a(sc, 1.0, 100, 10);
  a.observe(10, 1.0);
  a.observe(20, 2.0);  // worse: drop after patience 0
  CHECK(a.lr(19) == 1.0);
  CHECK(a.lr(20) == 0.5);
  optim::Schedule b(sc, 1.0, 100, 10);
  b.set_history(a.history());  // what a checkpoint restores
  for (int64_t t = 0; t < 100; ++t) CHECK(b.lr(t) == a.lr(t));
  a.observe(30, NAN);  // a NaN never counts as an improvement
  CHECK(a.lr(30) == 0.25);
}

TEST_CASE("schedule.plateau: warm-up + cosine times the factor the plateau rule has reached",
          "[schedule]") {
  config::ScheduleConfig plain;
  plain.name = "cosine";
  plain.warmup = config::Period::steps(10);
  plain.warmup_start = 0.1;
  config::ScheduleConfig sc = plain;
  sc.plateau = true;
  sc.patience = 1;
  sc.gamma = 0.5;
  CHECK(sc.on_plateau());
  CHECK_FALSE(plain.on_plateau());
  optim::Schedule cos(plain, 0.3, 100, 10), both(sc, 0.3, 100, 10);
  both.observe(20, 1.0);
  both.observe(30, 1.5);  // one bad evaluation: patience 1 waits
  for (int64_t t = 0; t < 40; ++t) CHECK(both.lr(t) == Approx(cos.lr(t)).epsilon(1e-12));
  both.observe(40, 1.2);  // a second: the factor halves from step 40 on
  for (int64_t t = 40; t < 60; ++t) CHECK(both.lr(t) == Approx(0.5 * cos.lr(t)).epsilon(1e-12));
  both.observe(60, 0.5);  // better: no further drop, the factor stays
  both.observe(70, 0.6);
  both.observe(80, 0.7);  // two bad in a row again: quarter
  CHECK(both.lr(79) == Approx(0.5 * cos.lr(79)).epsilon(1e-12));
  CHECK(both.lr(80) == Approx(0.25 * cos.lr(80)).epsilon(1e-12));
  // The warm-up is steered too: the factor applies at every step once a drop is recorded.
  optim::Schedule early(sc, 0.3, 100, 10);
  early.observe(2, 1.0);
  early.observe(4, 2.0);
  early.observe(6, 3.0);
  CHECK(early.lr(7) == Approx(0.5 * cos.lr(7)).epsilon(1e-12));
  // observe() records nothing for a schedule that does not watch evaluations.
  cos.observe(5, 1.0);
  CHECK(cos.history().empty());
}

TEST_CASE("gradnorm schedule backs off while gradients grow and recovers, state round-trips",
          "[schedule]") {
  config::ScheduleConfig sc;
  sc.name = "gradnorm";
  sc.gn_reference = config::Period::steps(4);
  sc.gn_beta = 0.5;
  sc.gn_min_factor = 0.25;
  optim::Schedule s(sc, 1.0, 100, 10);
  for (int i = 0; i < 4; ++i) s.observe_grad_norm(2.0);  // reference = 2
  CHECK(s.lr(4) == 1.0);
  s.observe_grad_norm(6.0);  // ema = 0.5*2 + 0.5*6 = 4 -> factor 0.5
  CHECK(s.lr(5) == Approx(0.5));
  s.observe_grad_norm(NAN);  // ignored
  CHECK(s.lr(6) == Approx(0.5));
  for (int i = 0; i < 5; ++i) s.observe_grad_norm(100.0);
  CHECK(s.lr(7) == Approx(0.25));  // floor
  optim::Schedule t(sc, 1.0, 100, 10);
  t.load_gradnorm_state(s.gradnorm_state());
  CHECK(t.lr(7) == s.lr(7));
  for (int i = 0; i < 40; ++i) s.observe_grad_norm(1.0);
  CHECK(s.lr(8) == 1.0);  // capped at the base LR once norms settle below the reference
}

TEST_CASE("autolr schedule: lr x (1 - 0.1 norm / target), floored, state as gradnorm's",
          "[schedule]") {
  config::ScheduleConfig sc;
  sc.name = "autolr";
  sc.gn_reference = config::Period::steps(2);
  sc.gn_beta = 0.5;
  sc.gn_min_factor = 0.2;
  optim::Schedule s(sc, 1.0, 100, 10);
  CHECK(s.lr(0) == 1.0);
  s.observe_grad_norm(2.0), s.observe_grad_norm(2.0);  // target: the mean over 2 steps = 2
  CHECK(s.lr(2) == 1.0);                               // still the reference period
  s.observe_grad_norm(4.0);                            // ema 3: 1 - 0.1 * 3 / 2 = 0.85
  CHECK(s.lr(3) == Approx(0.85));
  for (int i = 0; i < 30; ++i) s.observe_grad_norm(100.0);  // 1 - 0.1 * ~100 / 2 < 0: the floor
  CHECK(s.lr(4) == Approx(0.2));
  sc.autolr_target = 10;  // a set target: from the first norm on
  optim::Schedule t(sc, 2.0, 100, 10);
  t.observe_grad_norm(5.0);  // 2 * (1 - 0.1 * 5 / 10) = 1.9
  CHECK(t.lr(1) == Approx(1.9));
  optim::Schedule u(sc, 2.0, 100, 10);
  u.load_gradnorm_state(t.gradnorm_state());
  CHECK(u.lr(1) == t.lr(1));
}

TEST_CASE("momentum compensation: 1 - (1 - m) sqrt(ref / B), below 1 for every batch", "[optim]") {
  // m = 0.9, reference 256: 0.95 at 1024 (the guide's m x sqrt(4) would be 1.8), 0.975 at 4096,
  // 0.8 at 64, 0 (floored) at 1
  CHECK(optim::compensated_momentum(0.9, 256, 256) == Approx(0.9));
  CHECK(optim::compensated_momentum(0.9, 1024, 256) == Approx(0.95));
  CHECK(optim::compensated_momentum(0.9, 4096, 256) == Approx(0.975));
  CHECK(optim::compensated_momentum(0.9, 64, 256) == Approx(0.8));
  CHECK(optim::compensated_momentum(0.9, 1, 256) == 0.0);
  CHECK(optim::compensated_momentum(0.9, 512, 0) == 0.9);  // off
  // the heavy-ball step lr / (1 - m) grows by sqrt(B / ref): 1/(1-0.95) = 2 x 1/(1-0.9)
  CHECK(1 / (1 - optim::compensated_momentum(0.9, 1024, 256)) == Approx(2 / (1 - 0.9)));
}

TEST_CASE("1-bit compression: packing round-trips, error feedback keeps what was not sent",
          "[optim][onebit]") {
  torch::manual_seed(5);
  auto x = torch::randn({5000});
  auto err = torch::zeros({5000});
  auto q = x.clone();
  mltrain::optim::onebit_compress(q, err);
  // Each chunk of 2048 is +-(mean |x| of the chunk), signs kept, and x = q + error exactly.
  CHECK(torch::allclose(q + err, x, 1e-6, 1e-6));
  CHECK(q.slice(0, 0, 2048).abs().max().item<float>() ==
        Approx(x.slice(0, 0, 2048).abs().mean().item<float>()).epsilon(1e-5));
  CHECK(q.slice(0, 4096, 5000).abs().min().item<float>() ==
        Approx(x.slice(0, 4096, 5000).abs().mean().item<float>()).epsilon(1e-5));
  CHECK(torch::equal(q.ge(0), x.ge(0)));
  const auto packed = mltrain::optim::onebit_pack(q);
  CHECK(packed.numel() ==
        (5000 + 7) / 8 + 4 * 3);  // 625 bytes of signs + 3 chunk scales: 32x below 20 000
  CHECK(torch::equal(mltrain::optim::onebit_unpack(packed, 5000), q));
  // Error feedback: the next round sends the residual too.
  auto q2 = torch::zeros({5000});
  mltrain::optim::onebit_compress(q2, err);
  CHECK(torch::allclose(q + q2 + err, x, 1e-5, 1e-5));
}
