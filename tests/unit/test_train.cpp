// Checkpoint store: manifest last, fallback past damage, retention. Training techniques: goldens against PyTorch, the loss-scaler rule, accumulation equivalence and
// gradient-health policies through the real Trainer, early stopping, EMA.
#include <catch2/catch.hpp>
#include <unistd.h>

#include "temp_dir.hpp"

#include <filesystem>

#include <fstream>

#include <nlohmann/json.hpp>

#include "mltrain/core/error.hpp"
#include "mltrain/runtime/memory.hpp"
#include "mltrain/formats/safetensors.hpp"
#include "mltrain/train/checkpoint.hpp"
#include "mltrain/train/techniques.hpp"
#include "mltrain/train/trainer.hpp"

using namespace mltrain;
namespace fs = std::filesystem;
using namespace mltrain::train;

static nlohmann::json golden() {
  std::ifstream in(std::string(MLTRAIN_SOURCE_DIR) + "/tests/golden/optim.json");
  return nlohmann::json::parse(in);
}

TEST_CASE(
    "LibTorch's cross-entropy with label smoothing (what the classification task calls) matches "
    "PyTorch within 1e-6; the epsilon per step: test_cli_train [smoothing]",
    "[smoothing]") {
  auto g = golden()["label_smoothing"];
  auto logits =
      torch::tensor(g["logits"].get<std::vector<double>>(), torch::kDouble).reshape({6, 5});
  auto target = torch::tensor(g["target"].get<std::vector<int64_t>>(), torch::kInt64);
  for (auto& c : g["cases"]) {
    const double eps = c["eps"];
    INFO(eps);
    namespace F = torch::nn::functional;
    const double got =
        F::cross_entropy(logits, target, F::CrossEntropyFuncOptions().label_smoothing(eps))
            .item<double>();
    CHECK(std::abs(got - c["loss"].get<double>()) <= 1e-6);
    // float32, as the trainer computes it
    const double got32 = F::cross_entropy(logits.to(torch::kFloat), target,
                                          F::CrossEntropyFuncOptions().label_smoothing(eps))
                             .item<double>();
    CHECK(std::abs(got32 - c["loss"].get<double>()) <= 1e-6);
  }
}

TEST_CASE("clip by norm matches torch.nn.utils.clip_grad_norm_", "[clip]") {
  auto g = golden()["clip_grad_norm"];
  for (auto& c : g["cases"]) {
    INFO(c["max_norm"]);
    model::NamedTensors params;
    for (size_t i = 0; i < g["grads"].size(); ++i) {
      auto p = torch::zeros(g["shapes"][i].get<std::vector<int64_t>>(), torch::kDouble);
      p.mutable_grad() = torch::tensor(g["grads"][i].get<std::vector<double>>(), torch::kDouble)
                             .reshape(p.sizes());
      params.emplace_back(std::string("p") + std::to_string(i), p);
    }
    const double norm = grad_norm(params);
    CHECK(norm == Approx(c["total_norm"].get<double>()).epsilon(1e-12));
    config::ClipConfig cc;
    cc.mode = "norm";
    cc.max_norm = c["max_norm"];
    GradClipper(cc).clip(params, norm);
    for (size_t i = 0; i < params.size(); ++i) {
      auto want = torch::tensor(c["clipped"][i].get<std::vector<double>>(), torch::kDouble);
      CHECK(torch::allclose(params[i].second.grad().flatten(), want, 1e-12, 1e-12));
    }
  }
}

