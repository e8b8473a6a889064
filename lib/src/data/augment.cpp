#include "mltrain/data/augment.hpp"

#include "mltrain/core/rng.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace mltrain::data {
namespace {

constexpr double kGuideCap = 0.5;    // the field guide's rule never goes above half strength
constexpr double kGuideStart = 0.1;  // and starts gently

bool active(const config::AugOpConfig& op, double progress) {
  if (op.p <= 0) return false;
  const double lo = op.window.size() > 0 ? op.window[0] : 0.0,
               hi = op.window.size() > 1 ? op.window[1] : 1.0;
  return progress >= lo && progress <= hi;
}

// Bilinear sample of channel plane `src` (h x w) at (y, x); outside reads `fill`.
float bilinear(const float* src, int64_t h, int64_t w, double y, double x, float fill) {
  const double y0 = std::floor(y), x0 = std::floor(x);
  const double dy = y - y0, dx = x - x0;
  auto at = [&](int64_t yy, int64_t xx) {
    return (yy < 0 || xx < 0 || yy >= h || xx >= w) ? fill : src[yy * w + xx];
  };
  const int64_t iy = static_cast<int64_t>(y0), ix = static_cast<int64_t>(x0);
  return static_cast<float>((1 - dy) * ((1 - dx) * at(iy, ix) + dx * at(iy, ix + 1)) +
                            dy * ((1 - dx) * at(iy + 1, ix) + dx * at(iy + 1, ix + 1)));
}

// Luma of an RGB pixel (ITU-R 601, as PIL's convert("L") and torchvision's rgb_to_grayscale).
float luma_f(float r, float g, float b) { return 0.299f * r + 0.587f * g + 0.114f * b; }

// Saturation (blend with the luma image) and hue rotation (in HSV) of a planar RGB image.
void saturate_and_rotate_hue(float* px, int64_t hw, double sat, double hue) {
  float* r = px;
  float* g = px + hw;
  float* b = px + 2 * hw;
  for (int64_t i = 0; i < hw; ++i) {
    const float l = luma_f(r[i], g[i], b[i]);
    float c[3] = {r[i], g[i], b[i]};
    for (float& v : c) v = std::clamp(static_cast<float>(l + (v - l) * sat), 0.f, 1.f);
    if (hue != 0) {
      const float mx = std::max({c[0], c[1], c[2]}), mn = std::min({c[0], c[1], c[2]});
      const float d = mx - mn;
      if (d > 0) {
        double h = mx == c[0]   ? std::fmod((c[1] - c[2]) / d, 6.0)
                   : mx == c[1] ? (c[2] - c[0]) / d + 2
                                : (c[0] - c[1]) / d + 4;
        h = std::fmod(h / 6.0 + hue + 1.0, 1.0) * 6.0;
        const double s = d / mx, v = mx;
        const int k = static_cast<int>(h) % 6;
        const double f = h - std::floor(h), p = v * (1 - s), q = v * (1 - s * f),
                     t = v * (1 - s * (1 - f));
        const double rgb[6][3] = {{v, t, p}, {q, v, p}, {p, v, t}, {p, q, v}, {t, p, v}, {v, p, q}};
        for (int j = 0; j < 3; ++j) c[j] = static_cast<float>(rgb[k][j]);
      }
    }
    r[i] = c[0], g[i] = c[1], b[i] = c[2];
  }
}

}  // namespace

Augmenter::Augmenter(const config::AugmentConfig& cfg, uint64_t seed) : cfg_(cfg), seed_(seed) {
  if (cfg_.curriculum == "three_phase") {  // the field guide's phases, as op windows
    for (auto* op : {&cfg_.color, &cfg_.grayscale}) op->window = {1.0 / 3.0, 1.0};
    for (auto* op : {&cfg_.mixup, &cfg_.cutmix}) op->window = {2.0 / 3.0, 1.0};
  }
  if (cfg_.adaptive && cfg_.adaptive_rule == "guide") set_strength(kGuideStart);
  if (cfg_.adaptive && cfg_.adaptive_rule == "guide_accuracy") set_strength(kGuideCap);
}

