#include "mltrain/optim/schedule.hpp"

#include <algorithm>
#include <cmath>

#include "mltrain/core/error.hpp"

namespace mltrain::optim {

Schedule::Schedule(const config::ScheduleConfig& cfg, double base_lr, int64_t total_steps,
                   int64_t spe)
    : cfg_(cfg), base_(base_lr), total_(total_steps) {
  warmup_ = cfg.warmup.to_steps(spe);
  step_size_ = cfg.step_size.to_steps(spe);
  step_down_ = cfg.step_size_down.enabled() ? cfg.step_size_down.to_steps(spe) : step_size_;
  t0_ = cfg.t0.to_steps(spe);
  for (const auto& m : cfg.milestones) milestones_.push_back(m.to_steps(spe));
  gn_reference_steps_ = cfg.gn_reference.to_steps(spe);
  std::sort(milestones_.begin(), milestones_.end());
}

// Closed forms. t counts optimizer steps after the warm-up; span = steps the schedule covers.
double Schedule::inner(int64_t t, int64_t span) const {
  const auto& c = cfg_;
  const double pi = M_PI;
  if (c.name == "constant") return base_;
  if (c.name == "step")
    return base_ * std::pow(c.gamma, static_cast<double>(t / std::max<int64_t>(1, step_size_)));
  if (c.name == "multistep") {
    const auto passed =
        std::upper_bound(milestones_.begin(), milestones_.end(), t) - milestones_.begin();
    return base_ * std::pow(c.gamma, static_cast<double>(passed));
  }
  if (c.name == "exponential") return base_ * std::pow(c.gamma, static_cast<double>(t));
  if (c.name == "cosine") {  // CosineAnnealingLR, T_max = span; held at eta_min afterwards
    const double x =
        static_cast<double>(std::min(t, span)) / static_cast<double>(std::max<int64_t>(1, span));
    return c.eta_min + (base_ - c.eta_min) * (1 + std::cos(pi * x)) / 2;
  }
  if (c.name == "cosine_restarts") {  // CosineAnnealingWarmRestarts(T_0, T_mult, eta_min)
    // Walk the restarts in integers (T_i grows by T_mult each cycle), as PyTorch's counter does.
    int64_t t_cur = t, t_i = std::max<int64_t>(1, t0_);
    while (t_cur >= t_i) {
      t_cur -= t_i;
      t_i *= c.t_mult;
    }
    return c.eta_min +
           (base_ - c.eta_min) *
               (1 + std::cos(pi * static_cast<double>(t_cur) / static_cast<double>(t_i))) / 2;
  }
  if (c.name == "onecycle") {  // OneCycleLR(max_lr = base lr, total_steps = span)
    const double initial = base_ / c.div_factor, min_lr = initial / c.final_div_factor;
    const double end1 = c.pct_start * span - 1, end2 = static_cast<double>(span - 1);
    auto anneal = [&](double start, double end, double pct) {
      return c.anneal == "cos" ? end + (start - end) / 2 * (std::cos(pi * pct) + 1)
                               : (end - start) * pct + start;
    };
    const double s = static_cast<double>(t);
    if (s <= end1) return anneal(initial, base_, s / end1);
    return anneal(base_, min_lr, (s - end1) / (end2 - end1));
  }
  if (c.name == "polynomial") {  // PolynomialLR with total_iters = span
    const double x =
        static_cast<double>(std::min(t, span)) / static_cast<double>(std::max<int64_t>(1, span));
    return base_ * std::pow(1 - x, c.power);
  }
  if (c.name ==
      "cyclic") {  // CyclicLR(base_lr = eta_min, max_lr = lr), computed from t as PyTorch does
    const double total = static_cast<double>(step_size_ + step_down_), ratio = step_size_ / total;
    const double cycle = std::floor(1 + t / total), x = 1 + t / total - cycle;
    const double scale = x <= ratio ? x / ratio : (x - 1) / (ratio - 1);
    const double height = (base_ - c.eta_min) * scale;
    if (c.cyclic_mode == "triangular2") return c.eta_min + height / std::pow(2.0, cycle - 1);
    if (c.cyclic_mode == "exp_range")
      return c.eta_min + height * std::pow(c.gamma, static_cast<double>(t));
    return c.eta_min + height;
  }
  if (c.name == "plateau") return base_;  // scaled by plateau_lr()
  if (c.name == "gradnorm") {
    if (gn_count_ <= gn_reference_steps_ || gn_ema_ <= 0 || !std::isfinite(gn_ema_)) return base_;
    return base_ * std::clamp(gn_ref_ / gn_ema_, c.gn_min_factor, 1.0);
  }
  if (c.name == "autolr") {  // the field guide's AutoLR: lr (1 - 0.1 norm / target)
    const double target = c.autolr_target > 0 ? c.autolr_target : gn_ref_;
    if (!(target > 0) || gn_count_ == 0 || !std::isfinite(gn_ema_)) return base_;
    if (c.autolr_target <= 0 && gn_count_ <= gn_reference_steps_) return base_;
    return base_ * std::clamp(1.0 - 0.1 * gn_ema_ / target, c.gn_min_factor, 1.0);
  }
  throw ConfigError("schedule.name", "unknown schedule '" + c.name + "'");
}

// ReduceLROnPlateau replayed over the recorded (step, metric) history: the LR at `step` depends
// only on evaluations recorded before it.
double Schedule::plateau_lr(int64_t step) const {
  const auto& c = cfg_;
  double lr = base_, best = c.mode == "min" ? INFINITY : -INFINITY;
  int64_t bad = 0, cooldown = 0;
  for (const auto& [s, v] : history_) {
    if (s > step) break;
    const bool better =
        c.mode == "min" ? v < best * (1 - c.threshold) : v > best * (1 + c.threshold);
    if (std::isfinite(v) && better) {
      best = v;
      bad = 0;
    } else {
      ++bad;
    }
    if (cooldown > 0) {
      --cooldown;
      bad = 0;
    }
    if (bad > c.patience) {
      const double reduced = std::max(lr * c.gamma, c.min_lr);
      if (lr - reduced > 1e-8) lr = reduced;  // PyTorch's eps: ignore negligible changes
      cooldown = c.cooldown;
      bad = 0;
    }
  }
  return lr;
}

double Schedule::lr(int64_t step) const {
  double v;
  if (step < warmup_) {
    const double f = cfg_.warmup_start + (1 - cfg_.warmup_start) * static_cast<double>(step) /
                                             static_cast<double>(warmup_);
    v = base_ * f;
  } else if (cfg_.name == "plateau") {
    return plateau_lr(step);
  } else {
    v = inner(step - warmup_, std::max<int64_t>(1, total_ - warmup_));
  }
  // schedule.plateau: the schedule's LR times the factor the plateau rule has reached
  if (cfg_.plateau && cfg_.name != "plateau" && base_ > 0) v *= plateau_lr(step) / base_;
  return v;
}

void Schedule::observe_grad_norm(double norm) {
  if ((cfg_.name != "gradnorm" && cfg_.name != "autolr") || !std::isfinite(norm)) return;
  ++gn_count_;
  if (gn_count_ <= gn_reference_steps_) {
    gn_sum_ += norm;
    gn_ref_ = gn_sum_ / gn_count_;
    gn_ema_ = gn_ref_;
    return;
  }
  gn_ema_ = cfg_.gn_beta * gn_ema_ + (1 - cfg_.gn_beta) * norm;
}

void Schedule::load_gradnorm_state(const nlohmann::json& j) {
  gn_ref_ = j.at("reference");
  gn_ema_ = j.at("ema");
  gn_count_ = j.at("count");
  gn_sum_ = gn_ref_ * std::min(gn_count_, gn_reference_steps_);
}

void Schedule::observe(int64_t step, double metric) {
  if (cfg_.on_plateau()) history_.emplace_back(step, metric);
}

}  // namespace mltrain::optim
