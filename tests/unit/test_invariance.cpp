// dist::ExactMean, the combine step of distributed.invariance: bitwise: order- and split-free sums.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "mltrain/dist/exact_sum.hpp"

using mltrain::dist::ExactMean;

using Shards = std::vector<std::vector<torch::Tensor>>;

// Shards of a gradient with values over many magnitudes, as real gradients have: each shard its
// segments of the given sizes.
static Shards random_shards(int64_t count, const std::vector<int64_t>& segments, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-30, 4);
  Shards shards;
  for (int64_t s = 0; s < count; ++s) {
    std::vector<torch::Tensor> shard;
    for (const int64_t n : segments) {
      auto t = torch::empty({n}, torch::kFloat);
      float* p = t.data_ptr<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = std::ldexp(normal(gen), exponent(gen));
      shard.push_back(t);
    }
    shards.push_back(shard);
  }
  return shards;
}

static torch::Tensor flat(const std::vector<torch::Tensor>& segments) {
  return torch::cat(segments);
}

TEST_CASE(
    "exact mean (invariance: bitwise): the same bits for any order and any split of the shards, "
    "within fp32's rounding of the exact mean, and the grid's 2^-46 of each segment's largest",
    "[dist][invariance]") {
  const std::vector<int64_t> segments = {1000, 24, 1};
  const int64_t n = 1025, v = 12;
  const auto shards = random_shards(v, segments, 42);
  const ExactMean em(v);
  const torch::Tensor all = flat(em.mean(shards, nullptr));
  // Any order of the shards (a different rank holding each, or another world's local sum first).
  auto reversed = shards;
  std::reverse(reversed.begin(), reversed.end());
  CHECK(torch::equal(flat(em.mean(reversed, nullptr)), all));
  std::mt19937 gen(7);
  for (int k = 0; k < 5; ++k) {
    auto shuffled = shards;
    std::shuffle(shuffled.begin(), shuffled.end(), gen);
    CHECK(torch::equal(flat(em.mean(shuffled, nullptr)), all));
  }
  // Maxima taken by the caller (each shard's, while it is in cache) give the same bits.
  std::vector<std::vector<float>> maxima;
  for (const auto& s : shards) maxima.push_back(ExactMean::maxima(s));
  CHECK(torch::equal(flat(em.mean(shards, nullptr, maxima)), all));
  CHECK_THROWS_WITH(em.mean(shards, nullptr, {maxima.front()}),
                    Catch::Contains("maxima that do not match the shards"));
  // The plain fp32 sum is not order-free: the reason for the integer grid.
  auto fp32 = [](const Shards& ts) {
    torch::Tensor acc = torch::zeros_like(flat(ts[0]));
    for (const auto& t : ts) acc += flat(t);
    return acc / double(ts.size());
  };
  CHECK_FALSE(torch::equal(fp32(shards), fp32(reversed)));
  // Accuracy against the double-precision mean, segment by segment.
  torch::Tensor exact = torch::zeros({n}, torch::kDouble);
  for (const auto& s : shards) exact += flat(s).to(torch::kDouble);
  exact /= double(v);
  int64_t off = 0;
  for (const int64_t len : segments) {
    const auto want = exact.narrow(0, off, len);
    const auto got = all.narrow(0, off, len).to(torch::kDouble);
    const double scale = std::max(want.abs().max().item<double>(), 1e-30);
    const double err = (got - want).abs().max().item<double>();
    // fp32's own rounding of the result, plus the grid's 2^-47 of the segment's largest input
    // (which may be up to 12 times the mean's largest).
    CHECK(err <= 6e-8 * scale + std::ldexp(12 * scale, -46));
    // Elements within 2^-20 of the largest keep fp32's precision: relative error <= 2^-23.
    const auto big = want.abs() >= scale * std::ldexp(1.0, -20);
    CHECK(((got - want).abs() / want.abs()).masked_select(big).max().item<double>() <= 1.2e-7);
    off += len;
  }
}

TEST_CASE("exact mean: zero segments stay zero, a non-finite element makes its segment NaN",
          "[dist][invariance]") {
  const ExactMean em(2);
  const std::vector<torch::Tensor> a = {torch::tensor({1.f, -2.f, 0.5f}), torch::zeros({2})};
  const std::vector<torch::Tensor> b = {torch::tensor({3.f, 2.f, INFINITY}), torch::zeros({2})};
  const auto m = em.mean({a, b}, nullptr);
  CHECK(torch::isnan(m[0]).all().item<bool>());
  CHECK(torch::equal(m[1], torch::zeros({2})));
  CHECK(ExactMean::maxima(b) == std::vector<float>{INFINITY, 0.f});
  CHECK(ExactMean::maxima({torch::tensor({-4.f, 3.f, NAN})})[0] == INFINITY);
  const auto m2 = em.mean({a, b}, nullptr, {ExactMean::maxima(a), ExactMean::maxima(b)});
  CHECK(torch::isnan(m2[0]).all().item<bool>());
  CHECK(torch::equal(m2[1], torch::zeros({2})));
  const std::vector<torch::Tensor> c = {torch::tensor({3.f, 2.f, 1.5f}), torch::zeros({2})};
  const auto ok = em.mean({a, c}, nullptr);
  CHECK(torch::equal(ok[0], torch::tensor({2.f, 0.f, 1.f})));
  CHECK_THROWS_WITH(em.mean({a, {torch::zeros({4}), torch::zeros({2})}}, nullptr),
                    Catch::Contains("not a contiguous fp32 CPU tensor"));
}