bool Augmenter::any_sample_op() const {
  return cfg_.crop.p > 0 || cfg_.flip.p > 0 || cfg_.rotate.p > 0 || cfg_.color.p > 0 ||
         cfg_.grayscale.p > 0 || cfg_.erase.p > 0;
}
bool Augmenter::any_batch_op() const { return cfg_.mixup.p > 0 || cfg_.cutmix.p > 0; }

void Augmenter::adapt(double train_accuracy, double eval_accuracy, double eval_loss) {
  if (!cfg_.adaptive) return;
  if (cfg_.adaptive_rule == "guide") {  // as the guide writes it: the loss against the best so far
    const bool improved = std::isnan(best_loss_) || eval_loss < best_loss_;
    if (improved) best_loss_ = eval_loss;
    set_strength(std::min(kGuideCap, strength() * (improved ? 0.9 : 1.1)));
    return;
  }
  if (cfg_.adaptive_rule == "guide_accuracy") {
    const bool improved = !std::isnan(last_eval_) && eval_accuracy > last_eval_;
    last_eval_ = eval_accuracy;
    set_strength(std::min(kGuideCap, strength() * (improved ? 0.9 : 1.1)));
    return;
  }
  const double gap = train_accuracy - eval_accuracy;
  set_strength(strength() + (gap > cfg_.adaptive_gap ? cfg_.adaptive_step : -cfg_.adaptive_step));
}

bool Augmenter::sample(float* px, int64_t c, int64_t h, int64_t w, double progress,
                       uint64_t key) const {
  SplitMix rng{stream_seed(seed_, key)};
  const double s = strength();
  bool changed = false;
  std::vector<float> tmp;
  auto resample = [&](auto&& map) {  // map(out_y, out_x) -> (src_y, src_x)
    tmp.assign(px, px + c * h * w);
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) {
          auto [sy, sx] = map(static_cast<double>(y), static_cast<double>(x));
          px[(ch * h + y) * w + x] = bilinear(tmp.data() + ch * h * w, h, w, sy, sx, 0.f);
        }
    changed = true;
  };
  if (active(cfg_.crop, progress) && rng.uniform() < cfg_.crop.p) {
    // RandomResizedCrop: area fraction and log-uniform aspect ratio; strength narrows the range toward 1.
    const double lo = 1 - (1 - cfg_.crop_scale[0]) * s, hi = cfg_.crop_scale[1];
    const double area = rng.uniform(std::min(lo, hi), hi) * h * w;
    const double lr = std::log(cfg_.crop_ratio[0]), hr = std::log(cfg_.crop_ratio[1]);
    const double ratio = std::exp(rng.uniform(lr, hr));
    const double cw = std::min<double>(w, std::sqrt(area * ratio)),
                 chh = std::min<double>(h, std::sqrt(area / ratio));
    const double top = rng.uniform(0, h - chh), left = rng.uniform(0, w - cw);
    resample([&](double y, double x) {
      return std::pair<double, double>{top + (y + 0.5) * chh / h - 0.5,
                                       left + (x + 0.5) * cw / w - 0.5};
    });
  }
  if (active(cfg_.rotate, progress) && rng.uniform() < cfg_.rotate.p) {
    const double a = rng.uniform(-1, 1) * cfg_.rotate_degrees * s * M_PI / 180;
    const double cy = (h - 1) / 2.0, cx = (w - 1) / 2.0, ca = std::cos(a), sa = std::sin(a);
    resample([&](double y, double x) {
      return std::pair<double, double>{cy + (y - cy) * ca - (x - cx) * sa,
                                       cx + (y - cy) * sa + (x - cx) * ca};
    });
  }
  if (active(cfg_.flip, progress) && rng.uniform() < cfg_.flip.p) {
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t y = 0; y < h; ++y)
        std::reverse(px + (ch * h + y) * w, px + (ch * h + y + 1) * w);
    changed = true;
  }
  if (active(cfg_.color, progress) && rng.uniform() < cfg_.color.p) {
    const double n = static_cast<double>(c * h * w);
    double mean = 0;
    for (int64_t i = 0; i < c * h * w; ++i) mean += px[i];
    mean /= n;
    const double k = 1 + rng.uniform(-1, 1) * cfg_.contrast * s,
                 b = rng.uniform(-1, 1) * cfg_.brightness * s;
    for (int64_t i = 0; i < c * h * w; ++i)
      px[i] = static_cast<float>(std::clamp((px[i] - mean) * k + mean + b, 0.0, 1.0));
    // Drawn only when set, so runs without them keep their random streams.
    const double sat = cfg_.saturation > 0 ? 1 + rng.uniform(-1, 1) * cfg_.saturation * s : 1.0;
    const double hue = cfg_.hue > 0 ? rng.uniform(-1, 1) * cfg_.hue * s : 0.0;
    if (c == 3 && (sat != 1 || hue != 0)) saturate_and_rotate_hue(px, h * w, sat, hue);
    changed = true;
  }
  if (c == 3 && active(cfg_.grayscale, progress) && rng.uniform() < cfg_.grayscale.p) {
    for (int64_t i = 0; i < h * w; ++i)
      px[i] = px[h * w + i] = px[2 * h * w + i] = luma_f(px[i], px[h * w + i], px[2 * h * w + i]);
    changed = true;
  }
  if (active(cfg_.erase, progress) && rng.uniform() < cfg_.erase.p * s) {
    const double area = rng.uniform(cfg_.erase_scale[0], cfg_.erase_scale[1]) * h * w;
    const double ratio = std::exp(rng.uniform(std::log(0.3), std::log(3.3)));
    const int64_t eh = std::clamp<int64_t>(std::llround(std::sqrt(area / ratio)), 1, h);
    const int64_t ew = std::clamp<int64_t>(std::llround(std::sqrt(area * ratio)), 1, w);
    const int64_t top = static_cast<int64_t>(rng.uniform() * (h - eh + 1)),
                  left = static_cast<int64_t>(rng.uniform() * (w - ew + 1));
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t y = top; y < std::min(h, top + eh); ++y)
        std::fill(px + (ch * h + y) * w + left, px + (ch * h + y) * w + std::min(w, left + ew),
                  0.f);
    changed = true;
  }
  return changed;
}

