// Gaussian-process expected improvement: a Matern-5/2 GP whose hyperparameters L-BFGS fits, EI
// maximised over the space.
#include "mltrain/tune/pareto.hpp"
#include "mltrain/tune/sampler.hpp"
#include "sampler_common.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace mltrain::tune {
namespace {
using namespace sampling;

// ---- GP-EI ----------------------------------------------------------------------------------

// Minimises f (value and gradient) from x within [lo, hi] by L-BFGS with projected backtracking steps.
double minimize_box(
    const std::function<double(const std::vector<double>&, std::vector<double>&)>& f,
    std::vector<double>& x, const std::vector<double>& lo, const std::vector<double>& hi,
    int iters) {
  const size_t D = x.size();
  const int M = 8;
  std::vector<double> g(D), gn(D), xn(D), d(D);
  double fx = f(x, g);
  std::vector<std::vector<double>> S, Y;
  std::vector<double> rho;
  for (int it = 0; it < iters; ++it) {
    // Converged when no coordinate can still move downhill by more than 1e-5 per unit (the
    // projected gradient test of L-BFGS-B, scipy's pgtol): a warm start often begins there.
    double pg = 0;
    for (size_t j = 0; j < D; ++j)
      if (!((x[j] <= lo[j] && g[j] > 0) || (x[j] >= hi[j] && g[j] < 0)))
        pg = std::max(pg, std::fabs(g[j]));
    if (pg <= 1e-5) break;
    // two-loop recursion
    d = g;
    std::vector<double> a(S.size());
    for (int i = int(S.size()) - 1; i >= 0; --i) {
      a[size_t(i)] = rho[size_t(i)] *
                     std::inner_product(S[size_t(i)].begin(), S[size_t(i)].end(), d.begin(), 0.0);
      for (size_t j = 0; j < D; ++j) d[j] -= a[size_t(i)] * Y[size_t(i)][j];
    }
    if (!S.empty()) {
      const auto& s = S.back();
      const auto& y = Y.back();
      const double gamma = std::inner_product(s.begin(), s.end(), y.begin(), 0.0) /
                           std::inner_product(y.begin(), y.end(), y.begin(), 0.0);
      for (auto& v : d) v *= gamma;
    }
    for (size_t i = 0; i < S.size(); ++i) {
      const double b = rho[i] * std::inner_product(Y[i].begin(), Y[i].end(), d.begin(), 0.0);
      for (size_t j = 0; j < D; ++j) d[j] += S[i][j] * (a[i] - b);
    }
    for (auto& v : d) v = -v;
    if (S.empty()) {  // no curvature known yet: a first step of at most unit length (as L-BFGS-B)
      const double nd = std::sqrt(std::inner_product(d.begin(), d.end(), d.begin(), 0.0));
      if (nd > 1.0)
        for (auto& v : d) v /= nd;
    }
    // Directions into an active bound are dropped.
    for (size_t j = 0; j < D; ++j)
      if ((x[j] <= lo[j] && d[j] < 0) || (x[j] >= hi[j] && d[j] > 0)) d[j] = 0;
    double slope = std::inner_product(g.begin(), g.end(), d.begin(), 0.0);
    if (slope >= 0) {  // not a descent direction: steepest descent, memory reset
      S.clear(), Y.clear(), rho.clear();
      for (size_t j = 0; j < D; ++j)
        d[j] = ((x[j] <= lo[j] && g[j] > 0) || (x[j] >= hi[j] && g[j] < 0)) ? 0 : -g[j];
      slope = std::inner_product(g.begin(), g.end(), d.begin(), 0.0);
      if (slope >= -1e-16) break;
      // Scale a steepest-descent step to at most a unit-cube-sized move.
      const double nd = std::sqrt(std::inner_product(d.begin(), d.end(), d.begin(), 0.0));
      if (nd > 0.5) {
        for (auto& v : d) v *= 0.5 / nd;
        slope *= 0.5 / nd;
      }
    }
    double t = 1.0, fn = 0;
    bool ok = false;
    for (int ls = 0; ls < 30; ++ls) {
      for (size_t j = 0; j < D; ++j) xn[j] = std::clamp(x[j] + t * d[j], lo[j], hi[j]);
      fn = f(xn, gn);
      if (std::isfinite(fn) && fn <= fx + 1e-4 * t * slope) {
        ok = true;
        break;
      }
      t *= 0.5;
    }
    if (!ok) break;
    std::vector<double> s(D), y(D);
    for (size_t j = 0; j < D; ++j) s[j] = xn[j] - x[j], y[j] = gn[j] - g[j];
    const double sy = std::inner_product(s.begin(), s.end(), y.begin(), 0.0);
    if (sy > 1e-12) {
      S.push_back(s), Y.push_back(y), rho.push_back(1.0 / sy);
      if (int(S.size()) > M) S.erase(S.begin()), Y.erase(Y.begin()), rho.erase(rho.begin());
    }
    const double improvement = fx - fn;
    x = xn, g = gn, fx = fn;
    // L-BFGS-B's relative decrease test at scipy's default (factr 1e7 x machine epsilon): below
    // it a step moves the log likelihood or log EI by nothing a suggestion can tell apart.
    if (improvement < 2.2e-9 * std::max(1.0, std::fabs(fx))) break;
  }
  return fx;
}

}  // namespace

// The kernel loops also get AVX-512 and AVX2 copies, picked at load time by what the CPU has:
// eight and four lanes where the baseline SSE2 has two. The file is compiled without
// floating-point contraction (lib/CMakeLists.txt), so no copy fuses a multiply and an add: each
// entry's arithmetic, and with it every suggestion, is bitwise the same on any copy. GCC only
// (the sanitizer build uses clang).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MLTRAIN_GP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MLTRAIN_GP_CLONES
#endif