TEST_CASE("gradient norm of fp32 gradients: double sums, the same bits for any thread count",
          "[clip]") {
  torch::manual_seed(5);
  // Sizes across the 65,536-element blocks and the 16 lanes, a channels-last weight, a gradient
  // of 1e20 (its square overflows fp32) and an absent gradient.
  model::NamedTensors params;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{200003}, {65536}, {17}, {1}})
    params.emplace_back("p", torch::zeros(shape));
  for (auto& [name, p] : params) p.mutable_grad() = torch::randn(p.sizes());
  auto conv = torch::zeros({8, 3, 5, 5}).contiguous(torch::MemoryFormat::ChannelsLast);
  conv.mutable_grad() = torch::randn({8, 3, 5, 5}).contiguous(torch::MemoryFormat::ChannelsLast);
  params.emplace_back("conv", conv);
  params.emplace_back("unused", torch::zeros({3}));
  double want = 0;  // exact enough: the double sum of the squares in another order
  for (auto& [name, p] : params)
    if (p.grad().defined()) want += p.grad().to(torch::kDouble).square().sum().item<double>();
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const double one = grad_norm(params);
  at::set_num_threads(2);
  const double two = grad_norm(params);
  at::set_num_threads(threads);
  CHECK(one == two);
  CHECK(one == Approx(std::sqrt(want)).epsilon(1e-13));
  // LibTorch's fp32 norm agrees to fp32's rounding.
  std::vector<torch::Tensor> grads;
  for (auto& [name, p] : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  CHECK(one ==
        Approx(torch::stack(at::_foreach_norm(grads, 2)).norm().item<double>()).epsilon(1e-6));
  params[2].second.grad()[0] = 1e20f;  // fp32 squares overflow; doubles do not
  CHECK(grad_norm(params) == Approx(double(1e20f)).epsilon(1e-12));
  params[2].second.grad()[1] = INFINITY;
  CHECK(std::isinf(grad_norm(params)));
  params[2].second.grad()[2] = NAN;
  CHECK(std::isnan(grad_norm(params)));
}

TEST_CASE("clip by value and adaptive (AutoClip percentile)", "[clip]") {
  auto p = torch::zeros({4});
  p.mutable_grad() = torch::tensor({-3.f, -0.5f, 0.5f, 3.f});
  config::ClipConfig cv;
  cv.mode = "value";
  cv.value = 1.0;
  GradClipper(cv).clip({{"p", p}}, 0);
  CHECK(torch::equal(p.grad(), torch::tensor({-1.f, -0.5f, 0.5f, 1.f})));
  config::ClipConfig ca;
  ca.mode = "adaptive";
  ca.percentile = 50;
  ca.warmup = 3;
  ca.window = 5;
  GradClipper clip(ca);
  auto q = torch::zeros({1});
  for (double n : {1.0, 2.0, 3.0}) {  // warm-up: recorded, not clipped
    q.mutable_grad() = torch::full({1}, (float)n);
    CHECK(clip.clip({{"q", q}}, n) == 0);
  }
  q.mutable_grad() = torch::full({1}, 10.f);
  const double thr = clip.clip({{"q", q}}, 10.0);  // history {1,2,3,10}: median 2.5
  CHECK(thr == Approx(2.5));
  CHECK(q.grad().item<float>() == Approx(2.5).epsilon(1e-5));
}

TEST_CASE("clip by element percentile: numpy's percentile of every |g| element", "[clip]") {
  // |g| over both tensors is 1..10: numpy.percentile(range(1, 11), 50) = 5.5, 95 -> 9.55
  auto a = torch::zeros({4}), b = torch::zeros({2, 3});
  auto reset = [&] {
    a.mutable_grad() = torch::tensor({1.f, -2.f, 3.f, -4.f});
    b.mutable_grad() = torch::tensor({5.f, -6.f, 7.f, -8.f, 9.f, -10.f}).reshape({2, 3});
  };
  config::ClipConfig c;
  c.mode = "element_percentile";
  for (auto [p, t] : {std::pair{50.0, 5.5}, {95.0, 9.55}, {100.0, 10.0}, {5.0, 1.45}}) {
    INFO(p);
    reset();
    c.element_percentile = p;
    CHECK(GradClipper(c).clip({{"a", a}, {"b", b}}, 0) == Approx(t));
    const float f = float(t);
    CHECK(torch::allclose(a.grad(), torch::tensor({1.f, -2.f, 3.f, -4.f}).clamp(-f, f)));
    CHECK(torch::allclose(b.grad().flatten(),
                          torch::tensor({5.f, -6.f, 7.f, -8.f, 9.f, -10.f}).clamp(-f, f)));
  }
}

