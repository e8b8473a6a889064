#include "mltrain/deploy/observers.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "mltrain/core/error.hpp"

namespace mltrain::deploy {

QParams affine_qparams(float min, float max, int64_t qmin, int64_t qmax) {
  const float lo = std::min(min, 0.f), hi = std::max(max, 0.f);
  QParams q;
  q.scale = std::max((hi - lo) / static_cast<float>(qmax - qmin), FLT_EPSILON);
  q.zero_point = qmin - static_cast<int64_t>(
                            std::nearbyint(lo / q.scale));  // round half to even, as torch.round
  q.zero_point = std::clamp(q.zero_point, qmin, qmax);
  return q;
}

QParams symmetric_qparams(float min, float max, int64_t qmin, int64_t qmax) {
  const float absmax = std::max(-std::min(min, 0.f), std::max(max, 0.f));
  QParams q;
  q.scale = std::max(absmax / (static_cast<float>(qmax - qmin) / 2.f), FLT_EPSILON);
  q.zero_point = qmin < 0 ? 0 : (qmin + qmax + 1) / 2;
  return q;
}

std::vector<QParams> per_channel_symmetric(const torch::Tensor& w, int64_t qmin, int64_t qmax,
                                           int64_t axis) {
  auto flat = w.detach().to(torch::kFloat).transpose(0, axis).contiguous().flatten(1);
  const auto mins = std::get<0>(flat.min(1)), maxs = std::get<0>(flat.max(1));
  std::vector<QParams> out;
  for (int64_t c = 0; c < flat.size(0); ++c)
    out.push_back(symmetric_qparams(mins[c].item<float>(), maxs[c].item<float>(), qmin, qmax));
  return out;
}

torch::Tensor quantize_activation(const torch::Tensor& x, const QParams& q) {
  auto t = x * (1.0f / q.scale);
  t.round_().add_(q.zero_point).clamp_(0, 255);
  return at::_make_per_tensor_quantized_tensor(t.to(torch::kUInt8), q.scale, q.zero_point);
}

void MinMaxObserver::observe(const torch::Tensor& x) {
  auto [lo, hi] = torch::aminmax(x.detach().to(torch::kFloat));
  min_ = std::min(min_, lo.item<float>());
  max_ = std::max(max_, hi.item<float>());
}

void MovingAverageMinMaxObserver::observe(const torch::Tensor& x) {
  auto [lo_t, hi_t] = torch::aminmax(x.detach().to(torch::kFloat));
  const float lo = lo_t.item<float>(), hi = hi_t.item<float>();
  if (first_) {
    min_ = lo, max_ = hi, first_ = false;
  } else {
    min_ = min_ + c_ * (lo - min_);
    max_ = max_ + c_ * (hi - max_);
  }
}

void PercentileObserver::observe(const torch::Tensor& x) {
  auto f = x.detach().to(torch::kFloat).contiguous().flatten();
  const float* p = f.data_ptr<float>();
  const size_t n = static_cast<size_t>(f.numel());
  // Up to the cap, keep everything; past it, an evenly strided sample of at most 1024 per batch.
  const size_t room = values_.size() < cap_ ? cap_ - values_.size() : 0;
  const size_t take = std::max<size_t>(room, 1024);
  const size_t stride = std::max<size_t>(1, (n + take - 1) / take);
  for (size_t i = 0; i < n; i += stride) values_.push_back(p[i]);
}

static float quantile(std::vector<float> v, double q) {  // numpy's linear interpolation
  if (v.empty()) return 0.f;
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(lo), v.end());
  const double a = v[lo];
  double b = a;
  if (hi != lo) b = *std::min_element(v.begin() + static_cast<std::ptrdiff_t>(lo) + 1, v.end());
  return static_cast<float>(a + (b - a) * (pos - static_cast<double>(lo)));
}

std::pair<float, float> PercentileObserver::range() const {
  return {quantile(values_, (100.0 - p_) / 100.0), quantile(values_, p_ / 100.0)};
}

