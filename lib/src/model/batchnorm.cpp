// BatchNorm2d fused with what follows it, one autograd node each (model/batchnorm.hpp):
//   batchnorm_pool_relu  relu(max_pool2d(bn(x), 2))   the CNN (float)
//   batchnorm_relu       relu(bn(x) [+ residual])      the ResNet (float, bf16 under autocast)
//   relu_max_pool2d      max_pool2d(relu(x), 2)        TorchScript graphs (no BatchNorm; float)
//
// Layout: channels-last, so a pixel's C channels are contiguous and every loop below runs over
// channels innermost (vectorised; AVX2 / AVX-512 copies beside the plain one). With
// y = alpha * x + beta (alpha = gamma / sqrt(var + eps), beta = bias - mean * alpha):
//   forward   stats: per-channel sums of (x - shift) and its square in double, shift = x[0]
//             pool:  out = relu(max of the window's y), the window position k (0..3, row-major
//                    as max_pool2d scans) and the chosen x saved
//             relu:  out = relu(y [+ residual]), rounded once to x's dtype
//   backward  sums:  sum_dy = sum(g'), dot = sum(g' * (x - mean)), g' = g where out > 0 (for the
//                    pool, over the pooled grid only: the gradient is zero elsewhere)
//             dx:    (dy - sum_dy / M - (x - mean) * dot * invstd^2 / M) * invstd * gamma
//                    (M = N * H * W; for the pool dy = g' at each window's position k, else 0);
//                    the residual's gradient is g'
// as PyTorch's batch_norm_backward, with grad gamma = dot * invstd, grad beta = sum_dy.
#include "mltrain/model/batchnorm.hpp"

#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "mltrain/runtime/runtime.hpp"

