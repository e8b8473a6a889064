// model: the registry's shapes, names and init; TorchScript models from C++.
#include <catch2/catch.hpp>

#include "temp_dir.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include "mltrain/core/error.hpp"
#include "mltrain/model/batchnorm.hpp"
#include "mltrain/model/dropout.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"
#include "mltrain/runtime/compat.hpp"

using namespace mltrain;

#ifndef MLTRAIN_SOURCE_DIR
#define MLTRAIN_SOURCE_DIR "."
#endif

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
  // The field guide's two, with PyTorch's fans. A 32x64 matrix: fan_in 64, fan_out 32, so the
  // uniform bound is sqrt(3 / (64 sqrt(32))) = 0.091030 and the normal's std 1/8.
  auto u = torch::empty({32, 64});
  model::init_weights({{"fc.weight", u}}, "layer_adaptive_uniform");
  CHECK(u.abs().max().item<double>() <= 0.091030);
  CHECK(u.abs().max().item<double>() > 0.09);
  CHECK(u.std().item<double>() == Approx(0.091030 / std::sqrt(3.0)).epsilon(0.05));
  // a conv kernel 16x8x3x3: fan_in 72, fan_out 144: bound sqrt(3 / (72 * 12)) = 0.058926
  auto kc = torch::empty({16, 8, 3, 3});
  model::init_weights({{"conv.weight", kc}}, "layer_adaptive_uniform");
  CHECK(kc.abs().max().item<double>() <= 0.058926);
  CHECK(kc.abs().max().item<double>() > 0.057);
  auto n = torch::empty({256, 400});
  model::init_weights({{"fc.weight", n}}, "lecun_normal");
  CHECK(n.std().item<double>() == Approx(0.05).epsilon(0.02));
  CHECK(n.mean().item<double>() == Approx(0.0).margin(0.002));
  auto bias = torch::ones({3});
  model::init_weights({{"fc.bias", bias}}, "xavier_uniform");
  CHECK(bias.abs().sum().item<float>() == 0.f);
}

// Counter-based dropout (model/dropout.hpp): its draws, its gradient, and what it must not depend on.
TEST_CASE("dropout: keep rate, independence of neighbours and keys", "[model][dropout]") {
  const int64_t n = 1 << 20;
  std::vector<uint8_t> a(n), b(n);
  for (double p : {0.1, 0.25, 0.5, 0.9}) {
    INFO("p = " << p);
    model::dropout_keep_mask(0x9E3779B97F4A7C15ull, p, 0, n, a.data());
    // Kept count: binomial(n, 1 - p), within 5 standard deviations.
    double kept = 0, both = 0;
    for (int64_t i = 0; i < n; ++i) kept += a[i];
    for (int64_t i = 0; i + 1 < n; ++i) both += a[i] & a[i + 1];
    const double q = 1 - p, sd = std::sqrt(n * q * (1 - q));
    CHECK(std::abs(kept - n * q) < 5 * sd);
    // Neighbours independent: P(i and i+1 kept) = q^2 (the pairs overlap: 5 sd of a loose bound).
    const double sd2 = std::sqrt(3.0 * n * q * q * (1 - q * q));
    CHECK(std::abs(both - (n - 1) * q * q) < 5 * sd2);
    // Another key: agreement as for two independent masks, q^2 + p^2.
    model::dropout_keep_mask(0x9E3779B97F4A7C16ull, p, 0, n, b.data());
    double agree = 0;
    for (int64_t i = 0; i < n; ++i) agree += a[i] == b[i];
    const double r = q * q + p * p;
    CHECK(std::abs(agree - n * r) < 5 * std::sqrt(n * r * (1 - r)));
  }
  // A stretch of the stream is the same elements of the whole, at any offset (blocks of 4096).
  model::dropout_keep_mask(42, 0.5, 0, n, a.data());
  for (int64_t off : {int64_t(1), int64_t(4095), int64_t(4096), int64_t(12345)}) {
    model::dropout_keep_mask(42, 0.5, off, 10000, b.data());
    CHECK(std::equal(b.begin(), b.begin() + 10000, a.begin() + off));
  }
}

TEST_CASE(
    "dropout: y = x * mask / (1 - p), the gradient the same mask; same bits on 1 or 2 threads",
    "[model][dropout]") {
  const double p = 0.3;
  const float s = static_cast<float>(1.0 / (1.0 - p));
  torch::manual_seed(7);
  auto x = (torch::randn({300, 700}) + 5).requires_grad_();  // 210,000 elements, none zero
  auto y = model::dropout(x, p, /*training=*/true);
  const auto kept = y.detach() != 0;
  const double rate = kept.to(torch::kDouble).mean().item<double>();
  CHECK(rate == Approx(0.7).margin(0.005));
  CHECK(torch::equal(y.detach(), x.detach() * kept.to(torch::kFloat) * s));
  // d(sum(y * w))/dx = w * mask * s, the upstream gradient non-contiguous (a transposed tensor).
  auto w = torch::randn({700, 300}).t();
  (y * w).sum().backward();
  CHECK(torch::equal(x.grad(), w * kept.to(torch::kFloat) * s));
  // The draw follows the CPU generator: the same seed, the same mask; whatever the thread count.
  const int threads = at::get_num_threads();
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    torch::manual_seed(7);
    auto x2 = torch::randn({300, 700}) + 5;
    CHECK(torch::equal(model::dropout(x2, p, true), y.detach()));
  }
  at::set_num_threads(threads);
  // A saved generator state gives the mask again (checkpoints, activation checkpointing's replay).
  const auto state = compat::cpu_rng_state();
  auto first = model::dropout(x.detach(), p, true);
  compat::set_cpu_rng_state(state);
  CHECK(torch::equal(model::dropout(x.detach(), p, true), first));
  CHECK_FALSE(torch::equal(model::dropout(x.detach(), p, true), first));
  // Evaluation and p = 0: the input itself.
  CHECK(model::dropout(x, p, false).is_same(x));
  CHECK(model::dropout(x, 0, true).is_same(x));
  // A dropped NaN stays NaN (x * 0), as in PyTorch; p = 1 drops everything.
  auto nan = torch::full({4096}, std::numeric_limits<float>::quiet_NaN());
  CHECK(torch::isnan(model::dropout(nan, 0.5, true)).all().item<bool>());
  CHECK(model::dropout(torch::ones({64}), 1.0, true).abs().sum().item<float>() == 0.f);
}

