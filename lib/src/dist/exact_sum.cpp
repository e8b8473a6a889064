#include "mltrain/dist/exact_sum.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "mltrain/core/error.hpp"
#include "mltrain/dist/ddp.hpp"

namespace mltrain::dist {

ExactMean::ExactMean(int64_t total_shards) : shards_(std::max<int64_t>(1, total_shards)) {}

// ceil(log2(n)) for n >= 1.
static int ceil_log2(int64_t n) {
  int b = 0;
  while ((int64_t{1} << b) < n) ++b;
  return b;
}

// acc[i] += round_half_even(x[i] * scale) for |x[i] * scale| <= 2^51: adding and subtracting
// 1.5 * 2^52 rounds a double to an integer with plain IEEE additions (vectorised; no FMA can form:
// the file is compiled with -ffp-contract=off, and x * scale is exact, a power-of-two scaling).
// The first shard of a block assigns (acc[i] = ...): 0 + r is r, so the sum's bits are the same and
// the accumulator needs no zeroing pass.
__attribute__((target_clones("avx512f", "avx2", "default"))) static void add_on_grid(
    const float* x, double* acc, int64_t n, double scale, bool first) {
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  if (first) {
    for (int64_t i = 0; i < n; ++i) {
      const double y = static_cast<double>(x[i]) * scale;
      acc[i] = (y + kMagic) - kMagic;
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const double y = static_cast<double>(x[i]) * scale;
    acc[i] += (y + kMagic) - kMagic;
  }
}

// The largest |x[i]| as the bits of a float: clearing the sign bit orders finite values, infinity
// and NaN as unsigned integers (>= 0x7f800000: not finite), a max reduction that vectorises.
__attribute__((target_clones("avx512f", "avx2", "default"))) static uint32_t max_abs_bits(
    const float* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, sizeof b);
    b &= 0x7fffffffu;
    m = b > m ? b : m;
  }
  return m;
}

__attribute__((target_clones("avx512f", "avx2", "default"))) static void from_grid(
    const double* acc, float* y, int64_t n, double unscale, double shards) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(acc[i] * unscale / shards);
}

std::vector<float> ExactMean::maxima(const std::vector<torch::Tensor>& shard) {
  std::vector<float> out;
  out.reserve(shard.size());
  for (const auto& t : shard) {
    const uint32_t bits = max_abs_bits(t.data_ptr<float>(), t.numel());
    float m;
    std::memcpy(&m, &bits, sizeof m);
    out.push_back(bits < 0x7f800000u ? m : std::numeric_limits<float>::infinity());
  }
  return out;
}

std::vector<torch::Tensor> ExactMean::mean(const std::vector<std::vector<torch::Tensor>>& local,
                                           Comm* comm,
                                           const std::vector<std::vector<float>>& maxima) const {
  if (local.empty())
    throw RuntimeError("distributed.invariance", "a rank with no virtual shard",
                       "report this as a bug");
  const size_t nseg = local.front().size();
  std::vector<int64_t> offset(nseg + 1, 0);
  for (size_t g = 0; g < nseg; ++g) offset[g + 1] = offset[g] + local.front()[g].numel();
  for (const auto& shard : local)
    for (size_t g = 0; g < nseg; ++g) {
      const auto& t = shard.size() == nseg ? shard[g] : torch::Tensor();
      if (!t.defined() || t.numel() != offset[g + 1] - offset[g] ||
          t.scalar_type() != torch::kFloat || !t.is_contiguous() || !t.device().is_cpu())
        throw RuntimeError("distributed.invariance",
                           "shard segment " + std::to_string(g) +
                               " is not a contiguous fp32 CPU tensor of the first shard's size",
                           "report this as a bug");
    }
  if (!maxima.empty() &&
      (maxima.size() != local.size() ||
       std::any_of(maxima.begin(), maxima.end(), [&](const auto& m) { return m.size() != nseg; })))
    throw RuntimeError("distributed.invariance", "shard maxima that do not match the shards",
                       "report this as a bug");
  // 1. The largest magnitude of every segment over this rank's shards (NaN or inf: not finite)...
  torch::Tensor maxes = torch::zeros({int64_t(nseg)}, torch::kFloat);
  float* mx = maxes.data_ptr<float>();
  for (size_t s = 0; s < local.size(); ++s) {
    const std::vector<float> m = maxima.empty() ? ExactMean::maxima(local[s]) : maxima[s];
    for (size_t g = 0; g < nseg; ++g) mx[g] = std::max(mx[g], m[g]);  // inf wins; never NaN
  }
  // ... and over every rank (a maximum is exact in any order).
  if (comm && comm->size() > 1) {
    for (const auto& other : comm->allgather(maxes, "allgather(invariant shard maxima)"))
      maxes = torch::maximum(maxes, other);
    mx = maxes.data_ptr<float>();
  }
  // 2. Each shard on its segment's grid, summed exactly in doubles (integers below 2^53),
  //    a block at a time so the partial sums stay in cache.
  const int bits = std::min(51, 52 - ceil_log2(shards_));
  std::vector<double> scale(nseg, 0.0);
  for (size_t g = 0; g < nseg; ++g)
    if (std::isfinite(mx[g]) && mx[g] > 0)
      scale[g] = std::ldexp(1.0, bits - (std::ilogb(mx[g]) + 1));
  torch::Tensor acc = torch::empty({offset[nseg]}, torch::kDouble);
  double* a = acc.data_ptr<double>();
  constexpr int64_t kBlock = 4096;
  for (size_t g = 0; g < nseg; ++g) {
    if (scale[g] == 0.0) {  // all zero or not finite on every rank: sent as zeros, not read back
      std::fill(a + offset[g], a + offset[g + 1], 0.0);
      continue;
    }
    for (int64_t start = offset[g]; start < offset[g + 1]; start += kBlock) {
      const int64_t n = std::min(kBlock, offset[g + 1] - start);
      for (size_t s = 0; s < local.size(); ++s)
        add_on_grid(local[s][g].data_ptr<float>() + (start - offset[g]), a + start, n, scale[g],
                    s == 0);
    }
  }
  if (comm && comm->size() > 1) {
    std::vector<torch::Tensor> t = {acc};
    comm->allreduce_sum(t, "allreduce(invariant shard sums)");
    acc = t[0];
    a = acc.data_ptr<double>();
  }
  // 3. Back to fp32: the exact sum scaled back (exact) and divided by the shard count.
  std::vector<torch::Tensor> out;
  for (size_t g = 0; g < nseg; ++g) {
    const int64_t n = offset[g + 1] - offset[g];
    torch::Tensor y = torch::empty({n}, torch::kFloat);
    if (!std::isfinite(mx[g]))
      y.fill_(std::numeric_limits<float>::quiet_NaN());
    else if (scale[g] == 0.0)
      y.zero_();
    else
      from_grid(a + offset[g], y.data_ptr<float>(), n, 1.0 / scale[g], double(shards_));
    out.push_back(y);
  }
  return out;
}

}  // namespace mltrain::dist