namespace mltrain::model {
namespace {

constexpr int64_t kPixels = 256;         // pixels per block of a reduction: fixed, so the sums
                                         // are added in one order whatever the thread count
constexpr int64_t kPassGrain = 1 << 15;  // elements below which one thread does a pass

// v where t, else +0: a bit mask rather than a select, which GCC vectorises only without trapping
// math (and -fno-trapping-math then stops it vectorising pool_row).
inline float keep_if(bool t, float v) {
  int32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits &= -static_cast<int32_t>(t);
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// bf16 as PyTorch stores it: c10's own conversions (exact widening; nearest-even narrowing with
// NaN as 0x7fc0), which GCC vectorises in these loops.
using bf16 = uint16_t;
inline float widen(float v) { return v; }
inline float widen(bf16 h) { return c10::detail::f32_from_bits(h); }
template <typename T>
T narrow(float v);
template <>
inline float narrow<float>(float v) {
  return v;
}
template <>
inline bf16 narrow<bf16>(float v) {
  return c10::detail::round_to_nearest_even(v);
}
// relu keeping a NaN, as torch::relu does.
inline float relu(float v) { return keep_if(!(v <= 0.f), v); }

// The loops below are written once, for float and bf16, and compiled into each clone.

// Per-channel sums of (x - shift) and (x - shift)^2 over `rows` pixels.
template <typename T>
__attribute__((always_inline)) inline void stats_impl(const T* __restrict x, int64_t rows,
                                                      int64_t C, const double* __restrict shift,
                                                      double* __restrict sum,
                                                      double* __restrict sq) {
  for (int64_t c = 0; c < C; ++c) sum[c] = sq[c] = 0;
  for (int64_t r = 0; r < rows; ++r, x += C)
    for (int64_t c = 0; c < C; ++c) {
      const double d = static_cast<double>(widen(x[c])) - shift[c];
      sum[c] += d;
      sq[c] += d * d;
    }
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void stats_block(
    const float* x, int64_t rows, int64_t C, const double* shift, double* sum, double* sq) {
  stats_impl(x, rows, C, shift, sum, sq);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void stats_block(
    const bf16* x, int64_t rows, int64_t C, const double* shift, double* sum, double* sq) {
  stats_impl(x, rows, C, shift, sum, sq);
}

// out = relu(alpha x + beta [+ r]) over `rows` pixels.
template <typename T>
__attribute__((always_inline)) inline void affine_relu_impl(
    const T* __restrict x, const T* __restrict r, int64_t rows, int64_t C,
    const float* __restrict alpha, const float* __restrict beta, T* __restrict out) {
  if (r) {
    for (int64_t p = 0; p < rows; ++p, x += C, r += C, out += C)
      for (int64_t c = 0; c < C; ++c)
        out[c] = narrow<T>(relu(widen(x[c]) * alpha[c] + beta[c] + widen(r[c])));
  } else {
    for (int64_t p = 0; p < rows; ++p, x += C, out += C)
      for (int64_t c = 0; c < C; ++c) out[c] = narrow<T>(relu(widen(x[c]) * alpha[c] + beta[c]));
  }
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void affine_relu(
    const float* x, const float* r, int64_t rows, int64_t C, const float* alpha, const float* beta,
    float* out) {
  affine_relu_impl(x, r, rows, C, alpha, beta, out);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void affine_relu(
    const bf16* x, const bf16* r, int64_t rows, int64_t C, const float* alpha, const float* beta,
    bf16* out) {
  affine_relu_impl(x, r, rows, C, alpha, beta, out);
}

// Per-channel sums of g' and g' * (x - mean) over `rows` pixels; g' written to dr if given.
template <typename T>
__attribute__((always_inline)) inline void relu_grad_sums_impl(
    const T* __restrict g, const T* __restrict out, const T* __restrict x, int64_t rows, int64_t C,
    const double* __restrict mean, double* __restrict sdy, double* __restrict dot,
    T* __restrict dr) {
  for (int64_t c = 0; c < C; ++c) sdy[c] = dot[c] = 0;
  for (int64_t p = 0; p < rows; ++p, g += C, out += C, x += C) {
    for (int64_t c = 0; c < C; ++c) {
      const double gp = keep_if(widen(out[c]) > 0, widen(g[c]));
      sdy[c] += gp;
      dot[c] += gp * (static_cast<double>(widen(x[c])) - mean[c]);
    }
    if (dr) {
      for (int64_t c = 0; c < C; ++c) dr[c] = narrow<T>(keep_if(widen(out[c]) > 0, widen(g[c])));
      dr += C;
    }
  }
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void relu_grad_sums(
    const float* g, const float* out, const float* x, int64_t rows, int64_t C, const double* mean,
    double* sdy, double* dot, float* dr) {
  relu_grad_sums_impl(g, out, x, rows, C, mean, sdy, dot, dr);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void relu_grad_sums(
    const bf16* g, const bf16* out, const bf16* x, int64_t rows, int64_t C, const double* mean,
    double* sdy, double* dot, bf16* dr) {
  relu_grad_sums_impl(g, out, x, rows, C, mean, sdy, dot, dr);
}

// dx = a1 x + a0 + s g' over `rows` pixels.
template <typename T>
__attribute__((always_inline)) inline void relu_dx_impl(
    const T* __restrict g, const T* __restrict out, const T* __restrict x, int64_t rows, int64_t C,
    const float* __restrict a1, const float* __restrict a0, const float* __restrict s,
    T* __restrict dx) {
  for (int64_t p = 0; p < rows; ++p, g += C, out += C, x += C, dx += C)
    for (int64_t c = 0; c < C; ++c)
      dx[c] =
          narrow<T>(widen(x[c]) * a1[c] + a0[c] + keep_if(widen(out[c]) > 0, widen(g[c]) * s[c]));
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void relu_dx(
    const float* g, const float* out, const float* x, int64_t rows, int64_t C, const float* a1,
    const float* a0, const float* s, float* dx) {
  relu_dx_impl(g, out, x, rows, C, a1, a0, s, dx);
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void relu_dx(
    const bf16* g, const bf16* out, const bf16* x, int64_t rows, int64_t C, const float* a1,
    const float* a0, const float* s, bf16* dx) {
  relu_dx_impl(g, out, x, rows, C, a1, a0, s, dx);
}

// The activations after a BatchNorm that the graph rewrite takes besides ReLU: f(y), and the
// gradient g * f'(y), as ATen computes them.
// hardswish: y * min(max(y + 3, 0), 6) / 6 (a NaN stays NaN); hardswish_backward: 0 below -3,
// g * (y / 3 + 1/2) up to 3, g above (and for NaN).
struct Hardswish {
  static float f(float y) { return y * std::min(std::max(y + 3.f, 0.f), 6.f) / 6.f; }
  static float grad(float y, float g) {
    const bool low = y < -3.f, mid = !low && y <= 3.f, high = !low && !mid;
    return keep_if(mid, g * (y / 3.f + 0.5f)) + keep_if(high, g);
  }
};

// e^v for v in [-87.3, 88] (clamped there; a NaN stays NaN): n = round(v / ln 2) by the
// 1.5 * 2^23 rounding trick, r = v - n ln 2 in two parts, e^r by Cephes' degree-6 polynomial
// for expf, times 2^n built in the exponent bits. Within 2 ulp of expf, and branch-free, so GCC
// vectorises the loops that call it (ATen's SiLU uses Sleef's vector exp, 1 ulp).
inline float exp_poly(float v) {
  v = std::min(std::max(v, -87.3f), 88.f);
  constexpr float kShift = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = v * 1.44269504088896341f + kShift;
  const float n = t - kShift;
  const float r = (v - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * (r * r) + r + 1.f;
  int32_t bits;
  std::memcpy(&bits, &t, sizeof bits);  // n in the low mantissa bits
  const int32_t scale_bits = (bits - 0x4B400000 + 127) * (1 << 23);
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  return e * scale;
}

// silu: y / (1 + e^-y); silu_backward: g * s * (1 + y * (1 - s)), s = 1 / (1 + e^-y).
struct Silu {
  static float f(float y) { return y / (1.f + exp_poly(-y)); }
  static float grad(float y, float g) {
    const float s = 1.f / (1.f + exp_poly(-y));
    return g * s * (1.f + y * (1.f - s));
  }
};

// out = f(alpha x + beta) over `rows` pixels.
template <typename Act, typename T>
__attribute__((always_inline)) inline void affine_act_impl(const T* __restrict x, int64_t rows,
                                                           int64_t C, const float* __restrict alpha,
                                                           const float* __restrict beta,
                                                           T* __restrict out) {
  for (int64_t p = 0; p < rows; ++p, x += C, out += C)
    for (int64_t c = 0; c < C; ++c) out[c] = narrow<T>(Act::f(widen(x[c]) * alpha[c] + beta[c]));
}

// Per-channel sums of g' and g' * (x - mean), g' = the activation's gradient at
// y = alpha x + beta (recomputed from x: nothing but x is kept for the backward).
template <typename Act, typename T>
__attribute__((always_inline)) inline void act_grad_sums_impl(
    const T* __restrict g, const T* __restrict x, int64_t rows, int64_t C,
    const float* __restrict alpha, const float* __restrict beta, const double* __restrict mean,
    double* __restrict sdy, double* __restrict dot) {
  for (int64_t c = 0; c < C; ++c) sdy[c] = dot[c] = 0;
  for (int64_t p = 0; p < rows; ++p, g += C, x += C)
    for (int64_t c = 0; c < C; ++c) {
      const float xv = widen(x[c]);
      const double gp = Act::grad(xv * alpha[c] + beta[c], widen(g[c]));
      sdy[c] += gp;
      dot[c] += gp * (static_cast<double>(xv) - mean[c]);
    }
}

// dx = a1 x + a0 + s g' over `rows` pixels, g' as above.
template <typename Act, typename T>
__attribute__((always_inline)) inline void act_dx_impl(
    const T* __restrict g, const T* __restrict x, int64_t rows, int64_t C,
    const float* __restrict alpha, const float* __restrict beta, const float* __restrict a1,
    const float* __restrict a0, const float* __restrict s, T* __restrict dx) {
  for (int64_t p = 0; p < rows; ++p, g += C, x += C, dx += C)
    for (int64_t c = 0; c < C; ++c) {
      const float xv = widen(x[c]);
      const float gp = Act::grad(xv * alpha[c] + beta[c], widen(g[c]));
      dx[c] = narrow<T>(xv * a1[c] + a0[c] + gp * s[c]);
    }
}

// One clone per ISA of each pass, for float and bf16 (GCC clones no template, hence the macro);
// the activation is chosen outside the loops.
#define MLTRAIN_ACT_PASSES(T)                                                                     \
  __attribute__((target_clones("avx512f", "avx2", "default"))) void affine_act(                   \
      Activation act, const T* x, int64_t rows, int64_t C, const float* alpha, const float* beta, \
      T* out) {                                                                                   \
    if (act == Activation::kSilu)                                                                 \
      affine_act_impl<Silu>(x, rows, C, alpha, beta, out);                                        \
    else                                                                                          \
      affine_act_impl<Hardswish>(x, rows, C, alpha, beta, out);                                   \
  }                                                                                               \
  __attribute__((target_clones("avx512f", "avx2", "default"))) void act_grad_sums(                \
      Activation act, const T* g, const T* x, int64_t rows, int64_t C, const float* alpha,        \
      const float* beta, const double* mean, double* sdy, double* dot) {                          \
    if (act == Activation::kSilu)                                                                 \
      act_grad_sums_impl<Silu>(g, x, rows, C, alpha, beta, mean, sdy, dot);                       \
    else                                                                                          \
      act_grad_sums_impl<Hardswish>(g, x, rows, C, alpha, beta, mean, sdy, dot);                  \
  }                                                                                               \
  __attribute__((target_clones("avx512f", "avx2", "default"))) void act_dx(                       \
      Activation act, const T* g, const T* x, int64_t rows, int64_t C, const float* alpha,        \
      const float* beta, const float* a1, const float* a0, const float* s, T* dx) {               \
    if (act == Activation::kSilu)                                                                 \
      act_dx_impl<Silu>(g, x, rows, C, alpha, beta, a1, a0, s, dx);                               \
    else                                                                                          \
      act_dx_impl<Hardswish>(g, x, rows, C, alpha, beta, a1, a0, s, dx);                          \
  }
MLTRAIN_ACT_PASSES(float)
MLTRAIN_ACT_PASSES(bf16)
#undef MLTRAIN_ACT_PASSES

// max_pool2d's scan of a 2 x 2 window in row-major order: a later y wins if greater, or if it is
// NaN. Returns the winning y; k is its position and xs the input v at that position.
__attribute__((always_inline)) inline float window_max(float y0, float y1, float y2, float y3,
                                                       float v0, float v1, float v2, float v3,
                                                       uint8_t& k, float& xs) {
  float m = y0;
  xs = v0, k = 0;
  bool t = y1 > m || y1 != y1;
  m = t ? y1 : m, xs = t ? v1 : xs, k = t ? 1 : k;
  t = y2 > m || y2 != y2;
  m = t ? y2 : m, xs = t ? v2 : xs, k = t ? 2 : k;
  t = y3 > m || y3 != y3;
  m = t ? y3 : m, xs = t ? v3 : xs, k = t ? 3 : k;
  return m;
}

// One output row: ow windows whose top-left pixels start at a (row 2oh) and b (row 2oh + 1).
__attribute__((target_clones("avx512f", "avx2", "default"))) void pool_row(
    const float* __restrict a, const float* __restrict b, int64_t OW, int64_t C,
    const float* __restrict alpha, const float* __restrict beta, float* __restrict out,
    uint8_t* __restrict pos, float* __restrict chosen) {
  for (int64_t w = 0; w < OW; ++w, a += 2 * C, b += 2 * C, out += C, pos += C, chosen += C)
    for (int64_t c = 0; c < C; ++c) {
      const float al = alpha[c], be = beta[c];
      const float x0 = a[c], x1 = a[C + c], x2 = b[c], x3 = b[C + c];
      uint8_t k;
      float xs;
      const float m =
          window_max(x0 * al + be, x1 * al + be, x2 * al + be, x3 * al + be, x0, x1, x2, x3, k, xs);
      out[c] = (m > 0 || m != m) ? m : 0.f;  // relu; a NaN stays NaN
      pos[c] = k;
      chosen[c] = xs;
    }
}

// dx of one output row's two input rows: dx = a1 * x + a0, plus s * g' at position k.
__attribute__((target_clones("avx512f", "avx2", "default"))) void dx_row(
    const float* __restrict xa, const float* __restrict xb, const float* __restrict g,
    const float* __restrict out, const uint8_t* __restrict pos, int64_t OW, int64_t C,
    const float* __restrict a1, const float* __restrict a0, const float* __restrict s,
    float* __restrict da, float* __restrict db) {
  for (int64_t w = 0; w < OW;
       ++w, xa += 2 * C, xb += 2 * C, da += 2 * C, db += 2 * C, g += C, out += C, pos += C)
    for (int64_t c = 0; c < C; ++c) {
      const float gp = keep_if(out[c] > 0, g[c] * s[c]);
      const int32_t k = pos[c];
      da[c] = xa[c] * a1[c] + a0[c] + keep_if(k == 0, gp);
      da[C + c] = xa[C + c] * a1[c] + a0[c] + keep_if(k == 1, gp);
      db[c] = xb[c] * a1[c] + a0[c] + keep_if(k == 2, gp);
      db[C + c] = xb[C + c] * a1[c] + a0[c] + keep_if(k == 3, gp);
    }
}

// dx = a1 * x + a0 over `pixels` pixels no window covers (an odd last row or column).
__attribute__((target_clones("avx512f", "avx2", "default"))) void dx_uncovered(
    const float* __restrict x, int64_t pixels, int64_t C, const float* __restrict a1,
    const float* __restrict a0, float* __restrict dx) {
  for (int64_t r = 0; r < pixels; ++r, x += C, dx += C)
    for (int64_t c = 0; c < C; ++c) dx[c] = x[c] * a1[c] + a0[c];
}

// relu(max) of one output row's 2 x 2 windows, no affine (a TorchScript graph's "ReLU, pool"),
// and one byte per output for the backward: the window position k, or 4 where the output is
// <= 0 (its gradient is zero; a NaN passes its gradient, as relu's threshold_backward does).
__attribute__((target_clones("avx512f", "avx2", "default"))) void max_row(const float* __restrict a,
                                                                          const float* __restrict b,
                                                                          int64_t OW, int64_t C,
                                                                          float* __restrict out,
                                                                          uint8_t* __restrict pos) {
  for (int64_t w = 0; w < OW; ++w, a += 2 * C, b += 2 * C, out += C, pos += C)
    for (int64_t c = 0; c < C; ++c) {
      const float x0 = a[c], x1 = a[C + c], x2 = b[c], x3 = b[C + c];
      uint8_t k;
      float xs;
      const float m = window_max(x0, x1, x2, x3, x0, x1, x2, x3, k, xs);
      const bool kept = m > 0 || m != m;
      out[c] = kept ? m : 0.f;
      pos[c] = kept ? k : 4;
    }
}

// The gradient of max_row: g at each window's position k, zero at the other three (and
// everywhere for k = 4).
__attribute__((target_clones("avx512f", "avx2", "default"))) void scatter_row(
    const float* __restrict g, const uint8_t* __restrict pos, int64_t OW, int64_t C,
    float* __restrict da, float* __restrict db) {
  for (int64_t w = 0; w < OW; ++w, da += 2 * C, db += 2 * C, g += C, pos += C)
    for (int64_t c = 0; c < C; ++c) {
      const int32_t k = pos[c];
      da[c] = keep_if(k == 0, g[c]);
      da[C + c] = keep_if(k == 1, g[c]);
      db[c] = keep_if(k == 2, g[c]);
      db[C + c] = keep_if(k == 3, g[c]);
    }
}

// Per-channel sums of a blocked reduction, the blocks added in index order.
template <typename F>
void blocked_sums(int64_t rows, int64_t C, std::vector<double>& a, std::vector<double>& b,
                  const F& block) {
  const int64_t blocks = (rows + kPixels - 1) / kPixels;
  std::vector<double> part(static_cast<size_t>(blocks * 2 * C));
  runtime::parallel_for(0, blocks, std::max<int64_t>(1, kPassGrain / (kPixels * C)),
                        [&](int64_t b0, int64_t b1) {
                          for (int64_t k = b0; k < b1; ++k) {
                            double* p = part.data() + k * 2 * C;
                            block(k * kPixels, std::min(kPixels, rows - k * kPixels), p, p + C);
                          }
                        });
  a.assign(static_cast<size_t>(C), 0.0);
  b.assign(static_cast<size_t>(C), 0.0);
  for (int64_t k = 0; k < blocks; ++k)
    for (int64_t c = 0; c < C; ++c) {
      a[c] += part[(k * 2) * C + c];
      b[c] += part[(k * 2 + 1) * C + c];
    }
}

// Output rows (n, oh) spread over the threads, f(n, oh).
template <typename F>
void for_each_output_row(int64_t N, int64_t OH, int64_t row_elems, const F& f) {
  runtime::parallel_for(0, N * OH,
                        std::max<int64_t>(1, kPassGrain / std::max<int64_t>(1, row_elems)),
                        [&](int64_t r0, int64_t r1) {
                          for (int64_t r = r0; r < r1; ++r) f(r / OH, r % OH);
                        });
}

torch::Tensor pooled_like(const torch::Tensor& x, at::ScalarType dtype) {
  return torch::empty({x.size(0), x.size(1), x.size(2) / 2, x.size(3) / 2},
                      x.options().dtype(dtype).memory_format(at::MemoryFormat::ChannelsLast));
}

// Normalise with (alpha, beta) and pool: out, and the window positions and chosen inputs.
void normalise_pool(const torch::Tensor& x, const std::vector<float>& alpha,
                    const std::vector<float>& beta, torch::Tensor& out, torch::Tensor& pos,
                    torch::Tensor& chosen) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t OH = H / 2, OW = W / 2;
  out = pooled_like(x, torch::kFloat);
  pos = pooled_like(x, torch::kUInt8);
  chosen = pooled_like(x, torch::kFloat);
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  uint8_t* pp = pos.data_ptr<uint8_t>();
  float* cp = chosen.data_ptr<float>();
  for_each_output_row(N, OH, 4 * OW * C, [&](int64_t n, int64_t oh) {
    const float* a = xp + ((n * H + 2 * oh) * W) * C;
    const int64_t o = ((n * OH + oh) * OW) * C;
    pool_row(a, a + W * C, OW, C, alpha.data(), beta.data(), op + o, pp + o, cp + o);
  });
}

// A batch's normalisation: per-channel mean and 1 / sqrt(var + eps) (double, for the backward)
// and y = alpha x + beta.
struct Norm {
  torch::Tensor mean, invstd;
  std::vector<float> alpha, beta;
};

// The affine form of mean/invstd with the module's gamma and beta.
void set_affine(Norm& n, const torch::Tensor& weight, const torch::Tensor& bias) {
  const int64_t C = n.mean.size(0);
  const auto w = weight.detach().contiguous(), b = bias.detach().contiguous();
  const float* wp = w.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  const double* mp = n.mean.data_ptr<double>();
  const double* ip = n.invstd.data_ptr<double>();
  n.alpha.resize(static_cast<size_t>(C));
  n.beta.resize(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    n.alpha[c] = static_cast<float>(ip[c] * wp[c]);
    n.beta[c] = static_cast<float>(bp[c] - mp[c] * ip[c] * wp[c]);
  }
}

// The batch's statistics (biased variance, as BatchNorm normalises), and the running statistics
// moved towards them when momentum >= 0 (unbiased variance, as PyTorch's).
template <typename T>
Norm batch_norm_of(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                   const torch::Tensor& running_mean, const torch::Tensor& running_var,
                   double momentum, double eps) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), M = N * H * W;
  const T* xp = reinterpret_cast<const T*>(x.data_ptr());
  std::vector<double> shift(static_cast<size_t>(C)), s, q;
  for (int64_t c = 0; c < C; ++c) shift[c] = widen(xp[c]);
  blocked_sums(M, C, s, q, [&](int64_t r0, int64_t rows, double* sum, double* sq) {
    stats_block(xp + r0 * C, rows, C, shift.data(), sum, sq);
  });
  Norm n{torch::empty({C}, torch::kDouble), torch::empty({C}, torch::kDouble), {}, {}};
  double* mp = n.mean.data_ptr<double>();
  double* ip = n.invstd.data_ptr<double>();
  for (int64_t c = 0; c < C; ++c) {
    const double m1 = s[c] / double(M);
    const double var = std::max(0.0, q[c] / double(M) - m1 * m1);
    mp[c] = shift[c] + m1;
    ip[c] = 1.0 / std::sqrt(var + eps);
    if (momentum >= 0) {
      float* rm = running_mean.data_ptr<float>();
      float* rv = running_var.data_ptr<float>();
      rm[c] = static_cast<float>(momentum * mp[c] + (1 - momentum) * rm[c]);
      rv[c] =
          static_cast<float>(momentum * var * double(M) / double(M - 1) + (1 - momentum) * rv[c]);
    }
  }
  set_affine(n, weight, bias);
  return n;
}

Norm batch_norm_of(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                   const torch::Tensor& running_mean, const torch::Tensor& running_var,
                   double momentum, double eps) {
  return x.scalar_type() == torch::kFloat
             ? batch_norm_of<float>(x, weight, bias, running_mean, running_var, momentum, eps)
             : batch_norm_of<bf16>(x, weight, bias, running_mean, running_var, momentum, eps);
}

// Evaluation: the running statistics.
Norm running_norm_of(const torch::Tensor& running_mean, const torch::Tensor& running_var,
                     double eps, const torch::Tensor& weight, const torch::Tensor& bias) {
  Norm n{running_mean.to(torch::kDouble).contiguous(),
         (running_var.to(torch::kDouble) + eps).rsqrt().contiguous(),
         {},
         {}};
  set_affine(n, weight, bias);
  return n;
}
Norm running_norm_of(const torch::nn::BatchNorm2dImpl& bn) {
  return running_norm_of(bn.running_mean, bn.running_var, bn.options.eps(), bn.weight, bn.bias);
}

// The backward's per-channel terms from sum_dy and dot: dx = a1 x + a0 + s dy, and the gradients
// of gamma (dot * invstd) and beta (sum_dy).
void scale_terms(const std::vector<double>& sdy, const std::vector<double>& dot,
                 const torch::Tensor& mean, const torch::Tensor& invstd,
                 const torch::Tensor& weight, int64_t M, std::vector<float>& a1,
                 std::vector<float>& a0, std::vector<float>& s, torch::Tensor& grad_w,
                 torch::Tensor& grad_b) {
  const int64_t C = mean.size(0);
  const auto w = weight.detach().contiguous();
  const float* wp = w.data_ptr<float>();
  const double* mp = mean.data_ptr<double>();
  const double* ip = invstd.data_ptr<double>();
  a1.resize(static_cast<size_t>(C));
  a0.resize(static_cast<size_t>(C));
  s.resize(static_cast<size_t>(C));
  grad_w = torch::empty({C}, torch::kFloat);
  grad_b = torch::empty({C}, torch::kFloat);
  for (int64_t c = 0; c < C; ++c) {
    const double k = dot[c] * ip[c] * ip[c] / double(M), mean_dy = sdy[c] / double(M);
    const double iw = ip[c] * wp[c];
    a1[c] = static_cast<float>(-k * iw);
    a0[c] = static_cast<float>((mp[c] * k - mean_dy) * iw);
    s[c] = static_cast<float>(iw);
    grad_w.data_ptr<float>()[c] = static_cast<float>(dot[c] * ip[c]);
    grad_b.data_ptr<float>()[c] = static_cast<float>(sdy[c]);
  }
}

struct BnPoolReluFn : torch::autograd::Function<BnPoolReluFn> {
  // momentum < 0: no running statistics to update.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const torch::Tensor& running_mean, const torch::Tensor& running_var,
                               double momentum, double eps) {
    // A row of its own in `mltrain profile`: a custom function records none.
    RECORD_FUNCTION("mltrain::batchnorm_pool_relu", std::vector<c10::IValue>());
    const Norm n = batch_norm_of(x, weight, bias, running_mean, running_var, momentum, eps);
    torch::Tensor out, pos, chosen;
    normalise_pool(x, n.alpha, n.beta, out, pos, chosen);
    ctx->save_for_backward({x, weight, out, pos, chosen});
    ctx->saved_data["mean"] = n.mean;
    ctx->saved_data["invstd"] = n.invstd;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &out = saved[2], &pos = saved[3],
                        &chosen = saved[4];
    const torch::Tensor mean = ctx->saved_data["mean"].toTensor();
    const torch::Tensor invstd = ctx->saved_data["invstd"].toTensor();
    const torch::Tensor undefined;
    if (!grads[0].defined())
      return {undefined, undefined, undefined, undefined, undefined, undefined, undefined};
    TORCH_CHECK(!grads[0].requires_grad(),
                "batchnorm_pool_relu has no second derivative (create_graph=true)");
    const torch::Tensor g = grads[0].contiguous(at::MemoryFormat::ChannelsLast);
    const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t OH = H / 2, OW = W / 2, M = N * H * W;
    const float* gp = g.data_ptr<float>();
    const float* op = out.data_ptr<float>();
    const float* cp = chosen.data_ptr<float>();
    std::vector<double> sdy, dot;
    blocked_sums(N * OH * OW, C, sdy, dot, [&](int64_t r0, int64_t rows, double* a, double* b) {
      // The pooled grid's sums: x_k is the input each window chose.
      relu_grad_sums(gp + r0 * C, op + r0 * C, cp + r0 * C, rows, C, mean.data_ptr<double>(), a, b,
                     static_cast<float*>(nullptr));
    });
    std::vector<float> a1, a0, sc;
    torch::Tensor grad_w, grad_b;
    scale_terms(sdy, dot, mean, invstd, weight, M, a1, a0, sc, grad_w, grad_b);
    auto dx = torch::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast);
    const float* xp = x.data_ptr<float>();
    float* dp = dx.data_ptr<float>();
    const uint8_t* pp = pos.data_ptr<uint8_t>();
    for_each_output_row(N, OH, 4 * OW * C, [&](int64_t n, int64_t oh) {
      const int64_t i = ((n * H + 2 * oh) * W) * C, o = ((n * OH + oh) * OW) * C;
      dx_row(xp + i, xp + i + W * C, gp + o, op + o, pp + o, OW, C, a1.data(), a0.data(), sc.data(),
             dp + i, dp + i + W * C);
      if (W % 2)  // the last column of both rows: no window covers it
        for (int64_t r : {i + (W - 1) * C, i + (2 * W - 1) * C})
          dx_uncovered(xp + r, 1, C, a1.data(), a0.data(), dp + r);
    });
    if (H % 2)  // the last row of every image
      for (int64_t n = 0; n < N; ++n) {
        const int64_t i = ((n * H + H - 1) * W) * C;
        dx_uncovered(xp + i, W, C, a1.data(), a0.data(), dp + i);
      }
    return {dx, grad_w, grad_b, undefined, undefined, undefined, undefined};
  }
};

// relu then 2 x 2 max-pooling, no BatchNorm: one pass forward (a byte per output saved), one
// backward writing dx whole (odd last rows and columns zero, as max_pool2d's backward leaves them).
struct PoolReluFn : torch::autograd::Function<PoolReluFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    // No RECORD_FUNCTION: it runs as the operator mltrain::relu_max_pool2d, which the
    // dispatcher records (a second row of the same name would double its calls).
    const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t OH = H / 2, OW = W / 2;
    auto out = pooled_like(x, torch::kFloat), pos = pooled_like(x, torch::kUInt8);
    const float* xp = x.data_ptr<float>();
    float* op = out.data_ptr<float>();
    uint8_t* pp = pos.data_ptr<uint8_t>();
    for_each_output_row(N, OH, 4 * OW * C, [&](int64_t n, int64_t oh) {
      const float* a = xp + ((n * H + 2 * oh) * W) * C;
      const int64_t o = ((n * OH + oh) * OW) * C;
      max_row(a, a + W * C, OW, C, op + o, pp + o);
    });
    ctx->save_for_backward({pos});
    ctx->saved_data["input_size"] = x.sizes().vec();
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return {torch::Tensor()};
    TORCH_CHECK(!grads[0].requires_grad(),
                "relu_max_pool2d has no second derivative (create_graph=true)");
    const torch::Tensor pos = ctx->get_saved_variables()[0];
    const auto size = ctx->saved_data["input_size"].toIntVector();
    const int64_t N = size[0], C = size[1], H = size[2], W = size[3];
    const int64_t OH = H / 2, OW = W / 2;
    const torch::Tensor g = grads[0].contiguous(at::MemoryFormat::ChannelsLast);
    auto dx = torch::empty(size, g.options().memory_format(at::MemoryFormat::ChannelsLast));
    const float* gp = g.data_ptr<float>();
    const uint8_t* pp = pos.data_ptr<uint8_t>();
    float* dp = dx.data_ptr<float>();
    for_each_output_row(N, OH, 4 * OW * C, [&](int64_t n, int64_t oh) {
      const int64_t i = ((n * H + 2 * oh) * W) * C, o = ((n * OH + oh) * OW) * C;
      scatter_row(gp + o, pp + o, OW, C, dp + i, dp + i + W * C);
      if (W % 2)  // the last column of both rows: no window covers it
        for (int64_t r : {i + (W - 1) * C, i + (2 * W - 1) * C}) std::fill_n(dp + r, C, 0.f);
    });
    if (H % 2)  // the last row of every image
      for (int64_t n = 0; n < N; ++n) std::fill_n(dp + ((n * H + H - 1) * W) * C, W * C, 0.f);
    return {dx};
  }
};

// Pixels of x in chunks spread over the threads, f(first pixel, count).
template <typename F>
void for_each_pixels(int64_t pixels, int64_t C, const F& f) {
  runtime::parallel_for(0, pixels, std::max<int64_t>(1, kPassGrain / C),
                        [&](int64_t p0, int64_t p1) { f(p0, p1 - p0); });
}

template <typename T>
const T* ptr(const torch::Tensor& t) {
  return t.defined() ? reinterpret_cast<const T*>(t.data_ptr()) : nullptr;
}
template <typename T>
T* mut(torch::Tensor& t) {
  return t.defined() ? reinterpret_cast<T*>(t.data_ptr()) : nullptr;
}

template <typename T>
void affine_relu_all(const torch::Tensor& x, const torch::Tensor& r, const Norm& n,
                     torch::Tensor& out) {
  const int64_t C = x.size(1);
  for_each_pixels(x.numel() / C, C, [&](int64_t p, int64_t rows) {
    affine_relu(ptr<T>(x) + p * C, r.defined() ? ptr<T>(r) + p * C : nullptr, rows, C,
                n.alpha.data(), n.beta.data(), mut<T>(out) + p * C);
  });
}

void affine_relu_all(const torch::Tensor& x, const torch::Tensor& r, const Norm& n,
                     torch::Tensor& out) {
  if (x.scalar_type() == torch::kFloat)
    affine_relu_all<float>(x, r, n, out);
  else
    affine_relu_all<bf16>(x, r, n, out);
}

// out = act(alpha x + beta) for Hardswish or SiLU, over the threads.
void affine_act_all(Activation act, const torch::Tensor& x, const Norm& n, torch::Tensor& out) {
  const int64_t C = x.size(1);
  for_each_pixels(x.numel() / C, C, [&](int64_t p, int64_t rows) {
    if (x.scalar_type() == torch::kFloat)
      affine_act(act, ptr<float>(x) + p * C, rows, C, n.alpha.data(), n.beta.data(),
                 mut<float>(out) + p * C);
    else
      affine_act(act, ptr<bf16>(x) + p * C, rows, C, n.alpha.data(), n.beta.data(),
                 mut<bf16>(out) + p * C);
  });
}

struct BnReluFn : torch::autograd::Function<BnReluFn> {
  // momentum < 0: no running statistics to update; an empty residual: none.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const torch::Tensor& running_mean, const torch::Tensor& running_var,
                               const torch::Tensor& residual, double momentum, double eps) {
    RECORD_FUNCTION("mltrain::batchnorm_relu", std::vector<c10::IValue>());
    const Norm n = batch_norm_of(x, weight, bias, running_mean, running_var, momentum, eps);
    auto out = torch::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast);
    const bool has_residual = residual.numel() > 0;
    affine_relu_all(x, has_residual ? residual : torch::Tensor(), n, out);
    ctx->save_for_backward({x, weight, out});
    ctx->saved_data["mean"] = n.mean;
    ctx->saved_data["invstd"] = n.invstd;
    ctx->saved_data["residual"] = has_residual;
    return out;
  }

  template <typename T>
  static void backward_pass(const torch::Tensor& g, const torch::Tensor& out,
                            const torch::Tensor& x, const torch::Tensor& weight,
                            const torch::Tensor& mean, const torch::Tensor& invstd,
                            torch::Tensor& dx, torch::Tensor& dw, torch::Tensor& db,
                            torch::Tensor& dr) {
    const int64_t C = x.size(1), M = x.numel() / C;
    std::vector<double> sdy, dot;
    blocked_sums(M, C, sdy, dot, [&](int64_t r0, int64_t rows, double* a, double* b) {
      relu_grad_sums(ptr<T>(g) + r0 * C, ptr<T>(out) + r0 * C, ptr<T>(x) + r0 * C, rows, C,
                     mean.data_ptr<double>(), a, b, dr.defined() ? mut<T>(dr) + r0 * C : nullptr);
    });
    std::vector<float> a1, a0, sc;
    scale_terms(sdy, dot, mean, invstd, weight, M, a1, a0, sc, dw, db);
    for_each_pixels(M, C, [&](int64_t p, int64_t rows) {
      relu_dx(ptr<T>(g) + p * C, ptr<T>(out) + p * C, ptr<T>(x) + p * C, rows, C, a1.data(),
              a0.data(), sc.data(), mut<T>(dx) + p * C);
    });
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &out = saved[2];
    const torch::Tensor undefined;
    if (!grads[0].defined())
      return {undefined, undefined, undefined, undefined,
              undefined, undefined, undefined, undefined};
    TORCH_CHECK(!grads[0].requires_grad(),
                "batchnorm_relu has no second derivative (create_graph=true)");
    const torch::Tensor g = grads[0].to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
    auto dx = torch::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast);
    torch::Tensor dw, db, dr;
    if (ctx->saved_data["residual"].toBool())
      dr = torch::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast);
    const torch::Tensor mean = ctx->saved_data["mean"].toTensor();
    const torch::Tensor invstd = ctx->saved_data["invstd"].toTensor();
    if (x.scalar_type() == torch::kFloat)
      backward_pass<float>(g, out, x, weight, mean, invstd, dx, dw, db, dr);
    else
      backward_pass<bf16>(g, out, x, weight, mean, invstd, dx, dw, db, dr);
    return {dx, dw, db, undefined, undefined, dr, undefined, undefined};
  }
};

// act(bn(x)) for Hardswish or SiLU: MobileNetV3's and EfficientNet's "conv, BN, activation".
// Keeps x alone for the backward (and the affine alpha, beta): the activation's gradient is
// recomputed from alpha x + beta.
struct BnActFn : torch::autograd::Function<BnActFn> {
  // momentum < 0: no running statistics to update.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const torch::Tensor& running_mean, const torch::Tensor& running_var,
                               double momentum, double eps, int64_t act) {
    // No RECORD_FUNCTION: it runs as the operator mltrain::batch_norm_hardswish / _silu, which
    // the dispatcher records.
    const Norm n = batch_norm_of(x, weight, bias, running_mean, running_var, momentum, eps);
    auto out = torch::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast);
    affine_act_all(static_cast<Activation>(act), x, n, out);
    ctx->save_for_backward({x, weight});
    ctx->saved_data["mean"] = n.mean;
    ctx->saved_data["invstd"] = n.invstd;
    ctx->saved_data["alpha"] = torch::tensor(n.alpha);
    ctx->saved_data["beta"] = torch::tensor(n.beta);
    ctx->saved_data["act"] = act;
    return out;
  }

  template <typename T>
  static void backward_pass(Activation act, const torch::Tensor& g, const torch::Tensor& x,
                            const torch::Tensor& weight, const torch::Tensor& mean,
                            const torch::Tensor& invstd, const float* alpha, const float* beta,
                            torch::Tensor& dx, torch::Tensor& dw, torch::Tensor& db) {
    const int64_t C = x.size(1), M = x.numel() / C;
    std::vector<double> sdy, dot;
    blocked_sums(M, C, sdy, dot, [&](int64_t r0, int64_t rows, double* a, double* b) {
      act_grad_sums(act, ptr<T>(g) + r0 * C, ptr<T>(x) + r0 * C, rows, C, alpha, beta,
                    mean.data_ptr<double>(), a, b);
    });
    std::vector<float> a1, a0, sc;
    scale_terms(sdy, dot, mean, invstd, weight, M, a1, a0, sc, dw, db);
    for_each_pixels(M, C, [&](int64_t p, int64_t rows) {
      act_dx(act, ptr<T>(g) + p * C, ptr<T>(x) + p * C, rows, C, alpha, beta, a1.data(), a0.data(),
             sc.data(), mut<T>(dx) + p * C);
    });
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1];
    const torch::Tensor undefined;
    const torch::autograd::variable_list none(8);
    if (!grads[0].defined()) return none;
    TORCH_CHECK(!grads[0].requires_grad(),
                "mltrain's batch_norm + activation has no second derivative (create_graph=true)");
    const torch::Tensor g = grads[0].to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
    auto dx = torch::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast);
    torch::Tensor dw, db;
    const auto act = static_cast<Activation>(ctx->saved_data["act"].toInt());
    const torch::Tensor mean = ctx->saved_data["mean"].toTensor();
    const torch::Tensor invstd = ctx->saved_data["invstd"].toTensor();
    const float* alpha = ctx->saved_data["alpha"].toTensor().data_ptr<float>();
    const float* beta = ctx->saved_data["beta"].toTensor().data_ptr<float>();
    if (x.scalar_type() == torch::kFloat)
      backward_pass<float>(act, g, x, weight, mean, invstd, alpha, beta, dx, dw, db);
    else
      backward_pass<bf16>(act, g, x, weight, mean, invstd, alpha, beta, dx, dw, db);
    return {dx, dw, db, undefined, undefined, undefined, undefined, undefined};
  }
};