namespace detail {

constexpr double kSqrt5 = 2.2360679774997896;

}  // namespace detail

// e^x without libm, for -700 <= x <= 0: Cody-Waite reduction x = k ln 2 + f, |f| <= ln2 / 2,
// Taylor to degree 13, 2^k by the exponent bits. Plain arithmetic, so the kernel loops below
// vectorise (libm's exp is one call per entry: most of a GP suggestion's time); within 2 ulp of
// exp (test_tune).
static inline double exp_reduced(double x) {
  constexpr double kLog2e = 1.4426950408889634, kShift = 6755399441055744.0;  // 1.5 * 2^52
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  const double kd = x * kLog2e + kShift;  // k + kShift: k rounded into the low mantissa bits
  const double k = kd - kShift;
  const double f = (x - k * kLn2Hi) - k * kLn2Lo;
  double p = 1.0 / 6227020800.0;
  p = p * f + 1.0 / 479001600.0;
  p = p * f + 1.0 / 39916800.0;
  p = p * f + 1.0 / 3628800.0;
  p = p * f + 1.0 / 362880.0;
  p = p * f + 1.0 / 40320.0;
  p = p * f + 1.0 / 5040.0;
  p = p * f + 1.0 / 720.0;
  p = p * f + 1.0 / 120.0;
  p = p * f + 1.0 / 24.0;
  p = p * f + 1.0 / 6.0;
  p = p * f + 0.5;
  p = p * f + 1.0;
  p = p * f + 1.0;
  uint64_t bits;
  std::memcpy(&bits, &kd, sizeof bits);
  bits = (bits - 0x4338000000000000ULL + 1023) << 52;  // the biased exponent of 2^k
  double scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

double detail::exp_nonpositive(double x) { return exp_reduced(std::max(x, -700.0)); }

namespace detail {
// Matern-5/2 at squared distances r2[0..m), with each r and exp(-sqrt(5) r) left in r and e (the
// likelihood's gradient and the posterior's use them). Two passes: with the clamp and the
// exponential in one loop GCC turns the clamp into a branch and vectorises neither. The tune
// room builds with -fno-math-errno, so sqrt is an instruction, not a call. Below e^-700 (r > 313)
// an entry is e^-700 x its polynomial: zero to the model.
MLTRAIN_GP_CLONES static void matern52_row(const double* r2, size_t m, double amp, double* k,
                                           double* r, double* e) {
  for (size_t j = 0; j < m; ++j) {  // r2 is a sum of squares: never below 0
    r[j] = std::sqrt(r2[j]);
    e[j] = std::max(-kSqrt5 * r[j], -700.0);
  }
  for (size_t j = 0; j < m; ++j) {
    e[j] = exp_reduced(e[j]);
    k[j] = amp * (1.0 + kSqrt5 * r[j] + 5.0 / 3.0 * r2[j]) * e[j];
  }
}
static void matern52_row(const double* r2, size_t m, double amp, double* k) {
  thread_local std::vector<double> r, e;
  r.resize(m), e.resize(m);
  matern52_row(r2, m, amp, k, r.data(), e.data());
}

// v = L^-1 v in place (L lower, row-major n x n; LT its transpose), returning v . v: in column
// order, entry i subtracts L[i][j] v[j] for j = 0..i-1 in the order a row-wise solve does (bitwise
// the same), each finished v[j] in one contiguous pass over LT's row. Inlined into its callers'
// AVX2 copies.
[[gnu::always_inline]] static inline double solve_lower(const std::vector<double>& L,
                                                        const std::vector<double>& LT, size_t n,
                                                        double* v) {
  double vv = 0;
  for (size_t j = 0; j < n; ++j) {
    const double vj = v[j] / L[j * n + j];
    v[j] = vj;
    vv += vj * vj;
    const double* LTj = &LT[j * n];
    for (size_t i = j + 1; i < n; ++i) v[i] -= LTj[i] * vj;
  }
  return vv;
}

// r2[j] = squared distance of x to data point j < m in length-scale units: scaled_r2's sums
// (coordinates in order), the points side by side over X by coordinate (Xt, n points a row).
// Inlined into its callers' SIMD copies.
[[gnu::always_inline]] static inline void scaled_r2_many(const double* x,
                                                         const std::vector<double>& Xt,
                                                         const std::vector<double>& ils, size_t n,
                                                         size_t m, double* r2) {
  std::fill(r2, r2 + m, 0.0);
  for (size_t d = 0; d < ils.size(); ++d) {
    const double xd = x[d], il = ils[d];
    const double* col = &Xt[d * n];
    for (size_t j = 0; j < m; ++j) {
      const double t = (xd - col[j]) * il;
      r2[j] += t * t;
    }
  }
}

MLTRAIN_GP_CLONES bool GpModel::factor() {
  const size_t n = X.size(), D = log_ls.size();
  const double amp = std::exp(log_amp), noise = std::exp(log_noise);
  ils.resize(D);
  for (size_t d = 0; d < D; ++d) ils[d] = std::exp(-log_ls[d]);
  L.assign(n * n, 0.0);
  ke.assign(n * n, 0.0);
  Xt.resize(D * n);
  for (size_t j = 0; j < n; ++j)
    for (size_t d = 0; d < D; ++d) Xt[d * n + j] = X[j][d];
  std::vector<double> r2(n), r(n);
  for (size_t i = 0; i < n; ++i) {
    scaled_r2_many(X[i].data(), Xt, ils, n, i + 1, r2.data());  // to points 0..i
    matern52_row(r2.data(), i + 1, amp, &L[i * n], r.data(), &ke[i * n]);
    L[i * n + i] += noise + 1e-10;
  }
  // In-place Cholesky (lower), right-looking: once column j is final (and copied into LT's row
  // j), every later row subtracts its multiple of it from its own entries j+1..i in one contiguous
  // pass (vectorised). Each entry still receives its subtractions in order k = 0, 1, ..., as the
  // textbook's dot products do, so the factor is bitwise the same (test_tune).
  LT.assign(n * n, 0.0);
  for (size_t j = 0; j < n; ++j) {
    double* Lj = &L[j * n];
    const double s = Lj[j];
    if (!(s > 0)) return false;
    const double ljj = std::sqrt(s);
    Lj[j] = ljj;
    double* LTj = &LT[j * n];
    LTj[j] = ljj;
    for (size_t i = j + 1; i < n; ++i) LTj[i] = L[i * n + j] /= ljj;
    for (size_t i = j + 1; i < n; ++i) {
      double* Li = &L[i * n];
      const double a = Li[j];
      for (size_t k = j + 1; k <= i; ++k) Li[k] -= a * LTj[k];
    }
  }
  alpha = y;  // solve L L^T alpha = y
  for (size_t i = 0; i < n; ++i) {
    double v = alpha[i];
    for (size_t k = 0; k < i; ++k) v -= L[i * n + k] * alpha[k];
    alpha[i] = v / L[i * n + i];
  }
  for (size_t i = n; i-- > 0;) {
    double v = alpha[i];
    for (size_t k = i + 1; k < n; ++k) v -= L[k * n + i] * alpha[k];
    alpha[i] = v / L[i * n + i];
  }
  return true;
}

// log p(y | X, theta) + log prior(theta); gradient over (log_ls..., log_amp, log_noise).
MLTRAIN_GP_CLONES double GpModel::log_marginal_likelihood(std::vector<double>* grad) const {
  const size_t n = X.size(), D = log_ls.size();
  double lml = 0;
  for (size_t i = 0; i < n; ++i) lml -= 0.5 * y[i] * alpha[i] + std::log(L[i * n + i]);
  lml -= 0.5 * double(n) * std::log(2 * M_PI);
  // Weak log-normal priors keep the fit away from degenerate length scales and amplitudes.
  auto prior = [](double v, double m, double s) { return -0.5 * ((v - m) / s) * ((v - m) / s); };
  auto dprior = [](double v, double m, double s) { return -(v - m) / (s * s); };
  for (size_t d = 0; d < D; ++d) lml += prior(log_ls[d], std::log(0.5), 1.5);
  lml += prior(log_amp, 0.0, 1.5);
  if (!grad) return lml;
  // K^-1 = L^-T L^-1 from the Cholesky factor. W = alpha alpha^T - K^-1;
  // dlml/dtheta = 0.5 tr(W dK/dtheta).
  // Every entry's sum runs in the order of the plain loops (column-by-column forward
  // substitution, dot products of L^-1's columns, pair-by-pair gradient sums), so the result is
  // bitwise the same, but the independent entries of a row go side by side (vectorised) and no
  // division waits on the one before it.
  // L^-1 by rows (Li, row-major): entry (i, j < i) subtracts L[i][k] Li[k][j] for k = j..i-1 in
  // that order, then divides by L[i][i]; row i takes each finished row k in one contiguous pass.
  thread_local std::vector<double> Li, Kinv, T2, mwb, mwk, zeros;  // scratch kept between calls
  Li.assign(n * n, 0.0), Kinv.assign(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    double* row = &Li[i * n];
    const double* Lrow = &L[i * n];
    size_t k = 0;
    for (; k + 4 <= i; k += 4) {  // rows k..k+3 in one pass over j <= k; their tails after
      const double a0 = Lrow[k], a1 = Lrow[k + 1], a2 = Lrow[k + 2], a3 = Lrow[k + 3];
      const double *L0 = &Li[k * n], *L1 = L0 + n, *L2 = L1 + n, *L3 = L2 + n;
      for (size_t j = 0; j <= k; ++j) {
        double v = row[j];
        v -= a0 * L0[j];
        v -= a1 * L1[j];
        v -= a2 * L2[j];
        v -= a3 * L3[j];
        row[j] = v;
      }
      row[k + 1] = ((row[k + 1] - a1 * L1[k + 1]) - a2 * L2[k + 1]) - a3 * L3[k + 1];
      row[k + 2] = (row[k + 2] - a2 * L2[k + 2]) - a3 * L3[k + 2];
      row[k + 3] -= a3 * L3[k + 3];
    }
    for (; k < i; ++k) {
      const double a = Lrow[k];
      const double* Lk = &Li[k * n];
      for (size_t j = 0; j <= k; ++j) row[j] -= a * Lk[j];
    }
    const double lii = Lrow[i];
    for (size_t j = 0; j < i; ++j) row[j] /= lii;
    row[i] = 1.0 / lii;
  }
  // K^-1's lower triangle: entry (i, j) gathers Li[k][i] Li[k][j] over k = i..n-1 in that order.
  // Four k at a time per pass over the row: each entry still adds them in order k, k+1, ...
  for (size_t i = 0; i < n; ++i) {
    double* Ki = &Kinv[i * n];
    size_t k = i;
    for (; k + 4 <= n; k += 4) {
      const double a0 = Li[k * n + i], a1 = Li[(k + 1) * n + i], a2 = Li[(k + 2) * n + i],
                   a3 = Li[(k + 3) * n + i];
      const double *L0 = &Li[k * n], *L1 = L0 + n, *L2 = L1 + n, *L3 = L2 + n;
      for (size_t j = 0; j <= i; ++j) {
        double v = Ki[j];
        v += a0 * L0[j];
        v += a1 * L1[j];
        v += a2 * L2[j];
        v += a3 * L3[j];
        Ki[j] = v;
      }
    }
    for (; k < n; ++k) {
      const double a = Li[k * n + i];
      const double* Lk = &Li[k * n];
      for (size_t j = 0; j <= i; ++j) Ki[j] += a * Lk[j];
    }
  }
  // The gradient, row i of pairs at a time: each pair's terms side by side (factor()'s Xt), then
  // summed into the gradient pair by pair in the plain loop's order.
  std::vector<double>& g = *grad;
  g.assign(D + 2, 0.0);
  const double amp = std::exp(log_amp), noise = std::exp(log_noise);
  T2.resize(D * n), mwb.resize(n), mwk.resize(n), zeros.resize(n);  // zeros: never written
  thread_local std::vector<double> r2v;
  r2v.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t m = i + 1;  // pairs (i, 0..i)
    std::fill(r2v.begin(), r2v.begin() + long(m), 0.0);
    for (size_t d = 0; d < D; ++d) {
      const double xid = X[i][d], il = ils[d];
      const double* xd = &Xt[d * n];
      double* t2 = &T2[d * n];
      for (size_t j = 0; j < m; ++j) {
        const double t = (xid - xd[j]) * il;
        t2[j] = t * t;
        r2v[j] += t2[j];
      }
    }
    const double ai = alpha[i];
    const double* Ki = &Kinv[i * n];
    const double* ei = &ke[i * n];
    for (size_t j = 0; j < m; ++j) {
      const double w = ai * alpha[j] - Ki[j];
      const double mult = j == i ? 0.5 : 1.0;  // symmetric: off-diagonal pairs count twice
      const double r2 = r2v[j], r = std::sqrt(r2), e = ei[j];  // factor()'s exponential, bitwise
      const double k = amp * (1.0 + kSqrt5 * r + 5.0 / 3.0 * r2) * e;
      const double base = amp * 5.0 / 3.0 * (1.0 + kSqrt5 * r) * e;  // dk/dlog_ls_d = base * t2_d
      mwb[j] = mult * w * base;
      mwk[j] = mult * w * k;
    }
    // The sums in registers, up to seven coordinates and the amplitude's per pass over the row
    // (in the gradient vector every += would wait on the store of the one before).
    for (size_t d0 = 0; d0 < D || d0 == 0; d0 += 7) {
      const size_t cnt = std::min<size_t>(D - d0, 7);
      const double* r[7];
      double s[7];
      for (size_t l = 0; l < 7; ++l)
        r[l] = l < cnt ? &T2[(d0 + l) * n] : zeros.data(), s[l] = l < cnt ? g[d0 + l] : 0.0;
      const double *r0 = r[0], *r1 = r[1], *r2 = r[2], *r3 = r[3], *r4 = r[4], *r5 = r[5],
                   *r6 = r[6], *kk = d0 == 0 ? mwk.data() : zeros.data();
      double s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3], s4 = s[4], s5 = s[5], s6 = s[6];
      double sk = d0 == 0 ? g[D] : 0.0;
      for (size_t j = 0; j < m; ++j) {
        const double b = mwb[j];
        s0 += b * r0[j], s1 += b * r1[j], s2 += b * r2[j], s3 += b * r3[j];
        s4 += b * r4[j], s5 += b * r5[j], s6 += b * r6[j], sk += kk[j];
      }
      const double out[7] = {s0, s1, s2, s3, s4, s5, s6};
      for (size_t l = 0; l < cnt; ++l) g[d0 + l] = out[l];
      if (d0 == 0) g[D] = sk;
    }
    g[D + 1] += 0.5 * (ai * ai - Ki[i]) * noise;
  }
  for (size_t d = 0; d < D; ++d) g[d] += dprior(log_ls[d], std::log(0.5), 1.5);
  g[D] += dprior(log_amp, 0.0, 1.5);
  return lml;
}