TEST_CASE("dropout: channels-last, double, bf16 and a second derivative", "[model][dropout]") {
  const double p = 0.5;
  torch::manual_seed(3);
  // Channels-last input: the output keeps its layout, and kept elements are x * 2.
  auto x = (torch::rand({8, 16, 5, 5}) + 1).contiguous(at::MemoryFormat::ChannelsLast);
  auto y = model::dropout(x, p, true);
  CHECK(y.is_contiguous(at::MemoryFormat::ChannelsLast));
  auto kept = (y != 0).to(torch::kFloat);
  CHECK(torch::equal(y, x * kept * 2));
  // Other dtypes take ATen's arithmetic on the same mask.
  for (auto dtype : {torch::kDouble, torch::kBFloat16}) {
    torch::manual_seed(3);
    auto xd = (torch::rand({8, 16, 5, 5}) + 1).contiguous(at::MemoryFormat::ChannelsLast);
    auto yd = model::dropout(xd.to(dtype).requires_grad_(), p, true);
    CHECK(torch::equal((yd != 0).to(torch::kFloat), kept));
    yd.sum().backward();
  }
  // create_graph: the gradient is a function of the upstream gradient, mask * 2.
  auto xg = torch::ones({64}, torch::requires_grad());
  auto yg = model::dropout(xg, p, true);
  auto up = torch::ones({64}, torch::requires_grad());
  auto g = torch::autograd::grad({yg}, {xg}, {up}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  CHECK(g.requires_grad());
  auto gg = torch::autograd::grad({g.sum()}, {up})[0];
  CHECK(torch::equal(gg, yg.detach()));  // xg = 1: y is mask * 2 too
}

namespace {

// A BatchNorm2d of C channels with random affine parameters (some gammas negative) and running
// statistics, and its copy in another dtype.
torch::nn::BatchNorm2d random_bn(int64_t C, torch::Dtype dtype = torch::kFloat,
                                 std::optional<double> momentum = 0.1) {
  torch::manual_seed(C);
  torch::nn::BatchNorm2d bn(torch::nn::BatchNorm2dOptions(C).momentum(momentum));
  torch::NoGradGuard no_grad;
  bn->weight.copy_(torch::randn({C}));
  bn->bias.copy_(torch::randn({C}));
  bn->running_mean.copy_(torch::randn({C}));
  bn->running_var.copy_(torch::rand({C}) + 0.5);
  bn->to(dtype);
  return bn;
}

struct BnRun {
  torch::Tensor out, dx, dw, db, rm, rv;
  int64_t batches = 0;
};

// One forward and backward of relu(max_pool2d(bn(x), 2)) against upstream gradient `up`.
template <class F>
BnRun bn_run(const F& f, torch::nn::BatchNorm2d& bn, const torch::Tensor& x0,
             const torch::Tensor& up) {
  auto x = x0.detach().clone().requires_grad_();
  auto out = f(x, *bn);
  (out * up.to(out.scalar_type())).sum().backward();
  return {out.detach().to(torch::kFloat),         x.grad().to(torch::kFloat),
          bn->weight.grad().to(torch::kFloat),    bn->bias.grad().to(torch::kFloat),
          bn->running_mean.to(torch::kFloat),     bn->running_var.to(torch::kFloat),
          bn->num_batches_tracked.item<int64_t>()};
}

void check_close(const torch::Tensor& a, const torch::Tensor& b, double tol) {
  const double scale = std::max(1.0, b.abs().max().item<double>());
  INFO("max |a - b| = " << (a - b).abs().max().item<double>() << ", scale " << scale);
  CHECK(torch::allclose(a, b, /*rtol=*/0, /*atol=*/tol * scale));
}

}  // namespace

TEST_CASE("batchnorm_pool_relu: PyTorch's BatchNorm2d, max_pool2d and relu, in one node",
          "[model][batchnorm]") {
  const auto fused = [](const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn) {
    return model::batchnorm_pool_relu(x, bn);
  };
  const auto aten = [](const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn) {
    return model::batchnorm_pool_relu_aten(x, bn);
  };
  // Even and odd sizes (an odd last row and column belong to no window), one block and many.
  for (auto shape : {std::vector<int64_t>{4, 8, 6, 6},
                     {3, 5, 7, 9},
                     {2, 3, 2, 3},
                     {16, 32, 28, 28},
                     {8, 64, 14, 14}}) {
    const int64_t C = shape[1];
    INFO("shape " << torch::IntArrayRef(shape));
    torch::manual_seed(11);
    const auto x = (torch::randn(shape) * 3 + 1).contiguous(at::MemoryFormat::ChannelsLast);
    const auto up = torch::randn({shape[0], C, shape[2] / 2, shape[3] / 2});
    // The reference: PyTorch's three operators in double.
    auto bn_ref = random_bn(C, torch::kDouble), bn_aten = random_bn(C), bn_fused = random_bn(C);
    const auto ref = bn_run(aten, bn_ref, x.to(torch::kDouble), up);
    const auto a = bn_run(aten, bn_aten, x, up);
    const auto f = bn_run(fused, bn_fused, x, up);
    CHECK(f.out.is_contiguous(at::MemoryFormat::ChannelsLast));
    CHECK(f.dx.is_contiguous(at::MemoryFormat::ChannelsLast));
    CHECK(f.batches == 1);
    // At least as close to the double reference as ATen's float operators are, within 2e-6.
    for (auto [fv, av, rv] : {std::tuple{f.out, a.out, ref.out},
                              {f.dx, a.dx, ref.dx},
                              {f.dw, a.dw, ref.dw},
                              {f.db, a.db, ref.db},
                              {f.rm, a.rm, ref.rm},
                              {f.rv, a.rv, ref.rv}}) {
      const double scale = std::max(1.0, rv.abs().max().item<double>());
      const double err_f = (fv - rv).abs().max().item<double>() / scale;
      const double err_a = (av - rv).abs().max().item<double>() / scale;
      INFO("fused error " << err_f << ", ATen float error " << err_a);
      CHECK(err_f <= std::max(2e-6, 4 * err_a));
    }
    // The same bits on 1 and 2 threads.
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    auto bn_one = random_bn(C);
    const auto one = bn_run(fused, bn_one, x, up);
    at::set_num_threads(threads);
    for (auto [u, v] : {std::pair{one.out, f.out},
                        {one.dx, f.dx},
                        {one.dw, f.dw},
                        {one.db, f.db},
                        {one.rm, f.rm},
                        {one.rv, f.rv}})
      CHECK(torch::equal(u, v));
    // Evaluation uses the running statistics: the same as PyTorch's.
    bn_aten->eval();
    bn_fused->eval();
    torch::NoGradGuard no_grad;
    check_close(fused(x, *bn_fused), aten(x, *bn_aten), 2e-6);
  }
}

TEST_CASE("batchnorm_pool_relu: ties, NaN, the cumulative average and the fallbacks",
          "[model][batchnorm]") {
  const int64_t C = 6;
  const auto fused = [](const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn) {
    return model::batchnorm_pool_relu(x, bn);
  };
  const auto aten = [](const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn) {
    return model::batchnorm_pool_relu_aten(x, bn);
  };
  // Ties (integer inputs: equal x, equal y): the gradient goes to the window's first maximum.
  torch::manual_seed(5);
  auto x = torch::randint(0, 3, {4, C, 8, 8})
               .to(torch::kFloat)
               .contiguous(at::MemoryFormat::ChannelsLast);
  auto up = torch::randn({4, C, 4, 4});
  {
    auto bn_a = random_bn(C, torch::kDouble), bn_f = random_bn(C);
    const auto a = bn_run(aten, bn_a, x.to(torch::kDouble), up);
    const auto f = bn_run(fused, bn_f, x, up);
    check_close(f.out, a.out, 2e-6);
    check_close(f.dx, a.dx, 2e-5);
    check_close(f.dw, a.dw, 2e-5);
  }
  // momentum None: the running statistics are the cumulative average over batches.
  {
    auto bn_a = random_bn(C, torch::kFloat, std::nullopt),
         bn_f = random_bn(C, torch::kFloat, std::nullopt);
    for (int step = 0; step < 3; ++step) {
      auto xs = (torch::randn({4, C, 8, 8}) + step).contiguous(at::MemoryFormat::ChannelsLast);
      bn_run(aten, bn_a, xs, up);
      bn_run(fused, bn_f, xs, up);
    }
    CHECK(bn_f->num_batches_tracked.item<int64_t>() == 3);
    check_close(bn_f->running_mean, bn_a->running_mean, 2e-6);
    check_close(bn_f->running_var, bn_a->running_var, 2e-6);
  }
  // A NaN wins its window and stays NaN through the ReLU, as in PyTorch.
  {
    auto xn = x.clone();
    xn.index_put_({1, 2, 3, 4}, std::numeric_limits<float>::quiet_NaN());
    auto bn_a = random_bn(C), bn_f = random_bn(C);
    torch::NoGradGuard no_grad;
    const auto a = aten(xn, *bn_a), f = fused(xn, *bn_f);
    CHECK(torch::equal(torch::isnan(a), torch::isnan(f)));
    CHECK(std::isnan(f.index({1, 2, 1, 2}).item<float>()));
  }
  // What the fused path does not take runs ATen's operators: the same bits.
  for (int which = 0; which < 3; ++which) {
    INFO("fallback " << which);
    auto xi = which == 0 ? x.contiguous() : x;  // NCHW
    auto bn_a = random_bn(C, which == 1 ? torch::kDouble : torch::kFloat);
    auto bn_f = random_bn(C, which == 1 ? torch::kDouble : torch::kFloat);
    if (which == 1) xi = xi.to(torch::kDouble);
    if (which == 2) {  // no affine parameters
      bn_a = torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(C).affine(false));
      bn_f = torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(C).affine(false));
    }
    auto xa = xi.clone().requires_grad_(), xf = xi.clone().requires_grad_();
    auto a = aten(xa, *bn_a), f = fused(xf, *bn_f);
    CHECK(torch::equal(a, f));
    (a * up.to(a.scalar_type())).sum().backward();
    (f * up.to(f.scalar_type())).sum().backward();
    CHECK(torch::equal(xa.grad(), xf.grad()));
  }
}