// Does the fused code take these tensors? x float (or bf16 where `bf16_ok`), on the CPU,
// channels-last, more than one value per channel; weight and bias (aten.batch_norm's
// affine parameters) in float, one per channel; running statistics none, or both in float.
// Anything else runs ATen's operators.
bool fusable(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
             const torch::Tensor& running_mean, const torch::Tensor& running_var, bool bf16_ok) {
  const auto dt = x.scalar_type();
  if (!x.is_cpu() || x.dim() != 4 || !(dt == torch::kFloat || (bf16_ok && dt == torch::kBFloat16)))
    return false;
  if (!x.is_contiguous(at::MemoryFormat::ChannelsLast) || x.size(1) == 0 ||
      x.size(0) * x.size(2) * x.size(3) <= 1)
    return false;
  const int64_t C = x.size(1);
  for (const auto* p : {&weight, &bias})
    if (!p->defined() || p->scalar_type() != torch::kFloat || !p->is_cpu() || p->dim() != 1 ||
        p->numel() != C)
      return false;
  if (running_mean.defined() != running_var.defined()) return false;
  if (!running_mean.defined()) return true;
  for (const auto* r : {&running_mean, &running_var})
    if (r->scalar_type() != torch::kFloat || !r->is_contiguous() || !r->is_cpu() || r->numel() != C)
      return false;
  return true;
}
bool fusable(const torch::Tensor& x, const torch::nn::BatchNorm2dImpl& bn, bool bf16_ok) {
  if (!bn.options.affine()) return false;
  const bool track = bn.options.track_running_stats();
  return fusable(x, bn.weight, bn.bias, track ? bn.running_mean : torch::Tensor(),
                 track ? bn.running_var : torch::Tensor(), bf16_ok);
}

