#pragma once
// SGD (momentum, Nesterov, weight decay), Adam and AdamW with PyTorch's update rules, per-group
// LR multipliers chosen by glob over parameter names, and state as named tensors so checkpoints
// store it as safetensors.
//
//   auto opt = Optimizer::create(cfg.optim, model->named_parameters());
//   loss.backward();  opt->step(/*lr=*/schedule(step));  opt->zero_grad();
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mltrain/config/experiment.hpp"
#include "mltrain/core/glob.hpp"
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
  static std::unique_ptr<Optimizer> create(const config::OptimConfig& cfg,
                                           const model::NamedTensors& params);
  virtual ~Optimizer() = default;

  virtual void step(double lr);  // one update of every parameter that has a gradient
  void zero_grad();  // sets gradients to None (saves a memset; PyTorch's default since 2.0)
  int64_t steps() const { return steps_; }
  const std::vector<ParamSlot>& slots() const { return slots_; }

  // False while the optimizer exchanges something other than gradients (1-bit Adam after its
  // warm-up): data parallelism then skips the gradient all-reduce.
  virtual bool wants_gradient_sync() const { return true; }
  // 1-bit Adam: averages each rank's compressed momentum (in/out, flat float) across ranks, with
  // `error` the rank's error-feedback buffer. Unset: a world of one (compression applied locally).
  using MomentumReducer = std::function<void(torch::Tensor& momentum, torch::Tensor& error)>;
  virtual void set_momentum_reducer(MomentumReducer) {}

  // One parameter's buffers, in buffer order, created as zeros where this rank never stepped it
  // (what its first step starts from): pipeline stages send each other their parameters' state.
  std::vector<torch::Tensor> buffers_of(const std::string& param_name);
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

using mltrain::glob_match;  // core/glob.hpp

// 1-bit compression with error feedback, in place: c = x + error; x = scale * sign(c) with one
// scale per chunk of 2048 values, mean |c| over the chunk; error = c - x. Sign of zero: +1.
void onebit_compress(torch::Tensor& x, torch::Tensor& error);
// optim.momentum_reference_batch: 1 - (1 - m) sqrt(reference / batch), floored at 0. The heavy-ball
// step in steady state is lr / (1 - m); this scales it by sqrt(batch / reference), the intent of the
// field guide's m x sqrt(B / 256), which exceeds 1 (diverges) for B > 256 / m^2.
double compensated_momentum(double momentum, int64_t batch, int64_t reference);
// Signs packed 8 per byte (LSB first), then one float32 scale per chunk: n / 8 + 4 ceil(n / 2048) bytes.
torch::Tensor onebit_pack(const torch::Tensor& compressed);
torch::Tensor onebit_unpack(const torch::Tensor& packed, int64_t n);
void onebit_unpack_add(const torch::Tensor& packed, int64_t n, float* sum);  // sum[i] += value i

}  // namespace mltrain::optim
