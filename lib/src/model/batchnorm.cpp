// BatchNorm2d + 2x2 max-pool + ReLU in one autograd node (model/batchnorm.hpp).
//
// Layout: channels-last, so a pixel's C channels are contiguous and every loop below runs over
// channels innermost (vectorised; AVX2 / AVX-512 copies beside the plain one). With
// y = alpha * x + beta (alpha = gamma / sqrt(var + eps), beta = bias - mean * alpha):
//   forward   stats: per-channel sums of (x - shift) and its square in double, shift = x[0]
//             pool:  out = relu(max of the window's y), the window position k (0..3, row-major
//                    as max_pool2d scans) and the chosen x saved
//   backward  sums:  over the pooled grid only (the gradient is zero elsewhere):
//                    sum_dy = sum(g'), dot = sum(g' * (x_k - mean)), g' = g where out > 0
//             dx:    (dy - sum_dy / M - (x - mean) * dot * invstd^2 / M) * invstd * gamma,
//                    dy = g' at each window's position k and 0 elsewhere (M = N * H * W)
// as PyTorch's batch_norm_backward, with grad gamma = dot * invstd, grad beta = sum_dy.
#include "mltrain/model/batchnorm.hpp"

#include <ATen/record_function.h>
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

// Per-channel sums of (x - shift) and (x - shift)^2 over `rows` pixels.
__attribute__((target_clones("avx512f", "avx2", "default"))) void stats_block(
    const float* __restrict x, int64_t rows, int64_t C, const double* __restrict shift,
    double* __restrict sum, double* __restrict sq) {
  for (int64_t c = 0; c < C; ++c) sum[c] = sq[c] = 0;
  for (int64_t r = 0; r < rows; ++r, x += C)
    for (int64_t c = 0; c < C; ++c) {
      const double d = static_cast<double>(x[c]) - shift[c];
      sum[c] += d;
      sq[c] += d * d;
    }
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
      const float y1 = x1 * al + be, y2 = x2 * al + be, y3 = x3 * al + be;
      float m = x0 * al + be, xs = x0;
      uint8_t k = 0;
      // max_pool2d's rule: a later element wins if greater, or if it is NaN.
      bool t = y1 > m || y1 != y1;
      m = t ? y1 : m, xs = t ? x1 : xs, k = t ? 1 : k;
      t = y2 > m || y2 != y2;
      m = t ? y2 : m, xs = t ? x2 : xs, k = t ? 2 : k;
      t = y3 > m || y3 != y3;
      m = t ? y3 : m, xs = t ? x3 : xs, k = t ? 3 : k;
      out[c] = (m > 0 || m != m) ? m : 0.f;  // relu; a NaN stays NaN
      pos[c] = k;
      chosen[c] = xs;
    }
}