// Evaluation with running statistics, where no gradient is wanted: the forward alone.
bool running_stats_forward(const torch::nn::BatchNorm2dImpl& bn) {
  return !bn.is_training() && bn.options.track_running_stats();
}
bool wants_grad(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                const torch::Tensor& r) {
  return torch::GradMode::is_enabled() &&
         (x.requires_grad() || weight.requires_grad() || bias.requires_grad() ||
          (r.defined() && r.requires_grad()));
}
bool wants_grad(const torch::Tensor& x, const torch::nn::BatchNorm2dImpl& bn,
                const torch::Tensor& r = {}) {
  return wants_grad(x, bn.weight, bn.bias, r);
}

// A residual the fused "BN, add, ReLU" takes: x's shape and dtype, on the CPU, channels-last.
bool residual_fits(const torch::Tensor& x, const torch::Tensor& r) {
  return r.sizes() == x.sizes() && r.scalar_type() == x.scalar_type() && r.is_cpu() &&
         r.is_contiguous(at::MemoryFormat::ChannelsLast);
}

// LibTorch's BatchNorm module bookkeeping in training: count the batch and return the running
// statistics' factor (momentum, or 1 / batches for the cumulative average); -1 when the module
// keeps none, or normalises with the batch in evaluation (track_running_stats false).
double count_batch(torch::nn::BatchNorm2dImpl& bn) {
  if (!bn.is_training() || !bn.options.track_running_stats()) return -1;
  torch::NoGradGuard no_grad;
  bn.num_batches_tracked += 1;
  return bn.options.momentum().has_value() ? *bn.options.momentum()
                                           : 1.0 / bn.num_batches_tracked.item<double>();
}

}  // namespace