std::vector<double> GpModel::theta() const {
  auto th = log_ls;
  th.push_back(log_amp), th.push_back(log_noise);
  return th;
}

void GpModel::fit(const std::vector<std::vector<double>>& Xin, const std::vector<double>& yin,
                  uint64_t seed, const std::vector<double>* warm, Restart restart) {
  X = Xin, y = yin;
  if (X.size() > kFitPoints) {  // the best half and the latest half (Xin is in trial order)
    std::vector<size_t> order(X.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return yin[a] < yin[b]; });
    std::vector<bool> take(X.size(), false);
    for (size_t i = 0; i < kFitPoints / 2; ++i) take[order[i]] = true;
    size_t taken = kFitPoints / 2;
    for (size_t i = X.size(); i-- > 0 && taken < kFitPoints;)
      if (!take[i]) take[i] = true, ++taken;
    X.clear(), y.clear();
    for (size_t i = 0; i < Xin.size(); ++i)
      if (take[i]) X.push_back(Xin[i]), y.push_back(yin[i]);
  }
  const size_t D = X.empty() ? 0 : X[0].size();
  std::vector<double> lo(D + 2), hi(D + 2);
  for (size_t d = 0; d < D; ++d) lo[d] = std::log(0.01), hi[d] = std::log(20.0);
  lo[D] = std::log(0.05), hi[D] = std::log(20.0);
  lo[D + 1] = std::log(1e-8), hi[D + 1] = std::log(0.1);
  auto set = [&](const std::vector<double>& th) {
    log_ls.assign(th.begin(), th.begin() + long(D));
    log_amp = th[D], log_noise = th[D + 1];
  };
  auto objective = [&](const std::vector<double>& th, std::vector<double>& g) {
    set(th);
    if (!factor()) {
      g.assign(th.size(), 0.0);
      return std::numeric_limits<double>::infinity();
    }
    const double v = log_marginal_likelihood(&g);
    for (auto& x : g) x = -x;
    return -v;
  };
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> U(0, 1);
  std::vector<std::vector<double>> starts;
  std::vector<double> th0(D + 2, std::log(0.3));
  th0[D] = 0.0, th0[D + 1] = std::log(1e-6);
  const bool has_warm = warm && warm->size() == D + 2;
  auto random_start = [&] {
    std::vector<double> th(D + 2);
    for (size_t i = 0; i < D + 2; ++i) th[i] = lo[i] + U(rng) * (hi[i] - lo[i]);
    th[D + 1] = std::log(1e-6);
    return th;
  };
  if (has_warm) {
    starts.push_back(*warm);
    for (size_t i = 0; i < D + 2; ++i)
      starts.back()[i] = std::clamp(starts.back()[i], lo[i], hi[i]);
    if (restart == Restart::prior) starts.push_back(th0);
    if (restart == Restart::random) starts.push_back(random_start());
  } else {
    starts = {th0, random_start(), random_start()};
  }
  double best = std::numeric_limits<double>::infinity();
  std::vector<double> best_th = starts[0];
  // With a restart the warm start is only evaluated, not refined (it was refined one observation
  // ago and will be again from whichever start wins): one start's iterations per suggestion, so the
  // restarting suggestions cost what the others do instead of twice as much.
  for (size_t s = 0; s < starts.size(); ++s) {
    auto th = starts[s];
    const int iters = !has_warm ? 60 : (restart != Restart::none && s == 0) ? 0 : 30;
    const double v = minimize_box(objective, th, lo, hi, iters);
    if (v < best) best = v, best_th = th;
  }
  set(best_th);
  X = Xin, y = yin;  // condition on every point
  if (!factor()) {   // numerically hopeless: fall back to a noisier model
    log_noise = std::log(1e-3);
    factor();
  }
}

