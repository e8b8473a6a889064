// Engine: kernel route, optimizers (PyTorch goldens), models, safetensors, checkpoints, SHA-256.
#include <catch2/catch.hpp>

#include "temp_dir.hpp"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mltrain/core/error.hpp"
#include "mltrain/core/runtime.hpp"
#include "mltrain/core/sha256.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"
#include "mltrain/train/checkpoint.hpp"
#include "mltrain/formats/safetensors.hpp"

using namespace mltrain;
namespace fs = std::filesystem;

#ifndef MLTRAIN_SOURCE_DIR
#define MLTRAIN_SOURCE_DIR "."
#endif

static fs::path tmpdir(const std::string& name) {
  return mltrain::testing::fresh_temp_dir("engine_" + name);
}

TEST_CASE(
    "kernel route: oneDNN sgemm matches LibTorch's kernel for mm/addmm/linear and their gradients",
    "[route]") {
  torch::manual_seed(1);
  struct Shape {
    int64_t m, k, n;
  };
  for (auto s : {Shape{128, 784, 512}, Shape{7, 3, 5}, Shape{1, 64, 1}, Shape{33, 1, 17}}) {
    INFO(s.m << "x" << s.k << "x" << s.n);
    auto a = torch::randn({s.m, s.k}), b = torch::randn({s.k, s.n}), bias = torch::randn({s.n});
    auto w = torch::randn({s.n, s.k}, torch::requires_grad());
    auto x = torch::randn({s.m, s.k}, torch::requires_grad());
    runtime::set_kernel_route("native");
    auto mm_ref = torch::mm(a, b), addmm_ref = torch::addmm(bias, a, b, 0.5, 2.0);
    auto mmT_ref = torch::mm(b.t(), a.t());  // transposed views: no copy on the fast path
    auto y_ref = torch::nn::functional::linear(x, w, bias);
    y_ref.sum().backward();
    auto gw_ref = w.grad().clone(), gx_ref = x.grad().clone();
    w.mutable_grad() = torch::Tensor();
    x.mutable_grad() = torch::Tensor();
    runtime::set_kernel_route("onednn");
    REQUIRE(runtime::kernel_route() == "onednn");
    const double tol = 1e-4 * std::sqrt(double(s.k));
    CHECK(torch::allclose(torch::mm(a, b), mm_ref, tol, tol));
    CHECK(torch::allclose(torch::addmm(bias, a, b, 0.5, 2.0), addmm_ref, tol, tol));
    CHECK(torch::allclose(torch::mm(b.t(), a.t()), mmT_ref, tol, tol));
    auto y = torch::nn::functional::linear(x, w, bias);
    CHECK(torch::allclose(y, y_ref, tol, tol));
    y.sum().backward();
    CHECK(torch::allclose(w.grad(), gw_ref, tol * 10, tol * 10));
    CHECK(torch::allclose(x.grad(), gx_ref, tol * 10, tol * 10));
    // out= and in-place variants, and dtypes the fast path leaves to LibTorch.
    auto out = torch::empty({0});
    torch::mm_out(out, a, b);
    CHECK(torch::allclose(out, mm_ref, tol, tol));
    auto c = addmm_ref.clone();
    c.addmm_(a, b);
    CHECK(torch::allclose(c, addmm_ref + mm_ref, tol * 4, tol * 4));
    auto ad = a.to(torch::kDouble), bd = b.to(torch::kDouble);
    CHECK(torch::allclose(torch::mm(ad, bd), mm_ref.to(torch::kDouble), tol, tol));
  }
  // beta = 0 ignores NaNs in self, as LibTorch does.
  auto nan_self = torch::full({2, 2}, NAN);
  auto r = torch::addmm(nan_self, torch::eye(2), torch::eye(2), /*beta=*/0, /*alpha=*/1);
  CHECK(torch::equal(r, torch::eye(2)));
  CHECK_THROWS_AS(runtime::set_kernel_route("mkl"), ConfigError);
}

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

