#pragma once
// The training-step techniques the Trainer composes: loss scaling, gradient norm and clipping,
// gradient health, weight EMA, early stopping. Each is a small class with its state exposed as
// named tensors / JSON so checkpoints hold it.
//
//   LossScaler scaler(cfg.amp);                       // fp16 only; bf16 needs none
//   scaler.scale(loss).backward();  bool inf = scaler.unscale(params);  scaler.update(inf);
//   double norm = grad_norm(params);                  // pre-clip, global L2 (inf/nan if non-finite)
//   clipper.clip(params, norm);
#include <torch/torch.h>

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mltrain/config/experiment.hpp"
#include "mltrain/model/model.hpp"

namespace mltrain::train {

// Dynamic loss scaling with PyTorch GradScaler's update rule, plus a floor (pytorch #40497):
// on inf/nan: scale *= backoff, tracker = 0; else tracker += 1 and at growth_interval:
// scale *= growth (if finite), tracker = 0. update() runs every iteration.
class LossScaler {
 public:
  explicit LossScaler(const config::AmpConfig& cfg);
  torch::Tensor scale(const torch::Tensor& loss) const { return loss * scale_; }
  bool unscale(
      const model::NamedTensors& params) const;  // divides grads by the scale; true if any inf/nan
  void update(bool found_inf);
  double value() const { return scale_; }
  int64_t skipped() const { return skipped_; }
  nlohmann::json state() const {
    return {{"scale", scale_}, {"tracker", tracker_}, {"skipped", skipped_}};
  }
  void load(const nlohmann::json& j);

 private:
  config::AmpConfig cfg_;
  double scale_;
  int64_t tracker_ = 0, skipped_ = 0;
};

// fp16 loss scaling's blind spot: the share of gradient elements that sit in fp16's subnormal
// range at the current scale (0 < |g x scale| < 2^-14, the smallest normal fp16): they keep fewer
// than 10 significant bits and are the next to flush to zero when the scale drops. A strided sample
// of at most `per_tensor` elements of each gradient; exact zeros are not counted (dead units make
// them too). `scaled`: the gradients still carry the scale (before unscale).
double underflow_share(const model::NamedTensors& params, double scale, bool scaled,
                       int64_t per_tensor = 4096);

// Global L2 norm of all gradients (torch.nn.utils.clip_grad_norm_'s total_norm).
double grad_norm(const model::NamedTensors& params);
// The same as a double scalar tensor on the gradients' device (undefined without gradients).
torch::Tensor grad_norm_tensor(const model::NamedTensors& params);

// Per-parameter report for a non-finite or exploding step: "fc1.weight: 3 NaN, 0 Inf, norm nan".
std::vector<std::string> offenders(const model::NamedTensors& params);

class GradClipper {
 public:
  explicit GradClipper(const config::ClipConfig& cfg) : cfg_(cfg) {}
  // Clips in place given the pre-clip norm; returns the threshold applied (0: none).
  double clip(const model::NamedTensors& params, double norm);
  nlohmann::json state() const {
    return {{"history", std::vector<double>(history_.begin(), history_.end())}};
  }
  void load(const nlohmann::json& j);

 private:
  config::ClipConfig cfg_;
  std::deque<double> history_;
};

class GradHealth {
 public:
  enum class Verdict { kOk, kNonFinite, kExploding };
  explicit GradHealth(const config::GradHealthConfig& cfg) : cfg_(cfg) {}
  Verdict check(double norm);  // updates the running mean with healthy norms only
  double running_mean() const { return mean_; }
  nlohmann::json state() const { return {{"mean", mean_}, {"count", count_}}; }
  void load(const nlohmann::json& j);

 private:
  config::GradHealthConfig cfg_;
  double mean_ = 0;
  int64_t count_ = 0;
};

// In-memory snapshots for the rollback policy: model + optimizer state every N steps.
struct Snapshot {
  int64_t step = -1;
  std::vector<torch::Tensor> tensors;  // params then buffers
  model::NamedTensors optimizer_state;
};

class Ema {
 public:
  Ema(const config::EmaConfig& cfg, model::Model& model);
  // After each optimizer step: decay_n = min(decay, (1 + n) / (10 + n)), the usual warm-up, so
  // the average is not dominated by the initial weights early in training.
  void update();
  int64_t updates() const { return updates_; }
  void set_updates(int64_t n) { updates_ = n; }
  void swap();                        // exchange live and averaged weights (call twice to undo)
  model::NamedTensors state() const;  // "ema/<name>"
  void load(const std::map<std::string, torch::Tensor>& state);

 private:
  config::EmaConfig cfg_;
  model::NamedTensors live_, avg_;
  int64_t updates_ = 0;
};

class EarlyStopping {
 public:
  explicit EarlyStopping(const config::EarlyStoppingConfig& cfg);
  // Returns a reason to stop ("" to go on) given the latest values of the monitored metrics.
  std::string update(const std::map<std::string, double>& values, int64_t step);
  nlohmann::json state() const;
  void load(const nlohmann::json& j);

 private:
  struct Track {
    double best = NAN;
    int64_t best_step = -1, bad = 0;
  };
  config::EarlyStoppingConfig cfg_;
  std::vector<Track> tracks_;
};

}  // namespace mltrain::train
