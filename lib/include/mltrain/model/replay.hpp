#pragma once
// The state a training forward pass consumes or mutates besides its inputs: the CPU and CUDA RNG
// (dropout) and the buffers it updates in place (BatchNorm running statistics). Captured before a
// pass, it lets the same pass run again from the same start — activation checkpointing's
// recomputation, the micro-batch probe, a step redone after running out of memory.
//
//   model::ReplayPoint start(model::buffers_of(model));
//   ... forward ...
//   start.restore();   // RNG and buffers as they were
#include <torch/torch.h>

#include <vector>

#include "mltrain/model/model.hpp"

namespace mltrain::model {

class ReplayPoint {
 public:
  ReplayPoint() = default;
  explicit ReplayPoint(std::vector<torch::Tensor> buffers);  // records RNG, copies the buffers
  void restore_rng() const;
  void restore_buffers() const;
  void restore() const {
    restore_rng();
    restore_buffers();
  }
  // The RNG as it is now, to put back after a replay that must not change what follows.
  static ReplayPoint rng_now() { return ReplayPoint(std::vector<torch::Tensor>{}); }

 private:
  torch::Tensor cpu_rng_, cuda_rng_;
  std::vector<torch::Tensor> buffers_, before_;
};

std::vector<torch::Tensor> buffers_of(Model& m);

}  // namespace mltrain::model