// Squared distance of x to a data point in length-scale units (ils from factor()).
double GpModel::scaled_r2(const std::vector<double>& x, const double* xi) const {
  double r2 = 0;
  for (size_t d = 0; d < ils.size(); ++d) {
    const double t = (x[d] - xi[d]) * ils[d];
    r2 += t * t;
  }
  return r2;
}

MLTRAIN_GP_CLONES void GpModel::predict(const std::vector<double>& x, double& mean,
                                        double& sd) const {
  const size_t n = X.size();
  const double amp = std::exp(log_amp);
  thread_local std::vector<double> k, r2;
  k.resize(n), r2.resize(n);
  scaled_r2_many(x.data(), Xt, ils, n, n, r2.data());
  matern52_row(r2.data(), n, amp, k.data());
  mean = std::inner_product(k.begin(), k.end(), alpha.begin(), 0.0);
  const double vv = solve_lower(L, LT, n, k.data());  // k becomes L^-1 k
  sd = std::sqrt(std::max(amp - vv, 1e-12));
}

void GpModel::predict_many(const std::vector<std::vector<double>>& xs, std::vector<double>& mean,
                           std::vector<double>& sd) const {
  std::vector<double> flat;
  flat.reserve(xs.size() * ils.size());
  for (const auto& x : xs) flat.insert(flat.end(), x.begin(), x.end());
  predict_many(flat.data(), xs.size(), mean, sd);
}

