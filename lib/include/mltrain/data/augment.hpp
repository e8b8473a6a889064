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
  // Adaptive strength, after each evaluation. Rule gap: raise it while the model overfits (train -
  // eval accuracy > gap), else lower it. Rule guide: x 0.9 when eval accuracy beat the previous
  // evaluation's, else x 1.1, capped at 0.5.
  void adapt(double train_accuracy, double eval_accuracy);
  // The guide rule's memory (the previous evaluation's accuracy; NaN before the first), for resume.
  double last_eval_accuracy() const { return last_eval_; }
  void set_last_eval_accuracy(double a) { last_eval_ = a; }

 private:
  config::AugmentConfig cfg_;
  uint64_t seed_;
  std::atomic<double> strength_{1.0};
  double last_eval_ = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace mltrain::data