int EntropyObserver::best_bins(const std::vector<double>& hist, int levels) {
  const int nb = static_cast<int>(hist.size());
  if (nb <= levels) return nb;
  double best_kl = INFINITY;
  int best = nb;
  for (int i = levels; i <= nb; ++i) {
    // Reference: the first i bins, with everything beyond clipped into the last one.
    std::vector<double> ref(hist.begin(), hist.begin() + i);
    for (int k = i; k < nb; ++k) ref[static_cast<size_t>(i - 1)] += hist[static_cast<size_t>(k)];
    // Candidate: the first i bins merged into `levels` groups, each group's mass spread evenly
    // over its non-empty bins.
    std::vector<double> cand(static_cast<size_t>(i), 0.0);
    for (int j = 0; j < levels; ++j) {
      const int start = j * i / levels, end = (j + 1) * i / levels;
      double mass = 0;
      int nonzero = 0;
      for (int k = start; k < end; ++k) {
        mass += hist[static_cast<size_t>(k)];
        nonzero += hist[static_cast<size_t>(k)] > 0;
      }
      for (int k = start; k < end; ++k)
        if (hist[static_cast<size_t>(k)] > 0) cand[static_cast<size_t>(k)] = mass / nonzero;
    }
    double rs = 0, cs = 0;
    for (int k = 0; k < i; ++k)
      rs += ref[static_cast<size_t>(k)], cs += cand[static_cast<size_t>(k)];
    if (rs <= 0 || cs <= 0) continue;
    double kl = 0;
    for (int k = 0; k < i; ++k) {
      const double p = ref[static_cast<size_t>(k)] / rs;
      if (p <= 0) continue;
      const double q =
          std::max(cand[static_cast<size_t>(k)] / cs, 1e-12);  // clipped mass in an empty bin
      kl += p * std::log(p / q);
    }
    if (kl < best_kl) best_kl = kl, best = i;
  }
  return best;
}

// One side of the range: the KL threshold on a histogram of magnitudes over [0, max].
static float kl_threshold(const std::vector<float>& mags, int bins, int levels) {
  float mx = 0;
  for (float m : mags) mx = std::max(mx, m);
  if (mx == 0) return 0.f;
  std::vector<double> hist(static_cast<size_t>(bins), 0.0);
  const double width = mx / bins;
  for (float m : mags) hist[std::min<size_t>(static_cast<size_t>(m / width), hist.size() - 1)] += 1;
  const int i = EntropyObserver::best_bins(hist, levels);
  return static_cast<float>(std::min<double>(mx, (i + 0.5) * width));
}

std::pair<float, float> EntropyObserver::range() const {
  // Each side searched on its own. A symmetric search on |x| (TensorRT's int8 recipe) is wrong for
  // uint8 activations with an asymmetric range: the normalised Fashion-MNIST input has a spike of
  // background pixels at -0.81 and real pixels up to 2.02, and |x| put the threshold at 0.81,
  // clipping every bright pixel (the CNN lost 5.6 points; conv1 alone 5.9 in the sensitivity pass).
  // Exact zeros (half of every post-ReLU tensor) are represented exactly by the zero point; left in,
  // their spike dominates the divergence and the search clips the informative tail.
  std::vector<float> pos, neg;
  for (float x : keep_.values())
    if (x > 0.f)
      pos.push_back(x);
    else if (x < 0.f)
      neg.push_back(-x);
  // A one-sided range (after ReLU) gets all of uint8's levels; a two-sided one half per side.
  const int lv = pos.empty() || neg.empty() ? 2 * levels_ : levels_;
  return {-kl_threshold(neg, bins_, lv), kl_threshold(pos, bins_, lv)};
}

std::unique_ptr<RangeObserver> make_observer(const std::string& name) {
  if (name == "minmax") return std::make_unique<MinMaxObserver>();
  if (name == "moving_average_minmax") return std::make_unique<MovingAverageMinMaxObserver>();
  if (name == "percentile") return std::make_unique<PercentileObserver>();
  if (name == "entropy") return std::make_unique<EntropyObserver>();
  throw ConfigError("quantize.observer", "unknown observer '" + name + "'",
                    "use minmax, moving_average_minmax, percentile or entropy");
}

}  // namespace mltrain::deploy
