#pragma once
// data.batch_size: auto. The loader batch is the whole optimizer step (train.global_batch / world);
// the micro-batch — samples per forward/backward — is the largest that fits runtime.memory_budget,
// found by a short probe: one real training batch, forward and backward at the batch size, then
// halves, measuring each step's tensor-memory peak (memory.hpp) plus the optimizer state the first
// update will allocate. Weights, buffers, gradients and RNG are restored after the probe, so it
// changes nothing the run computes. The answer is cached per (config, device, budget) hash under
// $XDG_CACHE_HOME/mltrain/micro_batch (else ~/.cache/...), so a restart or a tune trial with the
// same config does not probe again.
//
//   auto plan = train::plan_micro_batch(cfg, model, loader, optimizer, device);
//   trainer.set_micro_batch(plan.micro, /*recover=*/true);
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "mltrain/config/experiment.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"

namespace mltrain::train {

struct MicroBatchPlan {
  int64_t micro = 0;                                  // samples per forward/backward
  int64_t budget = 0;                                 // bytes (0: none)
  int64_t peak = 0;                                   // estimated step peak at `micro`, bytes
  bool cached = false;                                // read from the cache, not probed
  std::vector<std::pair<int64_t, int64_t>> measured;  // (micro-batch, estimated peak bytes)
  std::filesystem::path cache_file;
};

// ConfigError (runtime.memory_budget) when not even one sample's step fits. `extra(m)`: bytes the
// run will also hold for micro-batch m beyond the probed step (the evaluation loader's slots).
MicroBatchPlan plan_micro_batch(const config::ExperimentConfig& cfg, model::Model& model,
                                data::Loader& loader, optim::Optimizer& opt,
                                const torch::Device& device,
                                const std::function<int64_t(int64_t)>& extra = nullptr);

// Bytes the optimizer's state will hold once it has stepped (Adam: two moments per parameter;
// SGD with momentum: one), less what it already holds.
int64_t pending_optimizer_bytes(const config::OptimConfig& cfg, model::Model& model,
                                const optim::Optimizer& opt);

// Config-time notes on memory settings that change what is learnt, with their fix: BatchNorm
// under accumulation or micro-batches (statistics per micro-batch, not per step).
std::vector<std::string> memory_warnings(const config::ExperimentConfig& cfg, int64_t accumulate,
                                         int64_t micro_batch);

}  // namespace mltrain::train
