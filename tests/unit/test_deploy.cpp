// `mltrain fuse` and `quantize`: BatchNorm folding against the unfused modules; quantization observers against torch.ao.quantization (tests/golden/make_quant_golden.py) and
// hand-computed values; the entropy (KL) calibration's behaviour on clipped vs uniform data.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "mltrain/core/error.hpp"
#include "mltrain/deploy/fuse.hpp"
#include "mltrain/deploy/observers.hpp"

#ifndef MLTRAIN_SOURCE_DIR
#define MLTRAIN_SOURCE_DIR "."
#endif

using namespace mltrain::deploy;

static nlohmann::json quant_golden() {
  std::ifstream in(std::string(MLTRAIN_SOURCE_DIR) + "/tests/golden/quant.json");
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

TEST_CASE("qparams by hand", "[quant]") {
  auto a = affine_qparams(-1.f, 3.f, 0, 255);
  CHECK(a.scale == Approx(4.0 / 255).epsilon(1e-7));
  CHECK(a.zero_point == 64);                   // 0 - round(-1 / (4/255)) = round(63.75)
  auto r = affine_qparams(0.5f, 2.f, 0, 255);  // range widened to include 0
  CHECK(r.scale == Approx(2.0 / 255).epsilon(1e-7));
  CHECK(r.zero_point == 0);
  auto s = symmetric_qparams(-2.f, 1.f, -128, 127);
  CHECK(s.scale == Approx(2.0 / 127.5).epsilon(1e-7));
  CHECK(s.zero_point == 0);
  CHECK(symmetric_qparams(-2.f, 1.f, 0, 255).zero_point == 128);
  auto z =
      affine_qparams(0.f, 0.f, 0, 255);  // an all-zero tensor: epsilon scale, no division by zero
  CHECK(z.scale > 0);
  CHECK(z.zero_point == 0);
  CHECK_THROWS_AS(make_observer("median"), mltrain::ConfigError);
}

TEST_CASE("observers match torch.ao.quantization", "[quant][golden]") {
  const auto g = quant_golden();
  std::vector<torch::Tensor> batches;
  for (const auto& b : g["batches"])
    batches.push_back(torch::tensor(b.get<std::vector<float>>()).view({64, 16}));
  MinMaxObserver mm;
  MovingAverageMinMaxObserver ma(0.01f);
  PercentileObserver pc(99.9);
  for (auto& b : batches) mm.observe(b), ma.observe(b), pc.observe(b);
  auto check = [](const char* what, std::pair<float, float> range, QParams q,
                  const nlohmann::json& want) {
    INFO(what);
    CHECK(range.first == Approx(want["min"].get<double>()).epsilon(1e-6));
    CHECK(range.second == Approx(want["max"].get<double>()).epsilon(1e-6));
    CHECK(q.scale == Approx(want["scale"].get<double>()).epsilon(1e-6));
    CHECK(q.zero_point == want["zero_point"].get<int64_t>());
  };
  check("minmax", mm.range(), affine_qparams(mm.range().first, mm.range().second, 0, 255),
        g["minmax"]);
  check("moving average", ma.range(), affine_qparams(ma.range().first, ma.range().second, 0, 255),
        g["moving_average_minmax"]);
  MinMaxObserver relu;
  relu.observe(torch::relu(batches[0]));
  check("relu", relu.range(), affine_qparams(relu.range().first, relu.range().second, 0, 255),
        g["minmax_relu"]);
  MinMaxObserver sym;
  sym.observe(batches[1]);
  check("symmetric", sym.range(),
        symmetric_qparams(sym.range().first, sym.range().second, -128, 127), g["symmetric_int8"]);
  const auto& w = g["per_channel_weight"];
  const auto weight = torch::tensor(w["weight"].get<std::vector<float>>())
                          .view(w["shape"].get<std::vector<int64_t>>());
  const auto per = per_channel_symmetric(weight, -128, 127, 0);
  REQUIRE(per.size() == w["scale"].size());
  for (size_t c = 0; c < per.size(); ++c) {
    CHECK(per[c].scale == Approx(w["scale"][c].get<double>()).epsilon(1e-6));
    CHECK(per[c].zero_point == w["zero_point"][c].get<int64_t>());
  }
  CHECK(pc.range().first == Approx(g["percentile_99_9"]["lo"].get<double>()).epsilon(1e-5));
  CHECK(pc.range().second == Approx(g["percentile_99_9"]["hi"].get<double>()).epsilon(1e-5));
}

TEST_CASE("entropy calibration clips rare outliers and keeps a uniform range", "[quant]") {
  torch::manual_seed(1);
  auto x = torch::randn({100000});
  x.index_put_({torch::arange(0, 10)},
               torch::full({10}, 50.f) * torch::tensor({1.f, -1.f}).repeat(5));
  EntropyObserver e;
  MinMaxObserver mm;
  e.observe(x);
  mm.observe(x);
  CHECK(mm.range().second == 50.f);
  const auto [lo, hi] = e.range();
  CHECK(hi < 10.f);   // the 10 outliers are clipped: resolution goes to the bulk
  CHECK(hi > 2.5f);   // but not the body of the Gaussian
  CHECK(lo > -10.f);  // the negative outliers too, on their own side
  CHECK(lo < -2.5f);
  // An asymmetric two-sided input (normalised images: a background spike at -0.81, pixels up to 2)
  // keeps both ends; a search on |x| would clip the positive side at the spike.
  EntropyObserver img;
  auto px = torch::cat({torch::full({60000}, -0.81f), torch::rand({40000}) * 2.8f - 0.81f});
  img.observe(px);
  CHECK(img.range().first == Approx(-0.81f));
  CHECK(img.range().second > 1.8f);
  EntropyObserver u;
  u.observe(torch::rand({100000}));
  CHECK(u.range().first == 0.f);   // no negatives
  CHECK(u.range().second > 0.9f);  // nothing worth clipping
}

TEST_CASE("quantize_activation gives torch::quantize_per_tensor's integers, keeps channels-last",
          "[quant]") {
  torch::manual_seed(3);
  // Values on exact half-steps too (ties round to even in both), and out-of-range values that clamp.
  auto x =
      torch::cat({torch::randn({4, 8, 5, 5}) * 3, (torch::arange(-20, 20).to(torch::kFloat) * 0.05f)
                                                      .reshape({1, 8, 5, 1})
                                                      .expand({1, 8, 5, 5})},
                 0)
          .contiguous(at::MemoryFormat::ChannelsLast);
  for (const QParams q :
       {QParams{0.1f, 0}, QParams{0.0173f, 3}, QParams{0.05f, 128}, QParams{0.02f, 255}}) {
    const auto ours = quantize_activation(x, q);
    const auto ref = torch::quantize_per_tensor(x, q.scale, q.zero_point, torch::kQUInt8);
    INFO("scale " << q.scale << " zero point " << q.zero_point);
    CHECK(ours.is_quantized());
    CHECK(ours.q_scale() == Approx(q.scale));
    CHECK(ours.q_zero_point() == q.zero_point);
    CHECK(ours.int_repr().equal(ref.int_repr()));
    CHECK(ours.is_contiguous(at::MemoryFormat::ChannelsLast));
  }
}

// BN folding algebra against the unfused modules in eval mode, with non-trivial statistics.
TEST_CASE("fold_batchnorm equals conv+BN and linear+BN in eval mode", "[fuse]") {
  torch::manual_seed(3);
  torch::NoGradGuard ng;
  for (bool with_bias : {false, true}) {
    torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).padding(1).bias(with_bias));
    torch::nn::BatchNorm2d bn(8);
    bn->weight.uniform_(0.5, 2.0);
    bn->bias.normal_();
    bn->running_mean.normal_();
    bn->running_var.uniform_(0.1, 3.0);
    bn->eval();
    auto x = torch::randn({4, 3, 9, 9});
    const auto want = bn(conv(x));
    auto [w, b] = fold_batchnorm(conv->weight, with_bias ? conv->bias : torch::Tensor(), bn->weight,
                                 bn->bias, bn->running_mean, bn->running_var, 1e-5);
    const auto got = torch::conv2d(x, w, b, 1, 1);
    CHECK((got - want).abs().max().item<double>() < 1e-5);
    // and the per-channel rule by hand for one channel: s = gamma / sqrt(var + eps)
    const double s0 =
        bn->weight[0].item<double>() / std::sqrt(bn->running_var[0].item<double>() + 1e-5);
    CHECK(w[0][0][0][0].item<double>() ==
          Approx(conv->weight[0][0][0][0].item<double>() * s0).epsilon(1e-6));
  }
  torch::nn::Linear lin(6, 5);
  torch::nn::BatchNorm1d bn1(5);
  bn1->running_mean.normal_();
  bn1->running_var.uniform_(0.2, 2.0);
  bn1->weight.uniform_(0.5, 1.5);
  bn1->eval();
  auto x = torch::randn({7, 6});
  auto [w, b] = fold_batchnorm(lin->weight, lin->bias, bn1->weight, bn1->bias, bn1->running_mean,
                               bn1->running_var, 1e-5);
  CHECK((torch::linear(x, w, b) - bn1(lin(x))).abs().max().item<double>() < 1e-5);
}