// Per-channel sums of g' and g' * (x_k - mean) over `rows` pooled pixels.
__attribute__((target_clones("avx512f", "avx2", "default"))) void grad_sums_block(
    const float* __restrict g, const float* __restrict out, const float* __restrict chosen,
    int64_t rows, int64_t C, const double* __restrict mean, double* __restrict sdy,
    double* __restrict dot) {
  for (int64_t c = 0; c < C; ++c) sdy[c] = dot[c] = 0;
  for (int64_t r = 0; r < rows; ++r, g += C, out += C, chosen += C)
    for (int64_t c = 0; c < C; ++c) {
      const double gp = keep_if(out[c] > 0, g[c]);
      sdy[c] += gp;
      dot[c] += gp * (static_cast<double>(chosen[c]) - mean[c]);
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

struct BnPoolReluFn : torch::autograd::Function<BnPoolReluFn> {
  // momentum < 0: no running statistics to update.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               torch::Tensor running_mean, torch::Tensor running_var,
                               double momentum, double eps) {
    const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    RECORD_FUNCTION("mltrain::batchnorm_pool_relu",
                    std::vector<c10::IValue>());  // a row in `mltrain profile`
    const int64_t M = N * H * W;
    const float* xp = x.data_ptr<float>();
    std::vector<double> shift(xp, xp + C), s, q;
    blocked_sums(M, C, s, q, [&](int64_t r0, int64_t rows, double* sum, double* sq) {
      stats_block(xp + r0 * C, rows, C, shift.data(), sum, sq);
    });
    auto mean = torch::empty({C}, torch::kDouble), invstd = torch::empty({C}, torch::kDouble);
    double* mp = mean.data_ptr<double>();
    double* ip = invstd.data_ptr<double>();
    std::vector<float> alpha(static_cast<size_t>(C)), beta(static_cast<size_t>(C));
    const auto w = weight.contiguous(), b = bias.contiguous();
    const float* wp = w.data_ptr<float>();
    const float* bp = b.data_ptr<float>();
    for (int64_t c = 0; c < C; ++c) {
      const double m1 = s[c] / double(M);
      const double var = std::max(0.0, q[c] / double(M) - m1 * m1);  // biased: normalises
      mp[c] = shift[c] + m1;
      ip[c] = 1.0 / std::sqrt(var + eps);
      alpha[c] = static_cast<float>(ip[c] * wp[c]);
      beta[c] = static_cast<float>(bp[c] - mp[c] * ip[c] * wp[c]);
      if (momentum >= 0) {  // running_var takes the unbiased variance, as PyTorch's
        float* rm = running_mean.data_ptr<float>();
        float* rv = running_var.data_ptr<float>();
        rm[c] = static_cast<float>(momentum * mp[c] + (1 - momentum) * rm[c]);
        rv[c] =
            static_cast<float>(momentum * var * double(M) / double(M - 1) + (1 - momentum) * rv[c]);
      }
    }
    torch::Tensor out, pos, chosen;
    normalise_pool(x, alpha, beta, out, pos, chosen);
    ctx->save_for_backward({x, weight, out, pos, chosen});
    ctx->saved_data["mean"] = mean;
    ctx->saved_data["invstd"] = invstd;
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
    const double* mp = mean.data_ptr<double>();
    const double* ip = invstd.data_ptr<double>();
    std::vector<double> sdy, dot;
    blocked_sums(N * OH * OW, C, sdy, dot, [&](int64_t r0, int64_t rows, double* a, double* b) {
      grad_sums_block(gp + r0 * C, op + r0 * C, cp + r0 * C, rows, C, mp, a, b);
    });
    const auto w = weight.contiguous();
    const float* wp = w.data_ptr<float>();
    auto grad_w = torch::empty({C}, torch::kFloat), grad_b = torch::empty({C}, torch::kFloat);
    std::vector<float> a1(static_cast<size_t>(C)), a0(static_cast<size_t>(C)),
        sc(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      const double k = dot[c] * ip[c] * ip[c] / double(M), mean_dy = sdy[c] / double(M);
      const double iw = ip[c] * wp[c];
      a1[c] = static_cast<float>(-k * iw);
      a0[c] = static_cast<float>((mp[c] * k - mean_dy) * iw);
      sc[c] = static_cast<float>(iw);
      grad_w.data_ptr<float>()[c] = static_cast<float>(dot[c] * ip[c]);
      grad_b.data_ptr<float>()[c] = static_cast<float>(sdy[c]);
    }
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

bool fusable(const torch::Tensor& x, const torch::nn::BatchNorm2dImpl& bn) {
  return x.is_cpu() && x.scalar_type() == torch::kFloat && x.dim() == 4 &&
         x.is_contiguous(at::MemoryFormat::ChannelsLast) && x.size(1) > 0 && x.size(2) >= 2 &&
         x.size(3) >= 2 && x.size(0) * x.size(2) * x.size(3) > 1 && bn.options.affine() &&
         bn.weight.scalar_type() == torch::kFloat && bn.bias.scalar_type() == torch::kFloat &&
         bn.weight.is_cpu();
}

}  // namespace

torch::Tensor batchnorm_pool_relu_aten(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn) {
  return torch::relu(torch::max_pool2d(bn.forward(x), 2));
}

torch::Tensor batchnorm_pool_relu(const torch::Tensor& x, torch::nn::BatchNorm2dImpl& bn) {
  if (!fusable(x, bn)) return batchnorm_pool_relu_aten(x, bn);
  const bool batch_stats = bn.is_training() || !bn.options.track_running_stats();
  if (!batch_stats) {
    // Evaluation with running statistics: y = alpha x + beta, no graph needed.
    if (torch::GradMode::is_enabled() &&
        (x.requires_grad() || bn.weight.requires_grad() || bn.bias.requires_grad()))
      return batchnorm_pool_relu_aten(x, bn);
    const int64_t C = x.size(1);
    const auto rm = bn.running_mean.to(torch::kDouble).contiguous();
    const auto rv = bn.running_var.to(torch::kDouble).contiguous();
    const auto w = bn.weight.detach().contiguous(), b = bn.bias.detach().contiguous();
    std::vector<float> alpha(static_cast<size_t>(C)), beta(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      const double is = 1.0 / std::sqrt(rv.data_ptr<double>()[c] + bn.options.eps());
      alpha[c] = static_cast<float>(is * w.data_ptr<float>()[c]);
      beta[c] = static_cast<float>(b.data_ptr<float>()[c] -
                                   rm.data_ptr<double>()[c] * is * w.data_ptr<float>()[c]);
    }
    torch::Tensor out, pos, chosen;
    normalise_pool(x, alpha, beta, out, pos, chosen);
    return out;
  }
  // Training: LibTorch's BatchNorm module bookkeeping, then the fused node.
  double momentum = -1;
  if (bn.is_training() && bn.options.track_running_stats()) {
    torch::NoGradGuard no_grad;
    bn.num_batches_tracked += 1;
    momentum = bn.options.momentum().has_value()
                   ? *bn.options.momentum()
                   : 1.0 / bn.num_batches_tracked.item<double>();  // the cumulative average
  }
  torch::Tensor rm = momentum >= 0 ? bn.running_mean : torch::Tensor();
  torch::Tensor rv = momentum >= 0 ? bn.running_var : torch::Tensor();
  if (momentum >= 0 && (!rm.is_contiguous() || !rv.is_contiguous() ||
                        rm.scalar_type() != torch::kFloat || rv.scalar_type() != torch::kFloat)) {
    // Undo the count: the composite counts again.
    torch::NoGradGuard no_grad;
    bn.num_batches_tracked -= 1;
    return batchnorm_pool_relu_aten(x, bn);
  }
  return BnPoolReluFn::apply(x, bn.weight, bn.bias, rm, rv, momentum, bn.options.eps());
}

}  // namespace mltrain::model
