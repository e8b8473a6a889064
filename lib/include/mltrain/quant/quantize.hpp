#pragma once
// `mltrain quantize` (static int8, first cut: the registry CNN): BatchNorm folded first (fuse),
// activations calibrated with an observer over N training batches (per-tensor asymmetric uint8),
// weights per-channel symmetric int8 (the logits' range is always min-max: clipping them would
// reorder the classes), then run with LibTorch's quantized CPU kernels
// (quantized::conv2d_relu / linear_relu / linear through the dispatcher) on the best engine this
// LibTorch has (onednn, else qnnpack; a clear error when neither).
//
//   auto r = quantize_run("runs/cnn/v0", {.calib_batches = 16, .observer = "minmax"});
#include <nlohmann/json.hpp>

#include <string>

namespace mltrain::quant {

struct QuantizeOptions {
  int64_t calib_batches = 16;       // training batches of 128 seen by the observers
  std::string observer = "minmax";  // minmax | moving_average_minmax | percentile | entropy
  std::string out_dir;              // default <run>/quantized
  std::string engine = "auto";      // auto | onednn | qnnpack
};

nlohmann::json quantize_run(const std::string& run_or_checkpoint, const QuantizeOptions& opt);
std::string quantize_text(const nlohmann::json& r);

}  // namespace mltrain::quant
