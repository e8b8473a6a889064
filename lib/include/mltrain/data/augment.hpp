#pragma once
// Image augmentation run inside the loader workers, on one sample's [C,H,W] float pixels in
// [0, 1] (before normalisation), plus mixup/cutmix on whole batches.
//
//   Augmenter aug(cfg.data.augment, seed);
//   aug.sample(pixels, C, H, W, /*progress=*/0.4, /*sample_key=*/epoch_position);
//   MixResult m = aug.batch(x, y, /*progress=*/0.4, /*batch_key=*/...);  // x: normalised batch
//
// Every random draw comes from a generator seeded by (seed, key), so a sample is augmented the
// same way whatever the worker count, and a resumed run sees the same batches.
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <vector>

#include "mltrain/config/experiment.hpp"

namespace mltrain::data {

struct MixResult {
  bool mixed = false;
  double lam = 1.0;  // weight of the original labels
  torch::Tensor y2;  // partner labels
};

class Augmenter {
 public:
  Augmenter(const config::AugmentConfig& cfg, uint64_t seed);
  bool any_sample_op() const;
  bool any_batch_op() const;
  // progress: fraction of training done, for each op's window. Returns whether anything changed.
  bool sample(float* pixels, int64_t c, int64_t h, int64_t w, double progress, uint64_t key) const;
  MixResult batch(torch::Tensor& x, const torch::Tensor& y, double progress, uint64_t key) const;
  double strength() const { return strength_.load(); }
  void set_strength(double s) { strength_.store(std::clamp(s, 0.0, 1.0)); }
  // Adaptive strength, after each evaluation, by data.augment.adaptive_rule: gap (raise it while
  // train - eval accuracy exceeds the gap, else lower it), guide (the field guide's: from strength
  // 0.1, x 0.9 when the validation loss beat the best so far, else x 1.1, at most 0.5) or
  // guide_accuracy (an earlier reading: from 0.5, eval accuracy against the previous evaluation).
  void adapt(double train_accuracy, double eval_accuracy, double eval_loss);
  // The guide rules' memory, for resume: the previous evaluation's accuracy (guide_accuracy) and
  // the best validation loss so far (guide); NaN before the first evaluation.
  double last_eval_accuracy() const { return last_eval_; }
  void set_last_eval_accuracy(double a) { last_eval_ = a; }
  double best_eval_loss() const { return best_loss_; }
  void set_best_eval_loss(double l) { best_loss_ = l; }

 private:
  config::AugmentConfig cfg_;
  uint64_t seed_;
  std::atomic<double> strength_{1.0};
  double last_eval_ = std::numeric_limits<double>::quiet_NaN();
  double best_loss_ = std::numeric_limits<double>::quiet_NaN();  // guide: the best so far
};

}  // namespace mltrain::data