torch::Tensor batchnorm_pool_relu_aten(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn) {
  return torch::relu(torch::max_pool2d(bn.forward(x), 2));
}

torch::Tensor batchnorm_pool_relu(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn) {
  if (!fusable(x, bn, /*bf16_ok=*/false) || x.size(2) < 2 || x.size(3) < 2)
    return batchnorm_pool_relu_aten(x, bn);
  if (running_stats_forward(bn)) {
    if (wants_grad(x, bn)) return batchnorm_pool_relu_aten(x, bn);
    torch::Tensor out, pos, chosen;
    const Norm n = running_norm_of(bn);
    normalise_pool(x, n.alpha, n.beta, out, pos, chosen);
    return out;
  }
  const double momentum = count_batch(bn);
  const torch::Tensor none = torch::empty({0});  // autograd's apply takes no undefined tensor
  return BnPoolReluFn::apply(x, bn.weight, bn.bias, momentum >= 0 ? bn.running_mean : none,
                             momentum >= 0 ? bn.running_var : none, momentum, bn.options.eps());
}

torch::Tensor relu_max_pool2d_aten(const torch::Tensor& x) {
  return torch::max_pool2d(torch::relu(x), 2);
}

torch::Tensor relu_max_pool2d(const torch::Tensor& x) {
  if (!x.is_cpu() || x.scalar_type() != torch::kFloat || x.dim() != 4 ||
      !x.is_contiguous(at::MemoryFormat::ChannelsLast) || x.size(1) == 0 || x.size(2) < 2 ||
      x.size(3) < 2 || x.size(0) == 0)
    return relu_max_pool2d_aten(x);
  return PoolReluFn::apply(x);
}

