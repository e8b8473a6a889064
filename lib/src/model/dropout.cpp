// Counter-based dropout (model/dropout.hpp). Element i of a call with key k is kept when
// mix(mix(lo(i) ^ lo(k)) + (hi(k) ^ hi(i))) < (1 - p) * 2^32, mix being a two-round
// multiply-xorshift hash of 32 bits (multipliers from Wellons' hash-prospector search, bias
// ~0.11). The loops below vectorise (AVX2 / AVX-512 copies beside the plain one); the work is
// split over LibTorch's threads, which cannot change any element's draw.
#include "mltrain/model/dropout.hpp"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "mltrain/runtime/compat.hpp"
#include "mltrain/runtime/runtime.hpp"

namespace mltrain::model {
namespace {

constexpr int64_t kBlock = 4096;     // a power of two: no block crosses a 2^32 boundary of i
constexpr int64_t kGrain = 1 << 16;  // below this many elements one thread does it all

inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21f0aaadu;
  x ^= x >> 15;
  x *= 0xd35a2d97u;
  x ^= x >> 15;
  return x;
}

// One call's draw: the key's halves and the keep threshold (1 - p) 2^32.
struct Draw {
  uint32_t k0, k1, threshold;
  Draw(uint64_t key, double p)
      : k0(static_cast<uint32_t>(key)), k1(static_cast<uint32_t>(key >> 32)) {
    const double t = std::ldexp(1.0 - p, 32);
    threshold = t >= 4294967295.0 ? 0xffffffffu : static_cast<uint32_t>(t);
  }
};

// Elements [i0, i0 + n) of one block (i0's high half fixed across it).
__attribute__((target_clones("avx512f", "avx2", "default"))) void mask_block(const Draw& d,
                                                                             int64_t i0, int64_t n,
                                                                             uint8_t* out) {
  // Locals: stores through uint8_t* may alias d, which would be read again every element.
  const uint32_t lo = static_cast<uint32_t>(i0), k0 = d.k0, threshold = d.threshold;
  const uint32_t hi = d.k1 ^ static_cast<uint32_t>(static_cast<uint64_t>(i0) >> 32);
  for (int64_t j = 0; j < n; ++j)
    out[j] = mix32(mix32((lo + static_cast<uint32_t>(j)) ^ k0) + hi) < threshold;
}

// y = x * (mask * s): a kept element scaled, a dropped one times zero. Forward and backward.
__attribute__((target_clones("avx512f", "avx2", "default"))) void apply_block(const float* x,
                                                                              const uint8_t* m,
                                                                              float s, float* y,
                                                                              int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = x[j] * (static_cast<float>(m[j]) * s);
}

// f(i, n) over [begin, end) cut at multiples of kBlock.
template <typename F>
void aligned_blocks(int64_t begin, int64_t end, const F& f) {
  for (int64_t i = begin; i < end;) {
    const int64_t stop = std::min(end, (i / kBlock + 1) * kBlock);
    f(i, stop - i);
    i = stop;
  }
}

// The same over [0, total), the blocks spread over the threads.
template <typename F>
void for_each_block(int64_t total, const F& f) {
  runtime::parallel_for(0, total, kGrain, [&](int64_t b, int64_t e) { aligned_blocks(b, e, f); });
}

float scale_of(double p) { return static_cast<float>(1.0 / (1.0 - p)); }

// t * mask / (1 - p) with ATen's arithmetic: dtypes other than float, and a graph of the backward.
torch::Tensor scaled_by_mask(const torch::Tensor& t, const torch::Tensor& mask, float s) {
  return t * mask.to(t.scalar_type()).mul_(s);
}

// Same strides as the mask, so element i of one is element i of the other in memory.
torch::Tensor like_mask(const torch::Tensor& t, const torch::Tensor& mask) {
  if (t.strides() == mask.strides() && t.is_non_overlapping_and_dense()) return t;
  return torch::empty_like(mask, t.options()).copy_(t);
}

struct DropoutFn : torch::autograd::Function<DropoutFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& in,
                               double p) {
    // A row of its own in `mltrain profile`: a custom function records none.
    RECORD_FUNCTION("mltrain::dropout", std::vector<c10::IValue>());
    const torch::Tensor x = in.is_non_overlapping_and_dense() ? in : in.contiguous();
    const Draw draw(compat::cpu_rng_next64(), p);
    auto mask = torch::empty_like(x, x.options().dtype(torch::kUInt8));
    const float s = scale_of(p);
    torch::Tensor y;
    uint8_t* m = mask.data_ptr<uint8_t>();
    if (x.scalar_type() == torch::kFloat) {
      y = torch::empty_like(x);
      const float* xp = x.data_ptr<float>();
      float* yp = y.data_ptr<float>();
      for_each_block(x.numel(), [&](int64_t i, int64_t n) {
        mask_block(draw, i, n, m + i);
        apply_block(xp + i, m + i, s, yp + i, n);
      });
    } else {
      for_each_block(x.numel(), [&](int64_t i, int64_t n) { mask_block(draw, i, n, m + i); });
      y = scaled_by_mask(x, mask, s);
    }
    ctx->save_for_backward({mask});
    ctx->saved_data["scale"] = static_cast<double>(s);
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor mask = ctx->get_saved_variables()[0];
    const float s = static_cast<float>(ctx->saved_data["scale"].toDouble());
    const torch::Tensor& g = grads[0];
    if (!g.defined()) return {torch::Tensor(), torch::Tensor()};
    // A graph of the backward itself (double backward) or another dtype: ATen's ops.
    if (g.requires_grad() || g.scalar_type() != torch::kFloat || !g.is_cpu())
      return {scaled_by_mask(g, mask, s), torch::Tensor()};
    const torch::Tensor gm = like_mask(g, mask);
    auto gx = torch::empty_like(gm);
    const float* gp = gm.data_ptr<float>();
    const uint8_t* m = mask.data_ptr<uint8_t>();
    float* out = gx.data_ptr<float>();
    for_each_block(gm.numel(),
                   [&](int64_t i, int64_t n) { apply_block(gp + i, m + i, s, out + i, n); });
    return {gx, torch::Tensor()};
  }
};

}  // namespace

void dropout_keep_mask(uint64_t key, double p, int64_t offset, int64_t n, uint8_t* out) {
  const Draw draw(key, p);
  aligned_blocks(offset, offset + n,
                 [&](int64_t i, int64_t len) { mask_block(draw, i, len, out + (i - offset)); });
}

torch::Tensor dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p == 0) return x;
  if (!x.is_cpu() || p >= 1 || p < 0) return torch::dropout(x, p, training);
  return DropoutFn::apply(x, p);
}

}  // namespace mltrain::model