// PyTorch's GradScaler, recorded on a GPU (tests/golden/make_grad_scaler_golden.py ran with torch
// 2.11 + CUDA on an H200; PyTorch 1.13 has the scale-update kernel for CUDA only): three scripted
// overflow patterns, the scale after every update, and whether the optimizer stepped.
TEST_CASE("loss scaler reproduces PyTorch GradScaler's recorded scale sequence", "[amp][golden]") {
  std::ifstream in(std::string(MLTRAIN_SOURCE_DIR) + "/tests/golden/grad_scaler_cuda.json");
  REQUIRE(in);
  const auto g = nlohmann::json::parse(in);
  REQUIRE(g["cases"].size() == 3);
  for (const auto& c : g["cases"]) {
    config::AmpConfig a;
    a.init_scale = c["init_scale"];
    a.growth_factor = c["growth_factor"];
    a.backoff_factor = c["backoff_factor"];
    a.growth_interval = c["growth_interval"];
    a.min_scale = 0;  // PyTorch has no floor
    LossScaler s(a);
    const auto overflow = c["overflow"].get<std::vector<int>>();
    int64_t skipped = 0;
    for (int t = 0; t < c["steps"].get<int>(); ++t) {
      INFO("init " << a.init_scale << " step " << t);
      const bool inf = std::find(overflow.begin(), overflow.end(), t) != overflow.end();
      CHECK(c["stepped"][t].get<bool>() == !inf);  // PyTorch skipped exactly the overflow steps
      s.update(inf);
      skipped += inf;
      CHECK(s.value() == c["scale_after_update"][t].get<double>());
    }
    CHECK(s.skipped() == skipped);
  }
}

// The same rule by hand, with mltrain's min_scale floor (PyTorch has none).
TEST_CASE("loss scaler follows GradScaler's scale sequence, with a floor", "[amp]") {
  config::AmpConfig c;
  c.init_scale = 65536;
  c.growth_factor = 2;
  c.backoff_factor = 0.5;
  c.growth_interval = 3;
  c.min_scale = 1;
  LossScaler s(c);
  const std::vector<bool> overflow = {false, true, true,  false, false, false,
                                      false, true, false, false, false};
  const std::vector<double> want = {65536, 32768, 16384, 16384, 16384, 32768,
                                    32768, 16384, 16384, 16384, 32768};
  for (size_t t = 0; t < overflow.size(); ++t) {
    INFO(t);
    s.update(overflow[t]);
    CHECK(s.value() == want[t]);
  }
  CHECK(s.skipped() == 3);
  c.init_scale = 4;
  LossScaler floor(c);
  for (int i = 0; i < 10; ++i) floor.update(true);
  CHECK(floor.value() == 1.0);  // min_scale holds (PyTorch would reach 2^-8)
  // unscale divides gradients and reports non-finite ones
  auto p = torch::zeros({2});
  p.mutable_grad() = torch::tensor({8.f, 16.f});
  LossScaler eight([] {
    config::AmpConfig a;
    a.init_scale = 8;
    return a;
  }());
  CHECK_FALSE(eight.unscale({{"p", p}}));
  CHECK(torch::equal(p.grad(), torch::tensor({1.f, 2.f})));
  p.mutable_grad() = torch::tensor({INFINITY, 1.f});
  CHECK(eight.unscale({{"p", p}}));
}

// A small in-memory data set: 256 samples of 8 floats, 4 classes; optionally one NaN sample.
static data::Dataset synthetic(int64_t nan_at = -1) {
  auto x = std::make_shared<std::vector<float>>(256 * 8);
  auto y = std::make_shared<std::vector<int64_t>>(256);
  for (int64_t i = 0; i < 256; ++i) {
    (*y)[i] = i % 4;
    for (int j = 0; j < 8; ++j) (*x)[i * 8 + j] = std::sin(0.1 * i + j) + 0.3 * ((*y)[i] == j % 4);
  }
  if (nan_at >= 0) (*x)[nan_at * 8] = NAN;
  data::Dataset d;
  d.source = "synthetic";
  d.dtype = data::DType::kF32;
  d.count = 256;
  d.sample_shape = {8};
  d.data = reinterpret_cast<const uint8_t*>(x->data());
  d.storage = x;
  d.labels = y;
  d.num_classes = 4;
  return d;
}

struct Rig {
  config::ExperimentConfig cfg;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<data::Loader> train, eval;
  std::unique_ptr<Trainer> trainer;
  Rig(config::ExperimentConfig c, data::Dataset ds, std::vector<int64_t> hidden = {16})
      : cfg(std::move(c)) {
    cfg.model.name = "mlp";
    cfg.model.hidden = std::move(hidden);
    cfg.model.batchnorm = false;
    cfg.model.dropout = 0;
    cfg.train.eval_every = config::Period::never();
    model = model::build_model(cfg.model, {8}, 4, 0);
    opt = optim::Optimizer::create(cfg.optim, model->named_parameters());
    data::LoaderOptions lo;
    lo.batch_size = cfg.data.batch_size;
    lo.shuffle = cfg.data.shuffle;
    lo.std = 1;
    train = std::make_unique<data::Loader>(ds, lo);
    eval = std::make_unique<data::Loader>(ds, lo);
    trainer = std::make_unique<Trainer>(cfg, *model, *opt, *train, *eval);
  }
  torch::Tensor flat() {
    std::vector<torch::Tensor> v;
    for (auto& [n, p] : model->named_parameters()) v.push_back(p.detach().flatten());
    return torch::cat(v);
  }
};

