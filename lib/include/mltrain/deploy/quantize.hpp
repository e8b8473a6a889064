#pragma once
// `mltrain quantize`: post-training int8 for the registry's models (mlp, cnn, resnet).
//
// The model is lowered to a small graph of conv / linear / max-pool / flatten / global-average-pool
// / residual-add nodes with BatchNorm folded in (the algebra of `mltrain fuse`), fp32, NCHW.
//  - static mode: activations calibrated with an observer over N training batches (per-tensor
//    asymmetric uint8), weights per-channel symmetric int8; conv/linear/add run on LibTorch's
//    quantized CPU kernels (quantized::conv2d(_relu) / linear(_relu) / add(_relu) through the
//    dispatcher) on the best engine this LibTorch has (onednn, else qnnpack; a clear error when
//    neither). The logits' range is always min-max: clipping them would reorder the classes.
//  - dynamic mode: only linear layers, int8 weights, activations quantized per batch at run time
//    (quantized::linear_dynamic); everything else stays fp32.
// Excluded layers stay fp32 (their input dequantized, their output requantized with its observed
// range). The sensitivity pass quantizes one layer at a time and proposes the exclude list.
// Observed ranges are cached under a key of the weights' SHA-256, the calibration batches' bytes,
// the observer and the graph, so a second run with the same settings skips calibration.
//
//   auto r = quantize_run("runs/cnn/v0", {.calib_batches = 16, .observer = "minmax"});
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace mltrain::deploy {

struct QuantizeOptions {
  int64_t calib_batches = 16;        // training batches of 128 seen by the observers
  std::string observer = "minmax";   // minmax | moving_average_minmax | percentile | entropy
  std::string mode = "static";       // static | dynamic
  std::vector<std::string> exclude;  // layer names kept fp32 (see the report's "layers")
  bool sensitivity = false;          // quantize one layer at a time on the eval split
  int64_t sensitivity_samples =
      10000;  // eval samples per sensitivity pass (one sample = 0.01 points at 10 000)
  double sensitivity_threshold =
      0.2;                // points of accuracy; layers that lose more are proposed for exclusion
  std::string out_dir;    // default <run>/quantized
  std::string cache_dir;  // default <out>/calib_cache; "off" disables the cache
  std::string engine = "auto";  // auto | onednn | qnnpack
};

nlohmann::json quantize_run(const std::string& run_or_checkpoint, const QuantizeOptions& opt);
std::string quantize_text(const nlohmann::json& r);

}  // namespace mltrain::deploy
