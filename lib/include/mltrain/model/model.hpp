#pragma once
// The model registry: mlp, the classic 2-conv cnn, a small resnet, and TorchScript files, all
// behind one interface the trainer, checkpoints and optimizers use.
//
//   auto model = build_model(cfg.model, /*sample_shape=*/{1, 28, 28}, /*num_classes=*/10);
//   auto logits = model->forward(x);           // x: [B, 1, 28, 28]
//   for (auto& [name, p] : model->named_parameters()) ...   // "conv1.weight", ...
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mltrain/config/experiment.hpp"

namespace mltrain::model {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;
class Islands;

class Model {
 public:
  virtual ~Model() = default;
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  // forward(inputs, targets) of a model that computes its own loss (task custom): the loss tensor,
  // or a dict with "loss" and named scalar metrics. Registry models have none (ConfigError).
  virtual c10::IValue forward_with_targets(const torch::Tensor& x, const torch::Tensor& y);
  virtual NamedTensors named_parameters() = 0;
  virtual NamedTensors named_buffers() = 0;  // BatchNorm running stats, ...
  virtual void set_training(bool on) = 0;
  virtual void to(const torch::Device& device) = 0;  // parameters and buffers, layouts kept
  virtual std::string describe() const = 0;
  int64_t num_parameters();
  // Names a tied tensor also has in the module's state_dict, as (alias, name in named_parameters
  // or named_buffers): GPT-2's lm_head.weight is transformer.wte.weight. Checkpoints write both
  // keys, so PyTorch's load_state_dict(strict=True) finds every key it expects.
  virtual std::vector<std::pair<std::string, std::string>> tied_names() const { return {}; }

  // memory.checkpoint: blocks run in segments of `every` consecutive blocks without keeping their
  // activations (recomputed in backward, gradients bitwise equal); 0 turns it off. Models without
  // repeated blocks (mlp, cnn, TorchScript) throw ConfigError naming memory.checkpoint.
  virtual void set_checkpointing(int64_t every);
  virtual int64_t num_blocks() const { return 0; }

  // distributed.pipeline: the forward pass as a chain of units cut at block boundaries, each a
  // function of the previous one's output, so forward(x) == forward_units(x, 0, num_units()).
  // unit_of(name): the unit a parameter or buffer belongs to. 0 units: the model cannot be cut
  // (forward_units throws ConfigError naming distributed.pipeline.stages). unit_of names the unit
  // that owns a tensor (its first user).
  virtual int64_t num_units() const { return 0; }
  virtual torch::Tensor forward_units(const torch::Tensor& x, int64_t begin, int64_t end);
  virtual int64_t unit_of(const std::string& tensor_name) const;
  // Every unit that uses the tensor: unit_of's, plus the users of a tied weight (gpt's wte.weight
  // is also its output layer).
  virtual std::vector<int64_t> units_using(const std::string& tensor_name) const {
    return {unit_of(tensor_name)};
  }

  // amp.fp32_modules: sub-modules whose names match a glob run outside autocast, inputs cast to
  // fp32. island_names() lists the names a pattern can match; a pattern that matches none is a
  // ConfigError listing them. Returns the chosen names.
  virtual std::vector<std::string> island_names() const { return {}; }
  std::vector<std::string> set_fp32_modules(const std::vector<std::string>& patterns);
  // Output dtype of every named sub-module call while recording (tests, profile's coverage).
  void record_dtypes(bool on);
  std::map<std::string, std::string> recorded_dtypes() const;

 protected:
  Model();
  Islands* islands() { return islands_.get(); }

 private:
  std::shared_ptr<Islands> islands_;
};

// The profiler scope each node of an exported program runs under is kNodeScope + "<module>: <op>"
// (`mltrain profile` lists them apart, by module).
inline constexpr const char kNodeScope[] = "node ";

// Seeds LibTorch's generator with `seed` before building, so init is reproducible.
std::unique_ptr<Model> build_model(const config::ModelConfig& cfg,
                                   const std::vector<int64_t>& sample_shape, int64_t num_classes,
                                   uint64_t seed);

// Applies cfg.init to every conv/linear weight (biases -> 0). "default" keeps LibTorch's init.
void init_weights(const NamedTensors& params, const std::string& scheme);

}  // namespace mltrain::model