TEST_CASE("accumulation: k micro-batches of b equal one batch of k*b", "[accumulate]") {
  for (const char* opt_name : {"sgd", "adam"}) {
    INFO(opt_name);
    config::ExperimentConfig one;
    one.optim.name = opt_name;
    one.optim.lr = 0.05;
    one.data.batch_size = 64;
    one.train.duration = config::Period::steps(3);
    config::ExperimentConfig four = one;
    four.data.batch_size = 16;
    four.train.accumulate = config::Count::of(4);
    Rig a(one, synthetic()), b(four, synthetic());
    CHECK(b.trainer->accumulate() == 4);
    CHECK(b.trainer->steps_per_epoch() == a.trainer->steps_per_epoch());
    a.trainer->fit();
    b.trainer->fit();
    CHECK(a.opt->steps() == 3);
    CHECK(b.opt->steps() == 3);
    CHECK(torch::allclose(a.flat(), b.flat(), 1e-5, 1e-6));
  }
  config::ExperimentConfig g;
  g.data.batch_size = 16;
  g.train.global_batch = 64;
  g.train.accumulate = config::Count::automatic();
  CHECK(resolve_accumulate(g, 1) == 4);
  g.train.accumulate = config::Count::of(3);
  CHECK_THROWS_AS(resolve_accumulate(g, 1), ConfigError);
}

// Per-step training losses, for comparing loss curves.
struct LossCurve : Observer {
  std::vector<double>* out;
  explicit LossCurve(std::vector<double>* o) : out(o) {}
  void on_step_end(Trainer&, const StepInfo& s) override { out->push_back(s.loss); }
};

TEST_CASE("micro-batches 256, 64 and 16 give the same loss curve; out of memory halves and redoes",
          "[accumulate][memory]") {
  config::ExperimentConfig c;
  c.optim.name = "adam";
  c.optim.lr = 0.01;
  c.data.batch_size = 256;  // the whole synthetic set: one optimizer step per epoch
  c.train.duration = config::Period::steps(6);
  const torch::Device cpu(torch::kCPU);
  memory::track_cpu();
  auto run = [&](int64_t micro, bool recover, int64_t limit_above_base, int64_t* peak) {
    std::vector<double> curve;
    const int64_t base = memory::stats(cpu).live;
    Rig rig(c, synthetic(), {4096});  // wide, so activations dominate a step's memory
    rig.trainer->set_micro_batch(micro, recover);
    rig.trainer->add_observer(std::make_unique<LossCurve>(&curve));
    memory::reset_peak(cpu);
    if (limit_above_base > 0) memory::set_cpu_limit(base + limit_above_base);
    rig.trainer->fit();
    memory::set_cpu_limit(0);
    if (peak) *peak = memory::stats(cpu).peak - base;
    if (recover) {
      CHECK(rig.trainer->oom_events() >= 1);
      CHECK(rig.trainer->micro_batch() > 0);
      CHECK(rig.trainer->micro_batch() < 256);
      CHECK(rig.trainer->technique_state()["micro_batch"] == rig.trainer->micro_batch());
    }
    return curve;
  };
  int64_t peak256 = 0, peak16 = 0;
  const auto whole = run(256, false, 0, &peak256);
  const auto c64 = run(64, false, 0, nullptr);
  const auto c16 = run(16, false, 0, &peak16);
  REQUIRE(whole.size() == 6);
  for (const auto* other : {&c64, &c16}) {
    REQUIRE(other->size() == 6);
    for (size_t i = 0; i < 6; ++i)
      CHECK(std::abs((*other)[i] - whole[i]) <= 1e-5 * std::abs(whole[i]));
  }
  CHECK(whole.back() < whole.front());
  // Smaller micro-batches need less: the budget between the two peaks forces a real
  // out-of-memory error from the counting allocator at 256, which halves and redoes the step.
  INFO("peak at 256: " << peak256 << ", at 16: " << peak16);
  REQUIRE(peak256 > 2 * peak16);
  const auto recovered = run(256, true, (peak256 + peak16) / 2, nullptr);
  REQUIRE(recovered.size() == 6);
  for (size_t i = 0; i < 6; ++i)
    CHECK(std::abs(recovered[i] - whole[i]) <= 1e-5 * std::abs(whole[i]));
  // Without recovery the same budget stops with a clear error.
  CHECK_THROWS_AS(run(256, false, (peak256 + peak16) / 2, nullptr), RuntimeError);
  memory::set_cpu_limit(0);
}

