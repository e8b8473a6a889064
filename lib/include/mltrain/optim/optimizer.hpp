#pragma once
// SGD (momentum, Nesterov, weight decay), Adam and AdamW with PyTorch's update rules, per-group
// LR multipliers chosen by glob over parameter names, and state as named tensors so checkpoints
// store it as safetensors.
//
//   auto opt = Optimizer::create(cfg.optim, model->named_parameters());
//   loss.backward();  opt->step(/*lr=*/schedule(step));  opt->zero_grad();
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mltrain/config/experiment.hpp"
#include "mltrain/model/model.hpp"

namespace mltrain::optim {

struct ParamSlot {
  std::string name;
  torch::Tensor param;
  double lr_mult = 1.0;
  double weight_decay = 0.0;
};

class Optimizer {
 public:
  static std::unique_ptr<Optimizer> create(const config::OptimConfig& cfg, const model::NamedTensors& params);
  virtual ~Optimizer() = default;

  void step(double lr);  // one update of every parameter that has a gradient
  void zero_grad();      // sets gradients to None (saves a memset; PyTorch's default since 2.0)
  int64_t steps() const { return steps_; }
  const std::vector<ParamSlot>& slots() const { return slots_; }

  // "<param name>/<buffer>" -> tensor, plus "__step__".
  model::NamedTensors state() const;
  void load_state(const std::map<std::string, torch::Tensor>& state);  // throws CheckpointError

 protected:
  explicit Optimizer(config::OptimConfig cfg) : cfg_(std::move(cfg)) {}
  virtual void update(ParamSlot& s, const torch::Tensor& grad, double lr) = 0;
  virtual std::vector<std::string> buffer_names() const = 0;

  config::OptimConfig cfg_;
  std::vector<ParamSlot> slots_;
  std::map<std::string, torch::Tensor> buffers_;  // "<param>/<buffer>"
  int64_t steps_ = 0;
};

bool glob_match(const std::string& pattern, const std::string& name);

}  // namespace mltrain::optim