MLTRAIN_GP_CLONES void GpModel::predict_many(const double* xs, size_t m, std::vector<double>& mean,
                                             std::vector<double>& sd) const {
  // predict()'s arithmetic for a block of points at once: the kernel block [n][B], the mean and
  // the forward solve with the points innermost, so each point's sums run in predict()'s order
  // while the block's points are independent (vectorised) work.
  // Whole blocks only (a short last block is padded with its first point): the inner loops have
  // a fixed length the compiler vectorises without remainder code.
  constexpr size_t B = 32;
  const size_t n = X.size();
  const double amp = std::exp(log_amp);
  mean.assign(m, 0.0), sd.assign(m, 0.0);
  const size_t D = ils.size();
  std::vector<double> K(n * B), R2(n * B), xt(D * B), mu(B), vv(B);
  for (size_t c0 = 0; c0 < m; c0 += B) {
    const size_t b = std::min(B, m - c0);
    for (size_t c = 0; c < B; ++c)  // the block's points by coordinate
      for (size_t d = 0; d < D; ++d) xt[d * B + c] = xs[(c0 + (c < b ? c : 0)) * D + d];
    std::fill(R2.begin(), R2.end(), 0.0);
    for (size_t i = 0; i < n; ++i)  // scaled_r2's sums, coordinates in its order
      for (size_t d = 0; d < D; ++d) {
        const double xid = X[i][d], il = ils[d];
        for (size_t c = 0; c < B; ++c) {
          const double t = (xt[d * B + c] - xid) * il;
          R2[i * B + c] += t * t;
        }
      }
    matern52_row(R2.data(), n * B, amp, K.data());
    std::fill(mu.begin(), mu.end(), 0.0), std::fill(vv.begin(), vv.end(), 0.0);
    for (size_t i = 0; i < n; ++i) {
      const double ai = alpha[i];
      const double* ki = &K[i * B];
      for (size_t c = 0; c < B; ++c) mu[c] += ki[c] * ai;
    }
    // The forward solve row by row: row i gathers its subtractions j = 0..i-1 in a register
    // block, in the order the column-wise solve applies them (bitwise the same), so each
    // finished row is read, not read and written, by the rows after it.
    for (size_t i = 0; i < n; ++i) {
      double acc[B];
      double* ki = &K[i * B];
      for (size_t c = 0; c < B; ++c) acc[c] = ki[c];
      const double* Li = &L[i * n];
      size_t j = 0;
      for (; j + 4 <= i; j += 4) {  // four finished rows per pass over the block, in order
        const double l0 = Li[j], l1 = Li[j + 1], l2 = Li[j + 2], l3 = Li[j + 3];
        const double *v0 = &K[j * B], *v1 = v0 + B, *v2 = v1 + B, *v3 = v2 + B;
        for (size_t c = 0; c < B; ++c)
          acc[c] = (((acc[c] - l0 * v0[c]) - l1 * v1[c]) - l2 * v2[c]) - l3 * v3[c];
      }
      for (; j < i; ++j) {
        const double lij = Li[j];
        const double* vj = &K[j * B];
        for (size_t c = 0; c < B; ++c) acc[c] -= lij * vj[c];
      }
      const double lii = Li[i];
      for (size_t c = 0; c < B; ++c) acc[c] /= lii, vv[c] += acc[c] * acc[c], ki[c] = acc[c];
    }
    for (size_t c = 0; c < b; ++c)
      mean[c0 + c] = mu[c], sd[c0 + c] = std::sqrt(std::max(amp - vv[c], 1e-12));
  }
}