TEST_CASE("models: shapes, parameter names, init schemes", "[model]") {
  config::ModelConfig mc;
  for (const char* name : {"mlp", "cnn", "resnet"}) {
    INFO(name);
    mc.name = name;
    mc.widths = {8, 16};
    mc.depths = {1, 1};
    auto m = model::build_model(mc, {1, 28, 28}, 10, 0);
    auto y = m->forward(torch::randn({4, 1, 28, 28}));
    CHECK(y.sizes() == torch::IntArrayRef({4, 10}));
    CHECK(m->num_parameters() > 1000);
    // Same seed, same weights.
    auto m2 = model::build_model(mc, {1, 28, 28}, 10, 0);
    auto p1 = m->named_parameters(), p2 = m2->named_parameters();
    for (size_t i = 0; i < p1.size(); ++i) CHECK(torch::equal(p1[i].second, p2[i].second));
  }
  mc.name = "cnn";
  auto cnn = model::build_model(mc, {1, 28, 28}, 10, 0);
  CHECK(cnn->named_parameters()[0].first == "conv1.weight");
  // orthogonal init: W W^T = I for a wide matrix
  auto w = torch::empty({8, 32});
  model::init_weights({{"fc.weight", w}}, "orthogonal");
  CHECK(torch::allclose(torch::mm(w, w.t()), torch::eye(8), 1e-4, 1e-4));
  auto k = torch::empty({256, 512});
  model::init_weights({{"fc.weight", k}}, "kaiming_normal");
  CHECK(k.std().item<double>() == Approx(std::sqrt(2.0 / 512)).epsilon(0.05));
  auto bias = torch::ones({3});
  model::init_weights({{"fc.bias", bias}}, "xavier_uniform");
  CHECK(bias.abs().sum().item<float>() == 0.f);
}

TEST_CASE("TorchScript models load, run and train from C++", "[model]") {
  config::ModelConfig mc;
  mc.name = "torchscript";
  mc.path = std::string(MLTRAIN_SOURCE_DIR) + "/tests/golden/tiny_script.pt";
  auto m = model::build_model(mc, {1, 28, 28}, 10, 0);
  auto params = m->named_parameters();
  CHECK(params.front().first == "conv.weight");
  config::OptimConfig oc;
  auto opt = optim::Optimizer::create(oc, params);
  auto x = torch::randn({16, 1, 28, 28});
  auto y = torch::randint(0, 10, {16});
  double first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    auto loss = torch::nn::functional::cross_entropy(m->forward(x), y);
    opt->zero_grad();
    loss.backward();
    opt->step(1e-2);
    (i == 0 ? first : last) = loss.item<double>();
  }
  CHECK(last < first * 0.5);  // it memorises a fixed batch
  mc.path = "/nonexistent.pt";
  CHECK_THROWS_AS(model::build_model(mc, {1, 28, 28}, 10, 0), ConfigError);
}

TEST_CASE("SHA-256 matches FIPS 180-4 test vectors", "[sha256]") {
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 h;  // streaming in odd chunk sizes equals one shot
  std::string million(1000000, 'a');
  for (size_t i = 0; i < million.size(); i += 333)
    h.update(million.data() + i, std::min<size_t>(333, million.size() - i));
  CHECK(h.hex() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("safetensors: round trip, layout, corruption", "[safetensors]") {
  auto d = tmpdir("st");
  auto path = (d / "t.safetensors").string();
  auto a = torch::arange(6, torch::kFloat32).reshape({2, 3});
  auto b = torch::tensor({1, 2, 3}, torch::kInt64);
  formats::save_safetensors(path, {{"a", a}, {"b", b}, {"a_t", a.t()}}, {{"step", "3"}});
  std::map<std::string, std::string> meta;
  auto back = formats::load_safetensors(path, &meta);
  CHECK(torch::equal(back.at("a"), a));
  CHECK(torch::equal(back.at("b"), b));
  CHECK(torch::equal(back.at("a_t"), a.t().contiguous()));
  CHECK(meta.at("step") == "3");
  std::ifstream in(path, std::ios::binary);
  uint64_t hlen = 0;
  in.read(reinterpret_cast<char*>(&hlen), 8);
  CHECK(hlen % 8 == 0);
  fs::resize_file(path, fs::file_size(path) - 4);
  CHECK_THROWS_WITH(formats::load_safetensors(path), Catch::Contains("do not fit the file"));
  std::ofstream(path, std::ios::binary) << std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8);
  CHECK_THROWS_AS(formats::load_safetensors(path), CheckpointError);
}

TEST_CASE("checkpoint store: manifest last, fallback past damage, keep-last and keep-best",
          "[checkpoint]") {
  auto root = tmpdir("ck");
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
  // NaN monitors never count as best.
  auto root2 = tmpdir("ck2");
  train::CheckpointStore s2(root2, {1, 1, true});
  s2.save(1, writer(1), {{"epoch", 0}}, NAN);
  s2.save(2, writer(2), {{"epoch", 0}}, 0.1);
  s2.save(3, writer(3), {{"epoch", 0}}, 0.05);
  names.clear();
  for (auto& k : s2.complete()) names.push_back(k.filename().string());
  CHECK(names == std::vector<std::string>{"step_2", "step_3"});
}

#include "mltrain/optim/schedule.hpp"

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
