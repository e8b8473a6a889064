#pragma once
// `mltrain fuse`: folds every BatchNorm into the convolution or linear layer before it, for
// inference, and proves the result: output differences on real batches of the run's test split,
// and latency/throughput before and after at batch 1 and 128.
//
//   FuseReport r = fuse_run("runs/cnn/v0", {.out_dir = "runs/cnn/v0/fused"});
//   std::cout << r.to_text();                  // or r.to_json() (what fuse.json holds)
//   // fused/{model.pt (TorchScript), model.safetensors, config.yaml (model.batchnorm=false), fuse.json}
//
// BN in eval mode is y = gamma * (z - mean) / sqrt(var + eps) + beta with z = W x + b, so
// W' = W * s and b' = (b - mean) * s + beta with s = gamma / sqrt(var + eps), per output channel.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mltrain::deploy {

struct FuseOptions {
  std::string out_dir;      // default: <run>/fused
  int64_t batches = 8;      // test batches of 128 compared
  double tolerance = 1e-4;  // max |logit difference| allowed, relative to max(1, max |logit|)
};

// The folding algebra for one layer (weight [O, ...], bias [O] or undefined).
std::pair<torch::Tensor, torch::Tensor> fold_batchnorm(
    const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& gamma,
    const torch::Tensor& beta, const torch::Tensor& mean, const torch::Tensor& var, double eps);

// Inference samples/s of f on one batch: 5 warm-up calls, then the best of 3 blocks of 10 (this
// VM's timing noise is about 10 %). Shared by fuse and quantize so their ratios mean the same.
double batch_throughput(const std::function<torch::Tensor(const torch::Tensor&)>& f,
                        const torch::Tensor& batch);

// Speed of one forward function at batch 1 (median latency) and at batch 128 (throughput).
struct Timing {
  double latency_ms_batch1 = 0, samples_per_s_batch128 = 0;
};

// What `mltrain fuse` measured and wrote; to_json() is fuse.json.
struct FuseReport {
  std::string run, checkpoint, model;
  std::vector<std::string> folded;  // "conv1 <- bn1", ... (TorchScript: one line with the count)
  int folded_batchnorms = 0;
  int64_t compared_batches = 0;  // test batches of 128
  double max_abs_diff = 0, mean_abs_diff = 0, max_abs_logit = 0;
  double tolerance = 0;  // opt.tolerance x max(1, max |logit|)
  double torchscript_max_abs_diff = 0;
  Timing before, after;
  std::string torchscript_file, out_dir;

  bool within_tolerance() const { return max_abs_diff <= tolerance; }
  double speedup_batch1() const { return before.latency_ms_batch1 / after.latency_ms_batch1; }
  double speedup_batch128() const {
    return after.samples_per_s_batch128 / before.samples_per_s_batch128;
  }
  nlohmann::json to_json() const;
  std::string to_text() const;
};

FuseReport fuse_run(const std::string& run_or_checkpoint, const FuseOptions& opt);

}  // namespace mltrain::deploy