MLTRAIN_GP_CLONES void GpModel::predict_grad(const std::vector<double>& x, double& mean, double& sd,
                                             std::vector<double>& dmean,
                                             std::vector<double>& dsd) const {
  const size_t n = X.size(), D = log_ls.size();
  const double amp = std::exp(log_amp);
  thread_local std::vector<double> k, dk, v, r2, r, e;  // dk[i * D + d] = dk_i / dx_d
  k.resize(n), dk.resize(n * D), v.resize(n), r2.resize(n), r.resize(n), e.resize(n);
  scaled_r2_many(x.data(), Xt, ils, n, n, r2.data());
  matern52_row(r2.data(), n, amp, k.data(), r.data(), e.data());
  for (size_t i = 0; i < n; ++i) {
    const double* xi = X[i].data();
    const double c =
        -5.0 / 3.0 * amp * (1.0 + kSqrt5 * r[i]) * e[i];  // dk/dx_d = c (x_d - X_id) ils_d^2
    for (size_t d = 0; d < D; ++d) dk[i * D + d] = c * (x[d] - xi[d]) * ils[d] * ils[d];
  }
  mean = std::inner_product(k.begin(), k.end(), alpha.begin(), 0.0);
  v = k;
  const double vv = solve_lower(L, LT, n, v.data());  // v = L^-1 k
  for (size_t j = n; j-- > 0;) {  // w = L^-T v = K^-1 k, in place, by columns of L^T (rows of L)
    const double wj = v[j] / L[j * n + j];
    v[j] = wj;
    const double* Lj = &L[j * n];
    for (size_t i = 0; i < j; ++i) v[i] -= Lj[i] * wj;
  }
  const double var = amp - vv;
  sd = std::sqrt(std::max(var, 1e-12));
  dmean.assign(D, 0.0), dsd.assign(D, 0.0);
  for (size_t i = 0; i < n; ++i)
    for (size_t d = 0; d < D; ++d) {
      dmean[d] += alpha[i] * dk[i * D + d];
      dsd[d] += -2.0 * v[i] * dk[i * D + d];  // dvar/dx_d = -2 w^T dk/dx_d
    }
  for (auto& g : dsd) g = var > 1e-12 ? g / (2.0 * sd) : 0.0;
}

double expected_improvement(double mean, double sd, double best, double xi) {
  const double imp = best - mean - xi;
  const double z = imp / sd;
  return imp * norm_cdf(z) + sd * std::exp(norm_logpdf(z));
}

// log EI = log sd + log h(z), h(z) = z Phi(z) + phi(z), z = (best - mean - xi) / sd; h' = Phi.
double log_ei(double mean, double sd, double best, double xi, double* dmean, double* dsd) {
  const double z = (best - mean - xi) / sd;
  double v, dlogh;  // log EI and d log h / dz
  if (z > -6) {
    const double h = std::max(z * norm_cdf(z) + std::exp(norm_logpdf(z)), 1e-300);
    v = std::log(h) + std::log(sd);
    dlogh = norm_cdf(z) / h;
  } else {
    // phi(z) + z Phi(z) ~ phi(z) / z^2 (1 - 3 / z^2) for z -> -inf (Mills ratio)
    v = norm_logpdf(z) - 2 * std::log(-z) + std::log1p(-3.0 / (z * z)) + std::log(sd);
    dlogh = -z - 2.0 / z + (6.0 / (z * z * z)) / (1.0 - 3.0 / (z * z));
  }
  if (dmean) *dmean = -dlogh / sd;
  if (dsd) *dsd = 1.0 / sd - dlogh * z / sd;
  return v;
}

}  // namespace detail