TEST_CASE("gradient health: an injected NaN behaves as documented for each policy",
          "[grad_health]") {
  // Sample 40 sits in batch 2 (batch size 16, no shuffle): the third step sees a NaN gradient.
  struct Row {
    const char* policy;
    bool finite;
    int64_t steps;
    int64_t skipped;
    double lr_scale;
    bool throws;
  };
  const Row rows[] = {
      {"warn", false, 6, 0, 1.0, false},      // the update goes through: weights become NaN
      {"skip_step", true, 5, 1, 1.0, false},  // one update skipped, training goes on
      {"rollback", true, 4, 1, 0.5,
       false},  // restored to the step-1 snapshot (optimizer rewound), LR halved
      {"stop", true, 2, 0, 1.0, true},  // stops with the offender named; weights still finite
  };
  for (const auto& r : rows) {
    INFO(r.policy);
    config::ExperimentConfig c;
    c.optim.name = "sgd";
    c.optim.lr = 0.1;
    c.data.batch_size = 16;
    c.data.shuffle = false;
    c.train.duration = config::Period::steps(6);
    c.grad_health.policy = r.policy;
    c.grad_health.rollback_steps = 1;
    Rig rig(c, synthetic(/*nan_at=*/40));
    if (r.throws) {
      CHECK_THROWS_WITH(rig.trainer->fit(),
                        Catch::Contains("non-finite gradient at step 2 in body.1.weight"));
    } else {
      rig.trainer->fit();
    }
    CHECK(torch::isfinite(rig.flat()).all().item<bool>() == r.finite);
    CHECK(rig.opt->steps() == r.steps);
    CHECK(rig.trainer->progress().skipped_steps == r.skipped);
    CHECK(rig.trainer->progress().lr_scale == r.lr_scale);
  }
}

TEST_CASE("gradient health: explosions are judged against the running mean", "[grad_health]") {
  config::GradHealthConfig c;
  c.explosion_factor = 5;
  c.warmup = 3;
  GradHealth h(c);
  for (double n : {1.0, 1.2, 0.8}) CHECK(h.check(n) == GradHealth::Verdict::kOk);
  CHECK(h.check(4.0) == GradHealth::Verdict::kOk);
  CHECK(h.check(50.0) == GradHealth::Verdict::kExploding);
  CHECK(h.check(NAN) == GradHealth::Verdict::kNonFinite);
  CHECK(h.check(INFINITY) == GradHealth::Verdict::kNonFinite);
}

