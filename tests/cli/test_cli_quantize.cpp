// `mltrain quantize`.
#include "cli_support.hpp"

TEST_CASE("quantize: int8 CNN on LibTorch's quantized kernels keeps accuracy and is ~4x smaller",
          "[cli][quantize]") {
  const auto d = tmpdir("quantize");
  const std::string common =
      " data.limit_train=4096 train.duration=1ep checkpoint.every=1ep run.dir=" + d.string();
  REQUIRE(
      run("train " + kSrc + "/configs/fashion_mnist_cnn.yaml" + common + " run.name=cnn").code ==
      0);
  const auto cnn = (d / "cnn" / "v0").string();
  const auto report = [&] {
    return nlohmann::json::parse(slurp(d / "cnn" / "v0" / "quantized" / "quantize.json"));
  };
  double full_ratio = 0;
  for (const char* obs : {"minmax", "moving_average_minmax", "percentile", "entropy"}) {
    auto r = run("quantize " + cnn + " --calib-batches 4 --observer " + obs);
    INFO(obs << "\n" << r.out);
    REQUIRE(r.code == 0);
    const auto j = report();
    CHECK(j["observer"] == obs);
    CHECK(j["accuracy_drop_points"].get<double>() <= 1.0);
    CHECK(j["prediction_agreement"].get<double>() > 0.97);
    CHECK(j["size_ratio"].get<double>() >= 3.5);
    full_ratio = j["size_ratio"].get<double>();
    CHECK(j["int8_samples_per_s_batch128"].get<double>() > 0);
    CHECK(j["calibration_cache"].get<std::string>().rfind("stored ", 0) == 0);
    for (const auto& l : j["layers"]) CHECK(l["mode"] == "int8");
    // The deployable TorchScript file, reloaded: the graph's own numbers.
    CHECK(j["script"]["max_abs_diff"].get<double>() < 1e-5);
    CHECK(j["script"]["prediction_agreement"].get<double>() == 1.0);
  }
  {
    // ... and in PyTorch itself, with no mltrain code: the same test accuracy.
    const auto j = report();
    CHECK(j["script"]["bytes"].get<int64_t>() <
          fs::file_size(fs::path(j["checkpoint"].get<std::string>()) / "model.safetensors") / 3);
    auto py = sh(kPython + " " + kSrc + "/tests/golden/check_int8_script.py " +
                 (d / "cnn" / "v0" / "quantized" / "quantize.json").string() + " " + kFmnist);
    INFO(py.out);
    REQUIRE(py.code == 0);
    const auto p = nlohmann::json::parse(py.out.substr(py.out.rfind('{')));
    CHECK(p["n"] == 10000);
    CHECK(std::abs(p["accuracy"].get<double>() - j["int8_accuracy"].get<double>()) <= 0.002);
  }
  // Calibration cache: the same weights, data, observer and graph reuse the ranges, to the bit.
  const auto before = report()["activation_qparams"];
  auto again = run("quantize " + cnn + " --calib-batches 4 --observer entropy");
  REQUIRE(again.code == 0);
  CHECK(report()["calibration_cache"].get<std::string>().rfind("hit ", 0) == 0);
  CHECK(report()["activation_qparams"] == before);
  // More calibration batches are other data: a miss.
  REQUIRE(run("quantize " + cnn + " --calib-batches 5 --observer entropy").code == 0);
  CHECK(report()["calibration_cache"].get<std::string>().rfind("stored ", 0) == 0);
  // Exclude list and the sensitivity pass.
  auto ex = run("quantize " + cnn +
                " --calib-batches 4 --exclude conv1,fc2 --sensitivity --sensitivity-samples 500");
  INFO(ex.out);
  REQUIRE(ex.code == 0);
  const auto j = report();
  std::map<std::string, std::string> mode;
  for (const auto& l : j["layers"]) mode[l["name"]] = l["mode"];
  CHECK(mode == std::map<std::string, std::string>{
                    {"conv1", "fp32"}, {"conv2", "int8"}, {"fc1", "int8"}, {"fc2", "fp32"}});
  CHECK(j["size_ratio"].get<double>() < full_ratio);  // conv1 and fc2 stay fp32
  CHECK(j["accuracy_drop_points"].get<double>() <= 1.0);
  REQUIRE(j["sensitivity"]["layers"].size() == 4);
  CHECK(j["sensitivity"]["samples"] == 500);
  CHECK(ex.out.find("sensitivity (one layer quantized at a time") != std::string::npos);
  CHECK(ex.out.find("proposed: ") != std::string::npos);
  auto bad = run("quantize " + cnn + " --exclude conv3");
  CHECK(bad.code == 2);
  CHECK(bad.out.find("no quantizable layer named 'conv3'") != std::string::npos);
  CHECK(bad.out.find("layers: conv1, conv2, fc1, fc2") != std::string::npos);
  // The MLP: static and dynamic (int8 linear weights, activations quantized per batch).
  REQUIRE(
      run("train " + kSrc + "/configs/fashion_mnist_mlp.yaml" + common + " run.name=mlp").code ==
      0);
  for (const char* m : {"static", "dynamic"}) {
    auto r = run("quantize " + (d / "mlp" / "v0").string() + " --calib-batches 4 --mode " + m);
    INFO(m << "\n" << r.out);
    REQUIRE(r.code == 0);
    const auto q = nlohmann::json::parse(slurp(d / "mlp" / "v0" / "quantized" / "quantize.json"));
    CHECK(q["mode"] == m);
    CHECK(q["layers"].size() == 3);
    CHECK(q["accuracy_drop_points"].get<double>() <= 1.0);
    CHECK(q["size_ratio"].get<double>() >= 3.5);
    CHECK(q["script"]["max_abs_diff"].get<double>() < 1e-5);
  }
  CHECK(run("quantize " + cnn + " --mode weird").code == 2);
  CHECK(run("quantize " + (d / "nope").string()).code == 3);
}