TEST_CASE("relu_max_pool2d: max_pool2d(relu(x), 2) and its gradient bit for bit",
          "[model][batchnorm]") {
  // The values are copies (no arithmetic), so fused and ATen must agree exactly: even and odd
  // sizes (an odd last row and column get no gradient), ties (integers), windows all <= 0, NaN,
  // 1 and 2 threads.
  torch::manual_seed(7);
  const auto run = [](const torch::Tensor& x, const torch::Tensor& up, bool fused) {
    auto xi = x.clone().requires_grad_();
    auto out = fused ? model::relu_max_pool2d(xi) : model::relu_max_pool2d_aten(xi);
    (out * up).sum().backward();
    return std::make_pair(out.detach(), xi.grad());
  };
  for (const auto& shape : {std::vector<int64_t>{3, 5, 8, 8}, std::vector<int64_t>{2, 17, 9, 7},
                            std::vector<int64_t>{1, 3, 2, 3}}) {
    for (const bool ties : {false, true}) {
      INFO("shape " << shape[1] << "x" << shape[2] << "x" << shape[3] << " ties " << ties);
      auto x = ties ? torch::randint(-2, 2, shape).to(torch::kFloat) : torch::randn(shape);
      x = x.contiguous(at::MemoryFormat::ChannelsLast);
      const auto up = torch::randn({shape[0], shape[1], shape[2] / 2, shape[3] / 2});
      const auto [fo, fg] = run(x, up, true);
      const auto [ao, ag] = run(x, up, false);
      CHECK(fo.is_contiguous(at::MemoryFormat::ChannelsLast));
      CHECK(torch::equal(fo, ao));
      CHECK(torch::equal(fg, ag));
      using torch::indexing::Slice;
      if (shape[2] % 2) CHECK(fg.index({Slice(), Slice(), -1}).abs().sum().item<float>() == 0);
      if (shape[3] % 2)
        CHECK(fg.index({Slice(), Slice(), Slice(), -1}).abs().sum().item<float>() == 0);
      const int threads = at::get_num_threads();
      at::set_num_threads(1);
      const auto [f1, g1] = run(x, up, true);
      at::set_num_threads(threads);
      CHECK(torch::equal(f1, fo));
      CHECK(torch::equal(g1, fg));
    }
  }
  // A NaN wins its window and passes its gradient (threshold_backward's rule), as in PyTorch.
  auto x = torch::randn({2, 4, 6, 6}).contiguous(at::MemoryFormat::ChannelsLast);
  x.index_put_({1, 2, 3, 4}, std::numeric_limits<float>::quiet_NaN());
  const auto up = torch::randn({2, 4, 3, 3});
  const auto [fo, fg] = run(x, up, true);
  const auto [ao, ag] = run(x, up, false);
  CHECK(std::isnan(fo.index({1, 2, 1, 2}).item<float>()));
  CHECK(torch::equal(torch::isnan(fo), torch::isnan(ao)));
  CHECK(torch::equal(fo.nan_to_num(0), ao.nan_to_num(0)));
  CHECK(torch::equal(fg, ag));
  CHECK(fg.index({1, 2, 3, 4}).item<float>() == up.index({1, 2, 1, 2}).item<float>());
  // What the kernel does not take (NCHW, double) runs ATen's operators; a 1-pixel side is
  // refused as ATen refuses it.
  for (const auto& xi : {x.contiguous(), x.to(torch::kDouble)}) {
    torch::NoGradGuard no_grad;
    CHECK(torch::equal(model::relu_max_pool2d(xi).nan_to_num(0),
                       model::relu_max_pool2d_aten(xi).nan_to_num(0)));
  }
  CHECK_THROWS(model::relu_max_pool2d(
      torch::randn({2, 4, 1, 6}).contiguous(at::MemoryFormat::ChannelsLast)));
}