TEST_CASE("early stopping: patience, min_delta, thresholds, first/any/all, NaN never best",
          "[early]") {
  auto metric = [](const char* name, const char* mode, int64_t patience) {
    config::StopMetricConfig m;
    m.monitor = name;
    m.mode = mode;
    m.patience = patience;
    return m;
  };
  config::EarlyStoppingConfig c;
  c.combine = "any";
  c.metrics = {metric("eval_loss", "min", 1), metric("eval_accuracy", "max", 3)};
  EarlyStopping any(c);
  CHECK(any.update({{"eval_loss", 1.0}, {"eval_accuracy", 0.5}}, 1).empty());
  CHECK(any.update({{"eval_loss", 1.1}, {"eval_accuracy", 0.6}}, 2).empty());
  const auto why = any.update({{"eval_loss", 1.2}, {"eval_accuracy", 0.7}}, 3);
  CHECK_THAT(why, Catch::Contains("eval_loss has not improved"));  // the log names the metric
  CHECK_THAT(why, Catch::Contains("best 1.000000 at step 1"));
  c.combine = "all";
  EarlyStopping all(c);
  for (int i = 0; i < 3; ++i)
    CHECK(all.update({{"eval_loss", 1.0 + i}, {"eval_accuracy", 0.5 + i * 0.1}}, i).empty());
  c.combine = "first";
  c.metrics = {metric("eval_accuracy", "max", 0), metric("eval_loss", "min", 0)};
  EarlyStopping first(c);
  CHECK(first.update({{"eval_accuracy", 0.5}, {"eval_loss", 1.0}}, 1).empty());
  CHECK(first.update({{"eval_accuracy", 0.6}, {"eval_loss", 2.0}}, 2)
            .empty());  // loss stalls: ignored
  CHECK_FALSE(first.update({{"eval_accuracy", 0.6}, {"eval_loss", 0.5}}, 3).empty());
  // min_delta, thresholds, NaN
  auto m = metric("eval_loss", "min", 0);
  m.min_delta = 0.1;
  m.stopping_threshold = 0.2;
  m.divergence_threshold = 5;
  c.combine = "any";
  c.metrics = {m};
  EarlyStopping t(c);
  CHECK(t.update({{"eval_loss", 1.0}}, 1).empty());
  CHECK_FALSE(t.update({{"eval_loss", 0.95}}, 2).empty());  // improved by less than min_delta
  EarlyStopping th(c);
  CHECK_THAT(th.update({{"eval_loss", 0.1}}, 1), Catch::Contains("stopping threshold"));
  CHECK_THAT(th.update({{"eval_loss", 9.0}}, 2), Catch::Contains("diverged"));
  CHECK_THAT(th.update({{"eval_loss", NAN}}, 3), Catch::Contains("is nan"));
  c.metrics[0].check_finite = false;
  c.metrics[0].patience = 5;
  EarlyStopping nan_ok(c);
  nan_ok.update({{"eval_loss", NAN}}, 1);
  nan_ok.update({{"eval_loss", 2.0}}, 2);
  CHECK(nan_ok.state()[0]["best"].get<double>() == 2.0);  // NaN was never best
}

TEST_CASE("EMA: warm-up decay, swap, state round trip", "[ema]") {
  config::ModelConfig mc;
  mc.name = "mlp";
  mc.hidden = {4};
  mc.batchnorm = false;
  auto m = model::build_model(mc, {8}, 2, 0);
  config::EmaConfig ec;
  ec.decay = 0.9;
  Ema ema(ec, *m);
  auto w = m->named_parameters()[0].second;
  const auto w0 = w.detach().clone();
  {
    torch::NoGradGuard ng;
    w.add_(1.0);
  }
  ema.update();  // n = 1: decay = min(0.9, 2/11)
  const double d = 2.0 / 11.0;
  auto expect = w0 * d + (w0 + 1) * (1 - d);
  ema.swap();
  CHECK(torch::allclose(w, expect, 1e-6, 1e-6));
  ema.swap();
  CHECK(torch::allclose(w, w0 + 1, 1e-6, 1e-6));
  auto st = ema.state();
  std::map<std::string, torch::Tensor> sm(st.begin(), st.end());
  Ema other(ec, *m);
  other.load(sm);
  other.swap();
  CHECK(torch::allclose(w, expect, 1e-6, 1e-6));
}