TEST_CASE("quantize: the small ResNet's residual adds run as quantized::add_relu",
          "[cli][quantize]") {
  const auto d = tmpdir("quantize_resnet");
  REQUIRE(run("train " + kSrc +
              "/configs/fashion_mnist_resnet_recipe.yaml data.limit_train=2048 train.duration=1ep "
              "checkpoint.every=1ep train.eval_every=1ep amp.enabled=false run.name=r run.dir=" +
              d.string())
              .code == 0);
  auto r = run("quantize " + (d / "r" / "v0").string() + " --calib-batches 2");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(slurp(d / "r" / "v0" / "quantized" / "quantize.json"));
  int adds = 0, convs = 0;
  for (const auto& l : j["layers"]) {
    adds += l["op"] == "add";
    convs += l["op"] == "conv";
    CHECK(l["mode"] == "int8");
  }
  CHECK(adds == 3);
  CHECK(convs == 9);  // stem + 2 per block + 2 projection shortcuts
  CHECK(j["prediction_agreement"].get<double>() > 0.95);
  CHECK(j["size_ratio"].get<double>() >= 3.5);
  CHECK(j["script"]["max_abs_diff"].get<double>() <
        1e-5);  // residual adds as quantized::add_relu in TorchScript too
  // A TorchScript model is not lowered: a clear config error, not a crash.
  REQUIRE(run("train " + kSrc +
              "/configs/fashion_mnist_mlp.yaml data.limit_train=512 train.duration=1ep "
              "checkpoint.every=1ep run.dir=" +
              d.string() + " run.name=ts model.name=torchscript model.path=" + kSrc +
              "/tests/golden/tiny_script.pt")
              .code == 0);
  auto ts = run("quantize " + (d / "ts" / "v0").string());
  CHECK(ts.code == 2);
  CHECK(ts.out.find("handles the registry's mlp, cnn and resnet") != std::string::npos);
}