TEST_CASE("batchnorm_relu: relu(bn(x) + residual) as PyTorch's operators, in float and bf16",
          "[model][batchnorm]") {
  for (bool with_residual : {false, true})
    for (auto shape : {std::vector<int64_t>{4, 8, 5, 7}, {16, 32, 28, 28}, {2, 3, 1, 2}}) {
      const int64_t C = shape[1];
      INFO("shape " << torch::IntArrayRef(shape) << (with_residual ? ", residual" : ""));
      torch::manual_seed(13);
      const auto x = (torch::randn(shape) * 2 + 1).contiguous(at::MemoryFormat::ChannelsLast);
      const auto r0 = torch::randn(shape).contiguous(at::MemoryFormat::ChannelsLast);
      const auto up = torch::randn(shape);
      struct Out {
        torch::Tensor out, dx, dr, dw, db, rm, rv;
      };
      // One forward and backward at `dtype`, fused or through ATen's operators.
      auto run = [&](torch::Dtype dtype, bool fused, torch::Dtype bn_dtype) {
        auto bn = random_bn(C, bn_dtype);
        auto xi = x.to(dtype).detach().requires_grad_();
        auto ri = r0.to(dtype).detach().requires_grad_();
        const torch::Tensor r = with_residual ? ri : torch::Tensor();
        auto out =
            fused ? model::batchnorm_relu(xi, *bn, r) : model::batchnorm_relu_aten(xi, *bn, r);
        CHECK(out.scalar_type() == dtype);
        (out.to(torch::kDouble) * up.to(torch::kDouble)).sum().backward();
        return Out{out.detach().to(torch::kDouble),
                   xi.grad().to(torch::kDouble),
                   with_residual ? ri.grad().to(torch::kDouble) : torch::zeros({1}, torch::kDouble),
                   bn->weight.grad().to(torch::kDouble),
                   bn->bias.grad().to(torch::kDouble),
                   bn->running_mean.to(torch::kDouble),
                   bn->running_var.to(torch::kDouble)};
      };
      const Out ref = run(torch::kDouble, false, torch::kDouble);
      // float: within 2e-6 of the double reference, or as close as ATen's float operators.
      // bf16 (autocast's dtype, float parameters): as close as ATen's bf16 operators, within 2x.
      for (auto [dtype, floor] : {std::pair{torch::kFloat, 2e-6}, {torch::kBFloat16, 1e-3}}) {
        INFO("dtype " << dtype);
        const Out a = run(dtype, false, torch::kFloat), f = run(dtype, true, torch::kFloat);
        const std::vector<std::tuple<const char*, torch::Tensor, torch::Tensor, torch::Tensor>>
            rows = {{"out", f.out, a.out, ref.out},     {"dx", f.dx, a.dx, ref.dx},
                    {"dr", f.dr, a.dr, ref.dr},         {"dgamma", f.dw, a.dw, ref.dw},
                    {"dbeta", f.db, a.db, ref.db},      {"running_mean", f.rm, a.rm, ref.rm},
                    {"running_var", f.rv, a.rv, ref.rv}};
        for (const auto& [name, fv, av, rv] : rows) {
          const double scale = std::max(1.0, rv.abs().max().item<double>());
          const double err_f = (fv - rv).abs().max().item<double>() / scale;
          const double err_a = (av - rv).abs().max().item<double>() / scale;
          INFO(name << ": fused error " << err_f << ", ATen error " << err_a);
          CHECK(err_f <= std::max(floor, 2 * err_a));
        }
      }
      // The same bits on 1 and 2 threads, in both dtypes.
      for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
        const Out two = run(dtype, true, torch::kFloat);
        const int threads = at::get_num_threads();
        at::set_num_threads(1);
        const Out one = run(dtype, true, torch::kFloat);
        at::set_num_threads(threads);
        CHECK(torch::equal(one.out, two.out));
        CHECK(torch::equal(one.dx, two.dx));
        CHECK(torch::equal(one.dr, two.dr));
        CHECK(torch::equal(one.dw, two.dw));
      }
      // Evaluation: the running statistics, as PyTorch's.
      auto bn_a = random_bn(C), bn_f = random_bn(C);
      bn_a->eval();
      bn_f->eval();
      torch::NoGradGuard no_grad;
      const torch::Tensor r = with_residual ? r0 : torch::Tensor();
      check_close(model::batchnorm_relu(x, *bn_f, r), model::batchnorm_relu_aten(x, *bn_a, r),
                  2e-6);
    }
  // Outside the fused path (NCHW, a residual in another layout): ATen's operators, same bits.
  auto bn_a = random_bn(6), bn_f = random_bn(6);
  const auto x = torch::randn({4, 6, 5, 5});
  const auto r = torch::randn({4, 6, 5, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  CHECK(torch::equal(model::batchnorm_relu(x, *bn_f, r), model::batchnorm_relu_aten(x, *bn_a, r)));
  const auto xc = x.contiguous(at::MemoryFormat::ChannelsLast);
  CHECK(torch::equal(model::batchnorm_relu(xc, *bn_f, r.contiguous()),
                     model::batchnorm_relu_aten(xc, *bn_a, r.contiguous())));
}

// The exported graph's entry (model/script_kernels.hpp's BatchNorm rewrites): aten.batch_norm's
// own tensors and flags, then relu (with or without a residual) or hardswish. Against a double
// reference run through ATen's operators, at least as close as ATen's float (bf16) operators
// are, for the output, every gradient and the running statistics; the same bits on 1 and 2
// threads; evaluation on the running statistics; no running statistics; and the cases the
// kernel does not take run ATen's operators exactly.
TEST_CASE("batch_norm_act: aten.batch_norm then relu, add + relu, hardswish or silu, as ATen's",
          "[model][batchnorm]") {
  using model::Activation;
  struct Case {
    Activation act;
    bool residual, track;
  };
  for (const Case k :
       {Case{Activation::kRelu, false, true}, Case{Activation::kRelu, true, true},
        Case{Activation::kHardswish, false, true}, Case{Activation::kHardswish, false, false},
        Case{Activation::kSilu, false, true}})
    for (auto shape : {std::vector<int64_t>{4, 8, 5, 7}, {8, 24, 16, 16}}) {
      const int64_t C = shape[1];
      INFO("shape " << torch::IntArrayRef(shape) << " activation " << static_cast<int>(k.act)
                    << " residual " << k.residual << " running stats " << k.track);
      torch::manual_seed(17);
      // Scaled so hardswish sees all three of its pieces (below -3, between, above 3).
      const auto x = (torch::randn(shape) * 3 + 0.5).contiguous(at::MemoryFormat::ChannelsLast);
      const auto r0 = torch::randn(shape).contiguous(at::MemoryFormat::ChannelsLast);
      const auto up = torch::randn(shape);
      const auto w0 = torch::randn({C}) * 2, b0 = torch::randn({C});
      const auto rm0 = torch::randn({C}), rv0 = torch::rand({C}) + 0.5;
      struct Out {
        torch::Tensor out, dx, dr, dw, db, rm, rv;
      };
      auto run = [&](torch::Dtype dtype, bool fused, torch::Dtype param_dtype, bool training) {
        auto xi = x.to(dtype).detach().requires_grad_();
        auto ri = r0.to(dtype).detach().requires_grad_();
        // Copies (to() of the same dtype would hand back the tensor itself).
        auto w = w0.to(param_dtype).clone().requires_grad_();
        auto b = b0.to(param_dtype).clone().requires_grad_();
        auto rm = k.track ? rm0.to(param_dtype).clone() : torch::Tensor();
        auto rv = k.track ? rv0.to(param_dtype).clone() : torch::Tensor();
        const torch::Tensor r = k.residual ? ri : torch::Tensor();
        auto f = fused ? model::batch_norm_act : model::batch_norm_act_aten;
        auto d = [](const torch::Tensor& t) {
          return t.defined() ? t.to(torch::kDouble) : torch::zeros({1}, torch::kDouble);
        };
        if (!training) {  // evaluation, as predict runs it: no gradient (the fused forward alone)
          torch::NoGradGuard no_grad;
          auto out = f(xi, w, b, rm, rv, false, 0.1, 1e-5, false, k.act, r);
          const auto z = torch::zeros({1}, torch::kDouble);
          return Out{out.to(torch::kDouble), z, z, z, z, d(rm), d(rv)};
        }
        auto out = f(xi, w, b, rm, rv, training, 0.1, 1e-5, false, k.act, r);
        CHECK(out.scalar_type() == dtype);
        // The fused path ran (one node of mltrain's), not ATen's operators.
        if (fused && dtype != torch::kDouble)
          CHECK_THAT(out.grad_fn()->name(), Catch::Matchers::Contains("Bn"));
        (out.to(torch::kDouble) * up.to(torch::kDouble)).sum().backward();
        return Out{out.detach().to(torch::kDouble),
                   d(xi.grad()),
                   k.residual ? d(ri.grad()) : torch::zeros({1}, torch::kDouble),
                   d(w.grad()),
                   d(b.grad()),
                   d(rm),
                   d(rv)};
      };
      for (const bool training : {true, false}) {
        if (!training && !k.track) continue;  // evaluation normalises with running statistics
        INFO("training " << training);
        const Out ref = run(torch::kDouble, false, torch::kDouble, training);
        for (auto [dtype, floor] : {std::pair{torch::kFloat, 2e-6}, {torch::kBFloat16, 1e-3}}) {
          INFO("dtype " << dtype);
          const Out a = run(dtype, false, torch::kFloat, training);
          const Out f = run(dtype, true, torch::kFloat, training);
          for (const auto& [name, fv, av, rv] :
               std::vector<std::tuple<const char*, torch::Tensor, torch::Tensor, torch::Tensor>>{
                   {"out", f.out, a.out, ref.out},
                   {"dx", f.dx, a.dx, ref.dx},
                   {"dr", f.dr, a.dr, ref.dr},
                   {"dgamma", f.dw, a.dw, ref.dw},
                   {"dbeta", f.db, a.db, ref.db},
                   {"running_mean", f.rm, a.rm, ref.rm},
                   {"running_var", f.rv, a.rv, ref.rv}}) {
            const double scale = std::max(1.0, rv.abs().max().item<double>());
            const double err_f = (fv - rv).abs().max().item<double>() / scale;
            const double err_a = (av - rv).abs().max().item<double>() / scale;
            INFO(name << ": fused error " << err_f << ", ATen error " << err_a);
            CHECK(err_f <= std::max(floor, 2 * err_a));
          }
        }
      }
      // The same bits on 1 and 2 threads.
      const Out two = run(torch::kFloat, true, torch::kFloat, true);
      const int threads = at::get_num_threads();
      at::set_num_threads(1);
      const Out one = run(torch::kFloat, true, torch::kFloat, true);
      at::set_num_threads(threads);
      CHECK(torch::equal(one.out, two.out));
      CHECK(torch::equal(one.dx, two.dx));
      CHECK(torch::equal(one.dw, two.dw));
      CHECK(torch::equal(one.rm, two.rm));
    }
  // What the kernel does not take runs ATen's operators: the same bits as the reference
  // function (NCHW input; a residual in another layout; hardswish with a residual).
  const auto w = torch::randn({6}), b = torch::randn({6});
  const auto xn = torch::randn({4, 6, 5, 5}), xc = xn.contiguous(at::MemoryFormat::ChannelsLast);
  const auto r = torch::randn({4, 6, 5, 5});
  for (const auto& [x, res, act] :
       {std::tuple{xn, torch::Tensor(), Activation::kHardswish},
        {xc, r, Activation::kRelu},
        {xc, r.contiguous(at::MemoryFormat::ChannelsLast), Activation::kHardswish},
        {xn, torch::Tensor(), Activation::kSilu}}) {
    auto rm_a = torch::zeros({6}), rv_a = torch::ones({6});
    auto rm_f = rm_a.clone(), rv_f = rv_a.clone();
    CHECK(torch::equal(
        model::batch_norm_act(x, w, b, rm_f, rv_f, true, 0.1, 1e-5, false, act, res),
        model::batch_norm_act_aten(x, w, b, rm_a, rv_a, true, 0.1, 1e-5, false, act, res)));
    CHECK(torch::equal(rm_f, rm_a));
    CHECK(torch::equal(rv_f, rv_a));
  }
}

TEST_CASE("pipeline units: the chain of units is the model's forward, parameters owned in order",
          "[model][pipeline]") {
  config::ModelConfig mc;
  mc.widths = {8, 16};
  mc.depths = {1, 2};
  mc.dropout = 0;
  for (const char* name : {"mlp", "resnet"}) {
    INFO(name);
    mc.name = name;
    auto m = model::build_model(mc, {1, 28, 28}, 10, 0);
    m->set_training(false);  // BatchNorm: running statistics, the same in both passes
    const int64_t n = m->num_units();
    // mlp: flatten, (linear, batchnorm, relu) x 2, linear; resnet: stem, 3 blocks, head.
    CHECK(n == (std::string(name) == "mlp" ? 8 : 5));
    const auto x = torch::randn({4, 1, 28, 28});
    const auto whole = m->forward(x);
    auto chained = x;
    for (int64_t u = 0; u < n; ++u) chained = m->forward_units(chained, u, u + 1);
    CHECK(torch::equal(whole, chained));
    CHECK(torch::equal(whole, m->forward_units(m->forward_units(x, 0, 2), 2, n)));
    int64_t prev = 0;
    for (const auto& [pname, p] : m->named_parameters()) {
      const int64_t u = m->unit_of(pname);
      INFO(pname << " -> unit " << u);
      CHECK(u >= prev);
      CHECK(u < n);
      prev = u;
    }
    CHECK(prev == n - 1);  // the output layer is the last unit's
  }
  // gpt: embeddings, 2 blocks, head; the output layer reuses the embedding (a tied weight).
  mc.name = "gpt";
  mc.n_layer = 2;
  mc.n_head = 2;
  mc.n_embd = 16;
  mc.block_size = 8;
  auto gpt = model::build_model(mc, {8}, 40, 0);
  gpt->set_training(false);
  REQUIRE(gpt->num_units() == 4);
  const auto idx = torch::randint(0, 40, {3, 8}, torch::kLong);
  auto h = idx;
  for (int64_t u = 0; u < 4; ++u) h = gpt->forward_units(h, u, u + 1);
  CHECK(torch::equal(gpt->forward(idx), h));
  CHECK(gpt->unit_of("wte.weight") == 0);
  {  // model.embedding_noise: N(0, sigma^2) on the token embeddings in training only
    auto noisy_cfg = mc;
    noisy_cfg.embedding_noise = 0.5;
    noisy_cfg.dropout = 0;
    auto noisy = model::build_model(noisy_cfg, {8}, 40, 0);  // same seed: same weights
    noisy->set_training(false);
    const auto clean = gpt->forward_units(idx, 0, 1);
    CHECK(torch::equal(noisy->forward_units(idx, 0, 1), clean));
    noisy->set_training(true);
    const auto diff = noisy->forward_units(idx, 0, 1) - clean;
    CHECK(diff.std().item<double>() == Approx(0.5).epsilon(0.15));
    CHECK(diff.mean().item<double>() == Approx(0.0).margin(0.1));
  }
  CHECK(gpt->units_using("wte.weight") == std::vector<int64_t>{0, 3});
  CHECK(gpt->unit_of("h.1.attn.c_attn.weight") == 2);
  CHECK(gpt->units_using("ln_f.weight") == std::vector<int64_t>{3});
  mc.name = "cnn";
  auto cnn = model::build_model(mc, {1, 28, 28}, 10, 0);
  CHECK(cnn->num_units() == 0);
  CHECK_THROWS_AS(cnn->forward_units(torch::randn({1, 1, 28, 28}), 0, 1), ConfigError);
}

// The GPT of the model.share tests: 3 blocks of width 8 (2 heads), a window of 6, no dropout.
static config::ModelConfig tiny_gpt() {
  config::ModelConfig mc;
  mc.name = "gpt";
  mc.n_layer = 3;
  mc.n_head = 2;
  mc.n_embd = 8;
  mc.block_size = 6;
  mc.dropout = 0;
  return mc;
}

TEST_CASE("gpt model.share gated (SmartShare): the unshared model with sigmoid(gate) x base",
          "[model]") {
  config::ModelConfig mc = tiny_gpt();
  const int64_t V = 20, C = 8, L = 3, T = 6;
  auto plain = model::build_model(mc, {T}, V, 1);
  mc.share = "gated";
  auto shared = model::build_model(mc, {T}, V, 1);
  // Counts by hand: embeddings V C + T C; per block two norms (4 C) and four biases (9 C); the
  // final norm 2 C; the four weight matrices 12 C^2 per block unshared, once shared, plus a gate
  // per block and matrix.
  const int64_t common = V * C + T * C + L * 13 * C + 2 * C;
  CHECK(plain->num_parameters() == common + L * 12 * C * C);
  CHECK(shared->num_parameters() == common + 12 * C * C + 4 * L);
  const int64_t saved = plain->num_parameters() - shared->num_parameters();
  CHECK_THAT(shared->describe(),
             Catch::EndsWith(fmt::format("; share gated: {:.1f} % fewer parameters than the {} "
                                         "unshared)",
                                         100.0 * double(saved) / double(plain->num_parameters()),
                                         plain->num_parameters())));
  std::map<std::string, torch::Tensor> sp, pp;
  for (auto& [n, p] : shared->named_parameters()) sp[n] = p;
  for (auto& [n, p] : plain->named_parameters()) pp[n] = p;
  const std::vector<std::pair<std::string, std::string>> roles = {{"c_attn", "attn.c_attn"},
                                                                  {"attn_proj", "attn.c_proj"},
                                                                  {"c_fc", "mlp.c_fc"},
                                                                  {"mlp_proj", "mlp.c_proj"}};
  CHECK(sp.at("share.c_attn").sizes() == torch::IntArrayRef{3 * C, C});
  CHECK(sp.at("share.mlp_proj").sizes() == torch::IntArrayRef{C, 4 * C});
  CHECK(sp.count("h.0.attn.c_attn.weight") == 0);
  CHECK(sp.at("h.2.mlp.c_proj.gate").item<double>() == 0.0);
  // Init: a base at twice the unshared std, so sigmoid(0) x base starts at it (N(0, 0.02)).
  CHECK(sp.at("share.c_fc").std().item<double>() == Approx(0.04).epsilon(0.15));
  CHECK(shared->unit_of("share.c_fc") == 1);
  CHECK(shared->units_using("share.c_fc") == std::vector<int64_t>{1, 2, 3});

  // Distinct gates per block and matrix; the unshared model gets every other tensor as is and
  // sigmoid(gate) x base as each block's weight.
  {
    torch::NoGradGuard no_grad;
    for (int64_t i = 0; i < L; ++i)
      for (size_t r = 0; r < roles.size(); ++r)
        sp.at("h." + std::to_string(i) + "." + roles[r].second + ".gate")
            .fill_(-1.5 + 0.9 * double(i) + 0.3 * double(r));
    for (auto& [n, p] : pp)
      if (sp.count(n)) p.copy_(sp.at(n));
    for (int64_t i = 0; i < L; ++i)
      for (const auto& [base, layer] : roles) {
        const std::string pre = "h." + std::to_string(i) + "." + layer;
        pp.at(pre + ".weight").copy_(torch::sigmoid(sp.at(pre + ".gate")) * sp.at("share." + base));
      }
  }
  plain->set_training(true);
  shared->set_training(true);
  const auto idx = torch::randint(0, V, {2, T}, torch::kLong);
  const auto ys = shared->forward(idx), yp = plain->forward(idx);
  CHECK(torch::allclose(ys, yp, 1e-5, 1e-6));
  const auto r = torch::randn_like(yp);
  (ys * r).sum().backward();
  (yp * r).sum().backward();
  // d/d base = sum_i sigmoid(g_i) dL/dW_i; d/d g_i = sigmoid'(g_i) <dL/dW_i, base>.
  for (const auto& [base, layer] : roles) {
    INFO(base);
    auto want = torch::zeros_like(sp.at("share." + base));
    for (int64_t i = 0; i < L; ++i) {
      const std::string pre = "h." + std::to_string(i) + "." + layer;
      const auto s = torch::sigmoid(sp.at(pre + ".gate")).detach();
      const auto gw = pp.at(pre + ".weight").grad();
      want += s * gw;
      const double dg = (s * (1 - s) * (gw * sp.at("share." + base).detach()).sum()).item<double>();
      CHECK(sp.at(pre + ".gate").grad().item<double>() == Approx(dg).epsilon(1e-4).margin(1e-7));
    }
    CHECK(torch::allclose(sp.at("share." + base).grad(), want, 1e-4, 1e-6));
  }
  CHECK(torch::allclose(sp.at("wte.weight").grad(), pp.at("wte.weight").grad(), 1e-4, 1e-6));
}

TEST_CASE("gpt model.share gated_input: a gate from the prefix mean of each layer's input",
          "[model]") {
  config::ModelConfig mc = tiny_gpt();
  const int64_t V = 20, C = 8, L = 3, T = 6;
  mc.share = "gated";
  auto scalar = model::build_model(mc, {T}, V, 1);
  mc.share = "gated_input";
  auto input = model::build_model(mc, {T}, V, 1);
  // As gated, less the 4 L scalar gates, plus a gate layer per base: [L, in] and [L], with in C
  // for three bases and 4 C for the MLP's output projection.
  const int64_t gate_layers = 3 * (L * C + L) + (L * 4 * C + L);
  CHECK(input->num_parameters() == scalar->num_parameters() - 4 * L + gate_layers);
  const int64_t unshared = input->num_parameters() - gate_layers + (L - 1) * 12 * C * C;
  CHECK_THAT(input->describe(),
             Catch::EndsWith(fmt::format(
                 "; share gated_input: {:.1f} % fewer parameters than "
                 "the {} unshared)",
                 100.0 * double(unshared - input->num_parameters()) / double(unshared), unshared)));
  std::map<std::string, torch::Tensor> ip, sp;
  for (auto& [n, p] : input->named_parameters()) ip[n] = p;
  for (auto& [n, p] : scalar->named_parameters()) sp[n] = p;
  CHECK(ip.at("share.gate.mlp_proj.weight").sizes() == torch::IntArrayRef{L, 4 * C});
  CHECK(ip.at("share.gate.c_attn.bias").sizes() == torch::IntArrayRef{L});
  CHECK(ip.at("share.gate.c_fc.weight").abs().sum().item<double>() == 0.0);  // sigmoid 1/2
  CHECK(ip.count("h.0.attn.c_attn.gate") == 0);
  CHECK(input->units_using("share.gate.c_fc.weight") == std::vector<int64_t>{1, 2, 3});

  const std::vector<std::pair<std::string, std::string>> roles = {{"c_attn", "attn.c_attn"},
                                                                  {"attn_proj", "attn.c_proj"},
                                                                  {"c_fc", "mlp.c_fc"},
                                                                  {"mlp_proj", "mlp.c_proj"}};
  // With zero gate weights the gate is sigmoid(bias_i) at every position: the scalar-gated model
  // whose logits are those biases, to float precision, forward and backward.
  {
    torch::NoGradGuard no_grad;
    for (auto& [n, p] : sp)
      if (ip.count(n)) p.copy_(ip.at(n));
    for (size_t r = 0; r < roles.size(); ++r)
      for (int64_t i = 0; i < L; ++i) {
        const double logit = -1.2 + 0.7 * double(i) + 0.4 * double(r);
        ip.at("share.gate." + roles[r].first + ".bias")[i].fill_(logit);
        sp.at("h." + std::to_string(i) + "." + roles[r].second + ".gate").fill_(logit);
      }
  }
  input->set_training(true);
  scalar->set_training(true);
  const auto idx = torch::randint(0, V, {2, T}, torch::kLong);
  const auto yi = input->forward(idx), ys = scalar->forward(idx);
  CHECK(torch::allclose(yi, ys, 1e-5, 1e-6));
  const auto r = torch::randn_like(ys);
  (yi * r).sum().backward();
  (ys * r).sum().backward();
  for (size_t k = 0; k < roles.size(); ++k) {
    INFO(roles[k].first);
    CHECK(torch::allclose(ip.at("share." + roles[k].first).grad(),
                          sp.at("share." + roles[k].first).grad(), 1e-4, 1e-6));
    for (int64_t i = 0; i < L; ++i)  // d/d bias_i = d/d logit_i of the scalar gate
      CHECK(ip.at("share.gate." + roles[k].first + ".bias").grad()[i].item<double>() ==
            Approx(sp.at("h." + std::to_string(i) + "." + roles[k].second + ".gate")
                       .grad()
                       .item<double>())
                .epsilon(1e-4)
                .margin(1e-7));
    // The gate weights learn: their gradient is the bias's times the prefix means, not zero.
    CHECK(ip.at("share.gate." + roles[k].first + ".weight").grad().abs().sum().item<double>() > 0);
  }

  // Input-dependent gates: the output changes with the gate weights, yet position t still sees
  // only tokens 1..t (a whole-window mean would let the last token move every position).
  {
    torch::NoGradGuard no_grad;
    for (const auto& [base, layer] : roles) ip.at("share.gate." + base + ".weight").normal_(0, 2.0);
  }
  input->set_training(false);
  torch::NoGradGuard no_grad;
  const auto y1 = input->forward(idx);
  CHECK_FALSE(torch::allclose(y1, yi, 1e-3, 1e-4));
  auto idx2 = idx.clone();
  idx2.select(1, T - 1).fill_(0);
  idx2.select(1, T - 1) += (idx.select(1, T - 1) + 7) % V;  // another last token
  const auto y2 = input->forward(idx2);
  CHECK(torch::allclose(y1.narrow(1, 0, T - 1), y2.narrow(1, 0, T - 1), 1e-6, 1e-7));
  CHECK_FALSE(torch::allclose(y1.select(1, T - 1), y2.select(1, T - 1), 1e-4, 1e-5));
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

// model.script_kernels=mltrain: dropout and "ReLU, 2 x 2 pool" of a user's graph on mltrain's
// kernels, computing what the saved graph does (tests/golden/make_script_golden.py).
TEST_CASE("TorchScript graphs on mltrain's kernels: PyTorch's values and gradients", "[model]") {
  std::ifstream in(std::string(MLTRAIN_SOURCE_DIR) + "/tests/golden/script_net.json");
  const auto golden = nlohmann::json::parse(in);
  const auto vec = [](const nlohmann::json& j) {
    return torch::tensor(j.get<std::vector<float>>());
  };
  const auto x = vec(golden["input"]).reshape({6, 1, 13, 13});
  const auto w = vec(golden["weights"]).reshape({6, 10});
  for (const std::string executor : {"legacy", "profiling"})
    for (const std::string kernels : {"mltrain", "aten"}) {
      INFO(executor << " executor, " << kernels << " kernels");
      config::ModelConfig mc;
      mc.name = "torchscript";
      mc.path = std::string(MLTRAIN_SOURCE_DIR) + "/tests/golden/script_net.pt";
      mc.script_executor = executor;
      mc.script_kernels = kernels;
      auto m = model::build_model(mc, {1, 13, 13}, 10, 0);
      // Two dropouts and the 2 x 2 pool; the 3 x 3 pool after a ReLU stays ATen's.
      CHECK((m->describe().find("mltrain kernels: 2 dropout, 1 relu+max_pool2d)") !=
             std::string::npos) == (kernels == "mltrain"));
      CHECK((m->describe().find("mltrain kernels") == std::string::npos) == (kernels == "aten"));
      m->set_training(false);
      for (int run = 0; run < 3; ++run) {  // past the profiling executor's profiled runs
        for (auto& [n, p] : m->named_parameters()) p.mutable_grad() = torch::Tensor();
        const auto out = m->forward(x);
        (out * w).sum().backward();
        CHECK(torch::allclose(out, vec(golden["output"]).reshape({6, 10}), 1e-5, 1e-6));
        for (auto& [n, p] : m->named_parameters()) {
          INFO(n << ", run " << run);
          REQUIRE(p.grad().defined());
          CHECK(torch::allclose(p.grad().contiguous().flatten(), vec(golden["grads"][n]), 1e-4,
                                1e-6));
        }
      }
      // Training: dropout draws from the CPU generator: the same seed, the same outputs.
      m->set_training(true);
      torch::NoGradGuard no_grad;
      torch::manual_seed(21);
      const auto a = m->forward(x);
      const auto b = m->forward(x);
      torch::manual_seed(21);
      CHECK(torch::equal(m->forward(x), a));
      CHECK_FALSE(torch::equal(a, b));
    }
  torch::jit::getProfilingMode() = true;  // LibTorch's default, for the tests after this one
}

// model.script_executor picks TorchScript's graph executor (legacy: less memory on CPU, see
// README "Memory"); both must train to the same losses from the same seed.
TEST_CASE("TorchScript executors: legacy and profiling train identically", "[model]") {
  auto losses = [](const std::string& executor) {
    config::ModelConfig mc;
    mc.name = "torchscript";
    mc.path = std::string(MLTRAIN_SOURCE_DIR) + "/tests/golden/tiny_script.pt";
    mc.script_executor = executor;
    auto m = model::build_model(mc, {1, 28, 28}, 10, 0);
    CHECK(torch::jit::getProfilingMode() == (executor == "profiling"));
    auto opt = optim::Optimizer::create(config::OptimConfig{}, m->named_parameters());
    torch::manual_seed(3);
    auto x = torch::randn({16, 1, 28, 28});
    auto y = torch::randint(0, 10, {16});
    std::vector<double> out;
    for (int i = 0; i < 8; ++i) {  // past the profiling executor's profiled runs
      auto loss = torch::nn::functional::cross_entropy(m->forward(x), y);
      opt->zero_grad();
      loss.backward();
      opt->step(1e-3);
      out.push_back(loss.item<double>());
    }
    return out;
  };
  const auto legacy = losses("legacy"), profiling = losses("profiling");
  REQUIRE(legacy.size() == profiling.size());
  for (size_t i = 0; i < legacy.size(); ++i) CHECK(legacy[i] == Approx(profiling[i]).epsilon(1e-5));
  CHECK(legacy.back() < legacy.front());
  torch::jit::getProfilingMode() = true;  // LibTorch's default, for the tests after this one
}
