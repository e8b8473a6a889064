#pragma once
// Learning-rate schedules as pure functions of the step (plus, for plateau, the recorded history
// of the monitored metric), so a resumed run cannot drift: the recursive updates of PyTorch's
// schedulers accumulate rounding and have broken on resume (pytorch #49630, #65342).
//
//   Schedule s(cfg.schedule, cfg.optim.lr, /*total_steps=*/T, /*steps_per_epoch=*/spe);
//   double lr = s.lr(step);              // what the optimizer uses for step `step` (0-based)
//   s.observe(step, eval_loss);          // plateau only: record an evaluation
//
// Any schedule can have a linear warm-up in front: for t < W the LR is
// base * (warmup_start + (1 - warmup_start) * t / W), and the schedule itself then runs on t - W
// over T - W steps (PyTorch: SequentialLR([LinearLR(start, total_iters=W), inner], [W])).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mltrain/config/experiment.hpp"

namespace mltrain::optim {

class Schedule {
 public:
  Schedule(const config::ScheduleConfig& cfg, double base_lr, int64_t total_steps,
           int64_t steps_per_epoch);
  double lr(int64_t step) const;
  void observe(int64_t step, double metric);  // plateau: an evaluation result at `step`
  // gradnorm: lr = base * clamp(reference / average norm, gn_min_factor, 1), where the reference is
  // the mean pre-clip norm over the first gn_reference steps and the average an EMA (gn_beta); the
  // LR backs off while gradients grow and returns as they settle. State: {reference, ema, count}.
  void observe_grad_norm(double norm);
  nlohmann::json gradnorm_state() const {
    return {{"reference", gn_ref_}, {"ema", gn_ema_}, {"count", gn_count_}};
  }
  void load_gradnorm_state(const nlohmann::json& j);
  const std::vector<std::pair<int64_t, double>>& history() const { return history_; }
  void set_history(std::vector<std::pair<int64_t, double>> h) { history_ = std::move(h); }

 private:
  double inner(int64_t t, int64_t span) const;  // the schedule without warm-up
  double plateau_lr(int64_t step) const;
  config::ScheduleConfig cfg_;
  double base_;
  int64_t total_, warmup_, step_size_, step_down_, t0_;
  std::vector<int64_t> milestones_;
  std::vector<std::pair<int64_t, double>> history_;
  int64_t gn_reference_steps_ = 0, gn_count_ = 0;
  double gn_ref_ = 0, gn_ema_ = 0, gn_sum_ = 0;
};

}  // namespace mltrain::optim