torch::Tensor batchnorm_relu_aten(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn,
                                  const torch::Tensor& residual) {
  return torch::relu(residual.defined() ? bn.forward(x) + residual : bn.forward(x));
}

torch::Tensor batchnorm_relu(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn,
                             const torch::Tensor& residual) {
  if (!fusable(x, bn, /*bf16_ok=*/true) || (residual.defined() && !residual_fits(x, residual)))
    return batchnorm_relu_aten(x, bn, residual);
  if (running_stats_forward(bn)) {
    if (wants_grad(x, bn, residual)) return batchnorm_relu_aten(x, bn, residual);
    auto out = torch::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast);
    affine_relu_all(x, residual, running_norm_of(bn), out);
    return out;
  }
  const double momentum = count_batch(bn);
  const torch::Tensor none = torch::empty({0}, x.options());  // apply takes no undefined tensor
  return BnReluFn::apply(x, bn.weight, bn.bias, momentum >= 0 ? bn.running_mean : none,
                         momentum >= 0 ? bn.running_var : none,
                         residual.defined() ? residual : none, momentum, bn.options.eps());
}

torch::Tensor batch_norm_act_aten(const torch::Tensor& x, const torch::Tensor& weight,
                                  const torch::Tensor& bias, const torch::Tensor& running_mean,
                                  const torch::Tensor& running_var, bool training, double momentum,
                                  double eps, bool cudnn_enabled, Activation act,
                                  const torch::Tensor& residual) {
  auto y = at::batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps,
                          cudnn_enabled);
  if (residual.defined()) y = y + residual;
  if (act == Activation::kRelu) return torch::relu(y);
  return act == Activation::kHardswish ? torch::hardswish(y) : torch::silu(y);
}

