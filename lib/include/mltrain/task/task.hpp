#pragma once
// What a run learns: the loss of a micro-batch and the metrics of the held-out split, per task
// (config `task:`). The trainer calls Task::forward for every micro-batch and feeds an Accumulator
// every evaluation batch; it never names a loss or a metric itself.
//
//   auto task = make_task(cfg);
//   Step s = task->forward(model, batch, /*smoothing=*/0.0, amp);   // s.loss: mean, differentiable
//   auto acc = task->accumulator();
//   for (each eval batch b) acc->add(task->forward(model, b, 0, amp), b);
//   Metrics m = acc->compute(reduce);   // {"loss": ..., "accuracy": ...}: reported as eval_<name>
//
// Every metric is exact over the whole split (sums, or every score for ROC-AUC), whatever the
// batch size and the number of ranks.
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mltrain/config/experiment.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/model/model.hpp"

namespace mltrain::task {

// Autocast around the model's forward pass (the loss is computed in fp32 after it).
struct Amp {
  bool enabled = false;
  at::ScalarType dtype = at::kBFloat16;
  bool cuda = false;
};
// amp.enabled / amp.dtype for a model on the CPU or CUDA.
inline Amp amp_of(const config::AmpConfig& a, bool cuda) {
  return {a.enabled, a.dtype == "fp16" ? at::kHalf : at::kBFloat16, cuda};
}

// One micro-batch through the model.
struct Step {
  torch::Tensor output;   // fp32 model output shaped for the task (undefined for custom)
  torch::Tensor loss;     // scalar: mean over the micro-batch, differentiable
  torch::Tensor correct;  // classification, language model: argmax hits (undefined: not counted)
  int64_t units = 0;      // what `correct` counts: samples, or target tokens
  std::map<std::string, double> extra;  // custom: the model's named metrics for this batch
};

using Metrics = std::map<std::string, double>;  // "loss", "accuracy", ...: reported as eval_<name>

// How per-rank sums meet: `sum` all-reduces tensors in place; unset for one process.
struct Reduce {
  std::function<void(std::vector<torch::Tensor>&)> sum;
  int64_t rank = 0, world = 1;
};

class Accumulator {
 public:
  virtual ~Accumulator() = default;
  virtual void add(const Step& s, const data::Batch& b) = 0;
  virtual Metrics compute(const Reduce& r) = 0;
};

class Task {
 public:
  virtual ~Task() = default;
  // Forward pass and loss; `smoothing` is the label-smoothing epsilon (classification only).
  virtual Step forward(model::Model& m, const data::Batch& b, double smoothing,
                       const Amp& amp) const = 0;
  virtual std::unique_ptr<Accumulator> accumulator() const = 0;
  virtual const char* name() const = 0;
};

std::unique_ptr<Task> make_task(const config::ExperimentConfig& cfg);

// What the targets file holds for this config's task (how data::load_dataset reads it).
data::TargetSpec target_spec(const config::ExperimentConfig& cfg);

// Width of the model's output layer: classes, or the elements of one regression target.
int64_t model_outputs(const config::ExperimentConfig& cfg, const data::Dataset& train);

// ---- exact metric formulas (the accumulators use them; tests check them against scikit-learn) --

// Area under the ROC curve of one class; tied scores count one half (Mann-Whitney U with midranks,
// what sklearn.metrics.roc_auc_score computes). NaN when labels hold only one class.
double roc_auc(const torch::Tensor& scores, const torch::Tensor& labels);

struct F1 {
  double micro = 0, macro = 0;
  std::vector<double> per_class;
};
// F1 of 0/1 predictions [N, C] against 0/1 labels [N, C]; a class with no positive prediction and
// no positive label scores 0 (sklearn's zero_division default).
F1 f1_scores(const torch::Tensor& predicted, const torch::Tensor& labels);

// t.argmax(1) for a 2-D tensor, the same indices (the first largest; NaN counts as largest);
// contiguous fp32 CPU rows take a vectorised scan (GPT-2's logits: 1.5 ms against LibTorch's 11).
torch::Tensor argmax_rows(const torch::Tensor& t);

// Regression metrics as sklearn's defaults (multioutput="uniform_average": per-output values
// averaged over outputs) from per-output sums over all samples.
struct RegressionSums {
  torch::Tensor n, sum_y, sum_y2, sse, sae;  // double [outputs]
};
RegressionSums regression_sums(const torch::Tensor& predicted, const torch::Tensor& target);
Metrics regression_metrics(const RegressionSums& s);

}  // namespace mltrain::task
