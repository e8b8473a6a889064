// `mltrain fuse`.
#include "cli_support.hpp"

TEST_CASE(
    "fuse: CNN and TorchScript runs fold BN within tolerance; damaged or mismatched input exits 3",
    "[cli][fuse]") {
  const auto d = tmpdir("fuse");
  const std::string common =
      " data.limit_train=2048 train.duration=1ep checkpoint.every=1ep run.dir=" + d.string();
  REQUIRE(
      run("train " + kSrc + "/configs/fashion_mnist_cnn.yaml" + common + " run.name=cnn").code ==
      0);
  auto r = run("fuse " + (d / "cnn" / "v0").string() + " --batches 4");
  INFO(r.out);
  REQUIRE(r.code == 0);
  auto j = nlohmann::json::parse(slurp(d / "cnn" / "v0" / "fused" / "fuse.json"));
  CHECK(j["folded_batchnorms"] == 2);
  CHECK(j["within_tolerance"] == true);
  CHECK(j["max_abs_diff"].get<double>() < 1e-4);
  CHECK(j["torchscript_max_abs_diff"].get<double>() < 1e-4);
  CHECK(j["speedup_batch128"].get<double>() > 0);
  CHECK(fs::exists(d / "cnn" / "v0" / "fused" / "model.pt"));
  // The fused model.pt is what users deploy from Python: PyTorch loads and runs it.
  const auto py = sh(kPython +
                     " -c \"import torch, sys; m = torch.jit.load(sys.argv[1]); "
                     "m.eval(); y = m(torch.rand(3, 1, 28, 28)); "
                     "print('logits', tuple(y.shape), bool(torch.isfinite(y).all()))\" " +
                     (d / "cnn" / "v0" / "fused" / "model.pt").string());
  INFO(py.out);
  CHECK(py.code == 0);
  CHECK_THAT(py.out, Catch::Contains("logits (3, 10) True"));
  CHECK(slurp(d / "cnn" / "v0" / "fused" / "config.yaml").find("batchnorm: false") !=
        std::string::npos);

  // A TorchScript model goes through LibTorch's FoldConvBatchNorm.
  REQUIRE(run("train " + kSrc + "/configs/fashion_mnist_cnn.yaml" + common +
              " run.name=ts model.name=torchscript model.path=" + kSrc +
              "/tests/golden/tiny_script.pt")
              .code == 0);
  r = run("fuse " + (d / "ts" / "v0").string() + " --batches 2 -o " + (d / "ts_fused").string());
  REQUIRE(r.code == 0);
  j = nlohmann::json::parse(slurp(d / "ts_fused" / "fuse.json"));
  CHECK(j["folded_batchnorms"] == 1);
  CHECK(j["within_tolerance"] == true);

  // Mismatched: the config beside the checkpoint describes another model.
  {
    std::string cfg = slurp(d / "cnn" / "v0" / "config.yaml");
    const auto at = cfg.find("fc: 256");
    REQUIRE(at != std::string::npos);
    cfg.replace(at, 7, "fc: 128");
    std::ofstream(d / "cnn" / "v0" / "config.yaml") << cfg;
  }
  r = run("fuse " + (d / "cnn" / "v0").string());
  CHECK(r.code == 3);
  CHECK(r.out.find("does not match the run's model at 'fc1.weight'") != std::string::npos);
  // Damaged: a flipped byte in the only checkpoint's weights.
  const auto ck = d / "ts" / "v0" / "checkpoints" / "step_16" / "model.safetensors";
  REQUIRE(fs::exists(ck));
  {
    std::fstream f(ck, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  r = run("fuse " + (d / "ts" / "v0").string());
  CHECK(r.code == 3);
  CHECK(r.out.find("no intact checkpoint") != std::string::npos);
}