namespace {
using namespace sampling;

class GpSampler : public Sampler {
 public:
  GpSampler(SamplerOptions o, const Space& space) : o_(std::move(o)) {
    for (const auto& p : space) {
      offset_.push_back(width_);
      width_ += p.numeric() ? 1 : p.n_choices();
    }
  }
  std::string name() const override { return "gp"; }

  std::optional<std::vector<double>> sample(const Space& space,
                                            const std::vector<Observation>& hist, uint64_t seed,
                                            int number) override {
    std::mt19937_64 rng(detail::seed_for(seed, number));
    std::vector<const Observation*> obs, pending;
    for (const auto& h : hist)
      if (h.running)
        pending.push_back(&h);
      else if (!h.pruned && std::isfinite(h.value))
        obs.push_back(&h);
    const int n_init = static_cast<int>(std::max<int64_t>(o_.n_startup, 2));
    if (int(obs.size()) < n_init) {
      if (number < n_init) return latin_hypercube(space, seed, number, n_init);
      std::vector<double> x;  // the design is used up, its results still running: random
      for (const auto& p : space) x.push_back(p.sample(rng));
      return x;
    }
    std::sort(obs.begin(), obs.end(), [](auto a, auto b) { return a->number < b->number; });
    std::vector<std::vector<double>> X;
    std::vector<double> y;
    for (const auto* o : obs) X.push_back(encode(space, o->x)), y.push_back(o->value);
    const double mean = std::accumulate(y.begin(), y.end(), 0.0) / double(y.size());
    double var = 0;
    for (double v : y) var += (v - mean) * (v - mean);
    const double sdv =
        std::sqrt(var / double(y.size())) > 0 ? std::sqrt(var / double(y.size())) : 1.0;
    for (auto& v : y) v = (v - mean) / sdv;
    // Hyperparameters: a short fit warm-started from the previous one (as Optuna's GP does). Every
    // kRestart observations one more start joins it, the default and a random one in turn, so a
    // poor optimum is left; on those suggestions the warm start is only evaluated, so no
    // suggestion runs more than one start's iterations (the slowest stays near the typical one).
    detail::GpModel gp;
    using Restart = detail::GpModel::Restart;
    Restart restart = Restart::none;
    if (!warm_.empty() && int(obs.size()) - warm_n_ >= kRestart) {
      restart = prior_next_ ? Restart::prior : Restart::random;
      prior_next_ = !prior_next_;
    }
    gp.fit(X, y, detail::seed_for(seed, number) ^ 0x5bd1e995, warm_.empty() ? nullptr : &warm_,
           restart);
    if (warm_.empty() || restart != Restart::none) warm_n_ = int(obs.size());
    warm_ = gp.theta();
    double best = *std::min_element(y.begin(), y.end());
    // Believed values are data like any other: the incumbent includes them, so EI at a running
    // trial predicted to improve is ~0 instead of its predicted improvement.
    if (o_.pending == "liar" && !pending.empty())
      best = std::min(best, believe(space, gp, pending));
    return decode(space, maximize_ei(space, gp, X, y, best, rng));
  }

 private:
  // log EI's maximum: uniform candidates plus perturbations of the best observations; the top
  // five refined by L-BFGS over the continuous coordinates with the analytic gradient.
  std::vector<double> maximize_ei(const Space& space, const detail::GpModel& gp,
                                  const std::vector<std::vector<double>>& X,
                                  const std::vector<double>& y, double best,
                                  std::mt19937_64& rng) const {
    // The candidates flat, row c at C[c * W], drawn in the order the draws have always had.
    const size_t W = width_;
    std::uniform_real_distribution<double> U(0, 1);
    std::normal_distribution<double> N(0, 1);
    std::vector<double> C;
    C.reserve((1000 + 500) * W);
    for (int i = 0; i < 1000; ++i)
      for (size_t j = 0; j < W; ++j) C.push_back(U(rng));
    std::vector<size_t> order(y.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return y[a] < y[b]; });
    for (size_t r = 0; r < std::min<size_t>(5, order.size()); ++r)
      for (int i = 0; i < 100; ++i) {
        const double s = i < 50 ? 0.02 : 0.1;
        for (double v : X[order[r]]) C.push_back(std::clamp(v + s * N(rng), 0.0, 1.0));
      }
    const size_t m = C.size() / W;
    std::vector<double> acq(m);
    {  // log EI at every candidate as the objective will see it, the posterior in blocks
      std::vector<double> seen(C.size()), mean, sd;
      for (size_t c = 0; c < m; ++c) round_trip(space, &C[c * W], &seen[c * W]);
      gp.predict_many(seen.data(), m, mean, sd);
      for (size_t c = 0; c < m; ++c) acq[c] = detail::log_ei(mean[c], sd[c], best, o_.xi);
    }
    // Best first (the permutation sorting (acq, candidate) pairs by acq gives).
    std::vector<size_t> rank(m);
    std::iota(rank.begin(), rank.end(), size_t{0});
    std::sort(rank.begin(), rank.end(), [&](size_t a, size_t b) { return acq[a] > acq[b]; });
    auto candidate = [&](size_t c) {
      const double* z = &C[rank[c] * W];
      return std::vector<double>(z, z + W);
    };
    std::vector<bool> cont(width_, false);
    for (size_t d = 0; d < space.size(); ++d)
      if (space[d].kind == Param::Kind::Float && space[d].step == 0)
        cont[size_t(offset_[d])] = true;
    double best_acq = acq[rank[0]];
    std::vector<double> best_z = candidate(0);
    for (size_t c = 0; c < std::min<size_t>(5, m); ++c) {
      std::vector<double> z = candidate(c);
      std::vector<double> free_lo, free_hi, u;
      std::vector<size_t> idx;
      for (size_t j = 0; j < width_; ++j)
        if (cont[j])
          idx.push_back(j), u.push_back(z[j]), free_lo.push_back(0.0), free_hi.push_back(1.0);
      if (idx.empty()) break;
      // -log EI over the continuous coordinates, gradient by the chain rule through the
      // posterior's (the others are fixed, so round_trip leaves them as they are).
      std::vector<double> dm, ds, zz;
      const std::vector<double> fixed = round_trip(space, z);  // the same at every step
      auto f = [&](const std::vector<double>& uu, std::vector<double>& g) {
        zz = fixed;
        for (size_t k = 0; k < idx.size(); ++k) zz[idx[k]] = uu[k];
        double m, sd, gm, gs;
        gp.predict_grad(zz, m, sd, dm, ds);
        const double v = -detail::log_ei(m, sd, best, o_.xi, &gm, &gs);
        g.assign(uu.size(), 0.0);
        for (size_t k = 0; k < idx.size(); ++k) g[k] = -(gm * dm[idx[k]] + gs * ds[idx[k]]);
        return v;
      };
      const double v = -minimize_box(f, u, free_lo, free_hi, 40);
      if (v > best_acq) {
        best_acq = v;
        for (size_t k = 0; k < idx.size(); ++k) z[idx[k]] = u[k];
        best_z = z;
      }
    }
    return best_z;
  }

