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
//   QuantizeReport r = quantize_run("runs/cnn/v0", {.calib_batches = 16, .observer = "minmax"});
//   std::cout << r.to_text();                 // or r.to_json() (what quantize.json holds)
#include <nlohmann/json.hpp>

#include <optional>
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

// What `mltrain quantize` measured and wrote; to_json() is quantize.json.
struct QuantizeReport {
  struct Layer {
    std::string name, op, mode;  // op: conv | linear | add; mode: int8 | dynamic int8 | fp32
  };
  struct ActivationQParams {
    std::string at;  // "input" or the layer whose output it quantizes
    double scale = 0;
    int64_t zero_point = 0;
  };
  // The deployable TorchScript file, reloaded and checked against the graph.
  struct Script {
    std::string path;
    int64_t bytes = 0;
    double max_abs_diff = 0, prediction_agreement = 0, samples_per_s_batch128 = 0;
    std::vector<int64_t> input_shape;
    double input_mean = 0, input_std = 1;
  };
  struct SensitivityRow {
    std::string layer;
    double accuracy = 0, drop_points = 0;
    int64_t changed_predictions = 0;
  };
  struct Sensitivity {
    std::string split;
    int64_t samples = 0;
    double fp32_accuracy = 0, threshold_points = 0;
    std::vector<SensitivityRow> layers;  // largest drop first
    std::vector<std::string> proposed_exclude;
  };

  std::string run, checkpoint, model, mode, engine, observer, calibration_cache;
  int64_t calibration_batches = 0;
  std::vector<std::string> excluded;
  std::vector<Layer> layers;
  int64_t test_samples = 0, fp32_right = 0, int8_right = 0, agree = 0;
  int64_t fp32_weight_bytes = 0, int8_weight_bytes = 0;
  double fp32_samples_per_s_batch128 = 0, int8_samples_per_s_batch128 = 0;
  Script script;
  std::vector<ActivationQParams> activation_qparams;  // static mode
  std::optional<Sensitivity> sensitivity;

  double fp32_accuracy() const { return test_samples ? double(fp32_right) / test_samples : 0; }
  double int8_accuracy() const { return test_samples ? double(int8_right) / test_samples : 0; }
  double accuracy_drop_points() const {
    return test_samples ? 100.0 * (fp32_right - int8_right) / test_samples : 0;
  }
  double prediction_agreement() const { return test_samples ? double(agree) / test_samples : 0; }
  double size_ratio() const { return double(fp32_weight_bytes) / int8_weight_bytes; }
  double speedup_batch128() const {
    return int8_samples_per_s_batch128 / fp32_samples_per_s_batch128;
  }
  nlohmann::json to_json() const;
  std::string to_text() const;
};

QuantizeReport quantize_run(const std::string& run_or_checkpoint, const QuantizeOptions& opt);

}  // namespace mltrain::deploy