TEST_CASE("checkpoint store: manifest last, fallback past damage, keep-last and keep-best",
          "[checkpoint]") {
  auto root = mltrain::testing::fresh_temp_dir("train_ck");
  train::CheckpointStore store(root, {/*keep_last=*/2, /*keep_best=*/1, /*maximize=*/true});
  auto writer = [](int v) {
    return [v](const fs::path& dir) {
      formats::save_safetensors((dir / "model.safetensors").string(),
                                {{"w", torch::full({4}, float(v))}});
    };
  };
  const double monitors[] = {0.5, 0.9, 0.6, 0.7};
  for (int s = 1; s <= 4; ++s) store.save(s * 10, writer(s), {{"epoch", 0}}, monitors[s - 1]);
  auto kept = store.complete();
  std::vector<std::string> names;
  for (auto& k : kept) names.push_back(k.filename().string());
  CHECK(names == std::vector<std::string>{"step_20", "step_30", "step_40"});  // best (0.9) + last 2
  std::vector<std::string> warnings;
  auto latest = store.load_latest(&warnings);
  REQUIRE(latest);
  CHECK(latest->step == 40);
  CHECK(warnings.empty());
  // Damage the newest: one flipped byte fails its SHA-256 and the store falls back.
  {
    std::fstream f(root / "step_40" / "model.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x55');
  }
  latest = store.load_latest(&warnings);
  REQUIRE(latest);
  CHECK(latest->step == 30);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("fails its SHA-256 check"));
  // A half-written checkpoint (no manifest) is never picked.
  fs::create_directories(root / "step_50");
  formats::save_safetensors((root / "step_50" / "model.safetensors").string(),
                            {{"w", torch::zeros({1})}});
  latest = store.load_latest(&warnings);
  CHECK(latest->step == 30);
  CHECK_THROWS_WITH(train::CheckpointStore::load_dir(root / "step_50"),
                    Catch::Contains("no manifest.json"));
  // Folders whose names only look like checkpoints (a step past int64) are ignored, not a throw.
  fs::create_directories(root / "step_99999999999999999999999");
  fs::create_directories(root / "step_1x");
  CHECK(train::CheckpointStore::list_complete(root).size() == 3);
  CHECK(store.load_latest(&warnings)->step == 30);
  // A manifest with wrongly typed fields is a damaged checkpoint (a reason, not an exception).
  fs::create_directories(root / "step_60");
  formats::save_safetensors((root / "step_60" / "model.safetensors").string(),
                            {{"w", torch::zeros({1})}});
  std::ofstream(root / "step_60" / "trainer.json") << "{\"step\": 60}";
  for (const char* manifest :
       {R"({"files": {"model.safetensors": {"bytes": "12", "sha256": 5}, "trainer.json": {}}})",
        R"({"files": ["model.safetensors"]})", R"({"files": {"../trainer.json": {"bytes": 1}}})",
        R"([1, 2])"}) {
    INFO(manifest);
    std::ofstream(root / "step_60" / "manifest.json") << manifest;
    CHECK_THAT(train::CheckpointStore::verify(root / "step_60"), Catch::Contains("manifest.json"));
    CHECK_THROWS_AS(train::CheckpointStore::load_dir(root / "step_60"), CheckpointError);
  }
  // A name the file system refuses (over 255 bytes: ENAMETOOLONG) is a missing file, not a
  // filesystem_error (a fuzzer finding).
  std::ofstream(root / "step_60" / "manifest.json")
      << R"({"files": {")" << std::string(300, 'm') << R"(": {"bytes": 1, "sha256": "00"}}})";
  CHECK_THAT(train::CheckpointStore::verify(root / "step_60"), Catch::Contains("is missing"));
  CHECK_THROWS_AS(train::CheckpointStore::load_dir(root / "step_60"), CheckpointError);
  // Leftovers of a killed writer are removed at the next start: a .partial checkpoint and temp
  // files of dead processes; a live process's temp file stays.
  const fs::path run = mltrain::testing::fresh_temp_dir("train_leftovers");
  fs::create_directories(run / "checkpoints" / "step_7.partial");
  std::ofstream(run / "checkpoints" / "latest.tmp.999999") << "step_7\n";
  std::ofstream(run / "status.json.tmp.999998") << "{";
  const std::string mine = "status.json.tmp." + std::to_string(::getpid());
  std::ofstream(run / mine) << "{";
  std::ofstream(run / "notes.tmp.txt") << "not ours";
  const auto removed = train::CheckpointStore::remove_leftovers(run);
  CHECK(removed.size() == 3);
  CHECK_FALSE(fs::exists(run / "checkpoints" / "step_7.partial"));
  CHECK_FALSE(fs::exists(run / "checkpoints" / "latest.tmp.999999"));
  CHECK_FALSE(fs::exists(run / "status.json.tmp.999998"));
  CHECK(fs::exists(run / mine));
  CHECK(fs::exists(run / "notes.tmp.txt"));
  // NaN monitors never count as best.
  auto root2 = mltrain::testing::fresh_temp_dir("train_ck2");
  train::CheckpointStore s2(root2, {1, 1, true});
  s2.save(1, writer(1), {{"epoch", 0}}, NAN);
  s2.save(2, writer(2), {{"epoch", 0}}, 0.1);
  s2.save(3, writer(3), {{"epoch", 0}}, 0.05);
  names.clear();
  for (auto& k : s2.complete()) names.push_back(k.filename().string());
  CHECK(names == std::vector<std::string>{"step_2", "step_3"});
}