  // Kriging believer: each running trial joins the data at the model's mean there (the fitted
  // hyperparameters kept), so its posterior sd, and with it EI, nearly vanishes around it.
  double believe(const Space& space, detail::GpModel& gp,
                 const std::vector<const Observation*>& pending) const {
    auto X = gp.X;
    auto y = gp.y;
    double lowest = std::numeric_limits<double>::infinity();
    for (const auto* p : pending) {
      if (p->x.size() != space.size()) continue;
      const auto z = encode(space, p->x);
      double m, s;
      gp.predict(z, m, s);
      X.push_back(z), y.push_back(m);
      lowest = std::min(lowest, m);
    }
    const auto keep_X = gp.X;
    const auto keep_y = gp.y;
    gp.X = X, gp.y = y;
    if (!gp.factor()) {  // a pending point on top of an observed one: believe nothing
      gp.X = keep_X, gp.y = keep_y;
      gp.factor();
      return std::numeric_limits<double>::infinity();
    }
    return lowest;
  }

  std::vector<double> encode(const Space& space, const std::vector<double>& x) const {
    std::vector<double> z(width_, 0.0);
    for (size_t d = 0; d < space.size(); ++d)
      if (space[d].numeric())
        z[size_t(offset_[d])] = space[d].to_unit(x[d]);
      else
        z[size_t(offset_[d]) + size_t(x[d])] = 1.0;
    return z;
  }
  std::vector<double> decode(const Space& space, const std::vector<double>& z) const {
    std::vector<double> x;
    for (size_t d = 0; d < space.size(); ++d) {
      const size_t o = size_t(offset_[d]);
      if (space[d].numeric()) {
        x.push_back(space[d].from_unit(z[o]));
      } else {
        size_t best = 0;
        for (size_t c = 1; c < space[d].n_choices(); ++c)
          if (z[o + c] > z[o + best]) best = c;
        x.push_back(double(best));
      }
    }
    return x;
  }
  // What the objective will actually see: integers and steps snapped, one-hot categoricals.
  std::vector<double> round_trip(const Space& space, const std::vector<double>& z) const {
    std::vector<double> out(width_);
    round_trip(space, z.data(), out.data());
    return out;
  }
  // encode(decode(z)) into out (width_ entries), without allocating.
  void round_trip(const Space& space, const double* z, double* out) const {
    for (size_t d = 0; d < space.size(); ++d) {
      const size_t o = size_t(offset_[d]);
      if (space[d].numeric()) {
        out[o] = space[d].to_unit(space[d].from_unit(z[o]));
      } else {
        size_t best = 0;
        for (size_t c = 1; c < space[d].n_choices(); ++c)
          if (z[o + c] > z[o + best]) best = c;
        for (size_t c = 0; c < space[d].n_choices(); ++c) out[o + c] = c == best ? 1.0 : 0.0;
      }
    }
  }

  // Trial `number` (< n) of an n-point Latin hypercube drawn from the study seed.
  std::vector<double> latin_hypercube(const Space& space, uint64_t seed, int number, int n) const {
    std::mt19937_64 rng(detail::seed_for(seed, -7));
    std::uniform_real_distribution<double> U(0, 1);
    std::vector<double> x;
    for (const auto& p : space) {
      std::vector<int> perm(static_cast<size_t>(n));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<double> jit(static_cast<size_t>(n));
      for (auto& j : jit) j = U(rng);
      const double u = (perm[size_t(number % n)] + jit[size_t(number % n)]) / n;
      x.push_back(p.numeric()
                      ? p.from_unit(u)
                      : std::min(std::floor(u * double(p.n_choices())), double(p.n_choices() - 1)));
    }
    return x;
  }

  static constexpr int kRestart = 5;
  SamplerOptions o_;
  std::vector<int> offset_;
  size_t width_ = 0;
  std::vector<double> warm_;  // the last fit's hyperparameters
  int warm_n_ = 0;            // observations at the last fit with more than the warm start
  bool prior_next_ = true;    // which start the next restart adds
};

}  // namespace

std::unique_ptr<Sampler> sampling::make_gp(const SamplerOptions& opt, const Space& space) {
  return std::make_unique<GpSampler>(opt, space);
}

}  // namespace mltrain::tune