torch::Tensor batch_norm_act(const torch::Tensor& x, const torch::Tensor& weight,
                             const torch::Tensor& bias, const torch::Tensor& running_mean,
                             const torch::Tensor& running_var, bool training, double momentum,
                             double eps, bool cudnn_enabled, Activation act,
                             const torch::Tensor& residual) {
  auto aten = [&] {
    return batch_norm_act_aten(x, weight, bias, running_mean, running_var, training, momentum, eps,
                               cudnn_enabled, act, residual);
  };
  if (!fusable(x, weight, bias, running_mean, running_var, /*bf16_ok=*/true)) return aten();
  if (residual.defined() && (act != Activation::kRelu || !residual_fits(x, residual)))
    return aten();
  const bool track = running_mean.defined();
  if (!training) {
    // Evaluation on the running statistics, the forward alone; ATen's operators where a
    // gradient is wanted or there are no statistics to normalise with.
    if (!track || wants_grad(x, weight, bias, residual)) return aten();
    const Norm n = running_norm_of(running_mean, running_var, eps, weight, bias);
    auto out = torch::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast);
    if (act == Activation::kRelu)
      affine_relu_all(x, residual, n, out);
    else
      affine_act_all(act, x, n, out);
    return out;
  }
  const torch::Tensor none = torch::empty({0}, x.options());  // apply takes no undefined tensor
  const double m = track ? momentum : -1;
  if (act != Activation::kRelu)
    return BnActFn::apply(x, weight, bias, track ? running_mean : none, track ? running_var : none,
                          m, eps, static_cast<int64_t>(act));
  return BnReluFn::apply(x, weight, bias, track ? running_mean : none, track ? running_var : none,
                         residual.defined() ? residual : none, m, eps);
}

}  // namespace mltrain::model