MixResult Augmenter::batch(torch::Tensor& x, const torch::Tensor& y, double progress,
                           uint64_t key) const {
  MixResult r;
  SplitMix rng{stream_seed(seed_ ^ 0xC0FFEE, key)};
  const bool mixup = active(cfg_.mixup, progress) && rng.uniform() < cfg_.mixup.p;
  const bool cutmix = !mixup && active(cfg_.cutmix, progress) && rng.uniform() < cfg_.cutmix.p;
  if (!mixup && !cutmix) return r;
  const int64_t n = x.size(0);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(perm[i], perm[rng.next() % static_cast<uint64_t>(i + 1)]);
  auto idx = torch::from_blob(perm.data(), {n}, torch::kInt64).clone();
  const auto partner = x.index_select(0, idx);
  r.y2 = y.index_select(0, idx);
  r.mixed = true;
  double lam = rng.beta(cfg_.mix_alpha, cfg_.mix_alpha);
  if (mixup) {
    x.mul_(lam).add_(partner, 1 - lam);
  } else {  // cutmix: paste a box of area (1 - lam) from the partner; lam follows the exact box area
    const int64_t h = x.size(-2), w = x.size(-1);
    const double cut = std::sqrt(1 - lam);
    const int64_t bh = static_cast<int64_t>(h * cut), bw = static_cast<int64_t>(w * cut);
    const int64_t cy = static_cast<int64_t>(rng.uniform() * h),
                  cx = static_cast<int64_t>(rng.uniform() * w);
    const int64_t y0 = std::clamp<int64_t>(cy - bh / 2, 0, h),
                  y1 = std::clamp<int64_t>(cy + bh / 2, 0, h);
    const int64_t x0 = std::clamp<int64_t>(cx - bw / 2, 0, w),
                  x1 = std::clamp<int64_t>(cx + bw / 2, 0, w);
    using torch::indexing::Slice;
    x.index({Slice(), Slice(), Slice(y0, y1), Slice(x0, x1)})
        .copy_(partner.index({Slice(), Slice(), Slice(y0, y1), Slice(x0, x1)}));
    lam = 1 - static_cast<double>((y1 - y0) * (x1 - x0)) / static_cast<double>(h * w);
  }
  r.lam = lam;
  return r;
}

}  // namespace mltrain::data
