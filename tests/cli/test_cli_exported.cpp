// `model.name: exported` from the command line, as a user with their own PyTorch class has it:
// tests/golden/check_exported.py exports the class to .pt2; mltrain trains it on Fashion-MNIST,
// resumes it bitwise after a SIGKILL, evaluates and predicts; PyTorch loads the trained
// model.safetensors into the same class with load_state_dict(strict=True) and its eval-mode softmax
// equals predict's; a GPT-2 exported from transformers trains on a token file and its checkpoint
// holds both names of its tied embedding. Bad configs exit 2, bad archives 3, naming the file.
#include <fstream>
#include <set>

#include "cli_support.hpp"

namespace {

const std::string kChecker = kSrc + "/tests/golden/check_exported.py";

fs::path exported_model(const fs::path& d) {
  const fs::path pt2 = d / "user.pt2";
  const auto e = sh(kPython + " " + kChecker + " export " + pt2.string());
  INFO(e.out);
  REQUIRE(e.code == 0);
  return pt2;
}

std::string train_args(const fs::path& d, const fs::path& pt2, const std::string& name) {
  return "train " + kSrc +
         "/configs/fashion_mnist_cnn.yaml model.name=exported model.path=" + pt2.string() +
         " run.dir=" + d.string() + " run.name=" + name +
         " data.limit_train=2048 train.duration=2ep train.eval_every=1ep checkpoint.every=6u"
         " checkpoint.keep_last=2 runtime.threads=2 data.workers=1 train.target_accuracy=0";
}

// The train command's arguments after `train ` (for `launch ... -- mltrain train` and `profile`).
std::string after_train(const std::string& args) {
  return args.substr(std::string("train ").size());
}

fs::path newest_checkpoint(const fs::path& run) {
  std::string latest = slurp(run / "checkpoints" / "latest");
  latest.erase(latest.find_last_not_of(" \n") + 1);
  return run / "checkpoints" / latest;
}

}  // namespace

TEST_CASE("exported: a user's PyTorch class trains, resumes bitwise, predicts, and loads back",
          "[cli][exported]") {
  const auto d = tmpdir("exported");
  const fs::path pt2 = exported_model(d);
  const auto t = run(train_args(d, pt2, "whole"));
  INFO(t.out);
  REQUIRE(t.code == 0);
  CHECK_THAT(t.out, Catch::Contains("[model] exported(" + pt2.string()));
  const fs::path r = d / "whole" / "v0";
  const auto acc = std::stod(t.out.substr(t.out.find("test accuracy: ") + 15));
  CHECK(acc > 0.6);  // 2 epochs of 2,048 images; chance is 0.1

  // SIGKILL right after the third checkpoint folder is in place, then the same command again.
  const auto k =
      sh("MLTRAIN_FAULT=ckpt.folder_renamed@3 " + kBin + " " + train_args(d, pt2, "killed"));
  CHECK(k.code == 137);
  CHECK_THAT(k.out, Catch::Contains("[fault] killed at ckpt.folder_renamed@3"));
  const auto again = run(train_args(d, pt2, "killed"));
  INFO(again.out);
  REQUIRE(again.code == 0);
  CHECK_THAT(again.out, Catch::Contains("resum"));
  CHECK(final_digests(d / "killed") == final_digests(d / "whole"));

  // evaluate gives the run's final test metrics; predict's softmax is PyTorch's on the user's
  // class loaded from the run's weights.
  const auto e = run("evaluate " + r.string() + " --json");
  INFO(e.out);
  REQUIRE(e.code == 0);
  CHECK(std::abs(json_of(e.out)["metrics"]["accuracy"].get<double>() - acc) < 1e-4);
  REQUIRE(sh(kPython + " -c \"import numpy as np; np.save('" + (d / "x.npy").string() +
             "', np.random.default_rng(3).integers(0, 256, (9, 28, 28), dtype=np.uint8))\"")
              .code == 0);
  const auto p =
      run("predict " + r.string() + " " + (d / "x.npy").string() + " -o " + (d / "p.csv").string());
  INFO(p.out);
  REQUIRE(p.code == 0);
  const auto g = sh(kPython + " " + kChecker + " check " +
                    (newest_checkpoint(r) / "model.safetensors").string() + " " +
                    (d / "x.npy").string() + " " + (d / "p.csv").string() + " 0.2860 0.3530 1e-5");
  INFO(g.out);
  CHECK(g.code == 0);
  CHECK_THAT(g.out, Catch::Contains("rows 9"));
  CHECK_THAT(g.out, Catch::Contains("argmax_agree True"));

  // fuse and quantize work on the registry's models: exit 2 with the reason, nothing written.
  const auto f = run("fuse " + r.string());
  CHECK(f.code == 2);
  CHECK_THAT(f.out, Catch::Contains("is an exported program"));
  CHECK_FALSE(fs::exists(r / "fused"));
  const auto q = run("quantize " + r.string());
  CHECK(q.code == 2);
  CHECK_THAT(q.out, Catch::Contains("not 'exported'"));

  // profile names the program's forward by module, the user's own `stem` and `head`, and their
  // backward: the convolution's and the linear's autograd functions, by the same names.
  const auto pr =
      run("profile " + after_train(train_args(d, pt2, "prof")) + " --out " + (d / "prof").string());
  INFO(pr.out);
  CHECK(pr.code == 0);
  CHECK_THAT(pr.out, Catch::Contains("top graph nodes by forward CPU time"));
  CHECK_THAT(pr.out, Catch::Contains("stem: aten::conv2d"));
  CHECK_THAT(pr.out, Catch::Contains("head: aten::linear"));
  const auto pj = nlohmann::json::parse(slurp(d / "prof" / "profile.json"));
  CHECK(pj["graph_nodes"].size() > 3);
  CHECK_THAT(pr.out, Catch::Contains("top graph nodes by backward CPU time"));
  std::set<std::string> back;
  for (const auto& n : pj["graph_nodes_backward"]) {
    back.insert(n["name"].get<std::string>());
    CHECK(n["total_ms_per_step"].get<double>() > 0);
  }
  CHECK(back.count("stem: aten::conv2d"));
  CHECK(back.count("head: aten::linear"));
  CHECK(back.count("bn1: aten::batch_norm"));

  // A run can start from a safetensors file of the same module (here the trained one).
  const auto from = run(train_args(d, pt2, "from") + " train.duration=1u model.init_from=" +
                        (newest_checkpoint(r) / "model.safetensors").string());
  INFO(from.out);
  CHECK(from.code == 0);
}

TEST_CASE("exported: data parallel over Gloo, the two ranks' parameters equal at every step",
          "[cli][exported][dist]") {
  const auto d = tmpdir("exported_ddp");
  const fs::path pt2 = exported_model(d);
  ScopedEnv env({{"MLTRAIN_TEST_PARAM_DIGEST", (d / "digest").c_str()}});
  const auto two =
      run("launch --nproc-per-node 2 -- mltrain train " + after_train(train_args(d, pt2, "ddp")) +
          " train.duration=1ep data.batch_size=64 runtime.threads=1");
  env.restore();
  INFO(two.out);
  REQUIRE(two.code == 0);
  CHECK(two.out.find("joined Gloo") != std::string::npos);
  const auto r0 = lines_of(d / "digest.0"), r1 = lines_of(d / "digest.1");
  REQUIRE(r0.size() == 16);  // 2,048 images / (2 ranks x 64)
  CHECK(r0 == r1);
  CHECK(std::set<std::string>(r0.begin(), r0.end()).size() == r0.size());  // and they trained
}

// bf16 autocast is a dispatcher key, so the graph's convolutions and linears run in bf16 with no
// change to the program: the same run in fp32 and bf16 ends with other weights, both trained. A
// tune study runs its trials on the program.
TEST_CASE("exported: bf16 autocast trains the program; tune searches over it", "[cli][exported]") {
  const auto d = tmpdir("exported_amp_tune");
  const fs::path pt2 = exported_model(d);
  const auto fp32 = run(train_args(d, pt2, "fp32"));
  const auto bf16 = run(train_args(d, pt2, "bf16") + " amp.enabled=true amp.dtype=bf16");
  INFO(fp32.out << bf16.out);
  REQUIRE(fp32.code == 0);
  REQUIRE(bf16.code == 0);
  const double a32 = std::stod(fp32.out.substr(fp32.out.find("test accuracy: ") + 15));
  const double a16 = std::stod(bf16.out.substr(bf16.out.find("test accuracy: ") + 15));
  CHECK(a32 > 0.6);  // 2 epochs of 2,048 images; chance is 0.1
  CHECK(a16 > 0.6);
  CHECK(std::abs(a16 - a32) < 0.1);
  CHECK(final_digests(d / "fp32") != final_digests(d / "bf16"));

  const auto t =
      sh("cd " + kSrc + " && " + kBin + " tune configs/tune/fashion_mnist_mlp.yaml " +
         "study.n_trials=2 study.dir=" + (d / "tune").string() +
         " trial.train=configs/fashion_mnist_cnn.yaml 'trial.overrides=[model.name=exported, "
         "model.path=" +
         pt2.string() +
         ", train.duration=20u, train.eval_every=10u, "
         "data.val_fraction=0.1, checkpoint.every=20u, data.limit_train=1024]' 2>&1");
  INFO(t.out);
  REQUIRE(t.code == 0);
  CHECK_THAT(t.out, Catch::Contains("[tune] trial 0 COMPLETE accuracy="));
  CHECK_THAT(t.out, Catch::Contains("[tune] trial 1 "));  // complete, or pruned by ASHA
  CHECK_THAT(t.out, Catch::Contains("2 trials: "));
  CHECK_THAT(t.out, Catch::Contains(" 0 failed"));
  const auto best = slurp(d / "tune" / "fashion_mnist_mlp" / "best.yaml");
  CHECK_THAT(best, Catch::Contains(pt2.string()));
}

TEST_CASE(
    "exported: transformers' GPT-2 trains as a language model; its checkpoint loads back tied",
    "[cli][exported]") {
  const auto d = tmpdir("exported_gpt2");
  const auto e = sh(kPython + " " + kChecker + " export-gpt2 " + (d / "gpt2.pt2").string());
  INFO(e.out);
  REQUIRE(e.code == 0);
  REQUIRE(run("data tokenize /usr/share/games/fortunes/literature -o " + (d / "tok").string() +
              " --bytes --val-fraction 0.1")
              .code == 0);
  const auto t =
      run("train " + kSrc + "/configs/text_char_gpt.yaml model.name=exported model.path=" +
          (d / "gpt2.pt2").string() + " data.root=" + (d / "tok").string() +
          " model.block_size=64 run.dir=" + d.string() +
          // param_groups by the module's own names: no decay on biases, norms and
          // the embeddings
          " 'optim.param_groups=[{pattern: \"*.bias\", weight_decay: 0.0},"
          " {pattern: \"*ln_*\", weight_decay: 0.0},"
          " {pattern: \"transformer.w?e.weight\", weight_decay: 0.0}]'" +
          " run.name=lm train.duration=30u train.eval_every=30u checkpoint.every=30u"
          " runtime.threads=2");
  INFO(t.out);
  REQUIRE(t.code == 0);
  CHECK_THAT(t.out, Catch::Contains("exported(" + (d / "gpt2.pt2").string()));
  const auto g = sh(kPython + " " + kChecker + " check-gpt2 " +
                    (newest_checkpoint(d / "lm" / "v0") / "model.safetensors").string());
  INFO(g.out);
  CHECK(g.code == 0);
  CHECK_THAT(g.out, Catch::Contains("tied True same True trained True"));

  // predict --generate: greedy tokens after a text, the same as transformers' GPT2LMHeadModel
  // generates from the run's weights (eval mode, the same context window).
  std::ofstream(d / "prompt.txt") << "The cat sat on the mat and then ";
  const auto p = run("predict " + (d / "lm" / "v0").string() + " " + (d / "prompt.txt").string() +
                     " --generate 12 --temperature 0 -o " + (d / "gen.jsonl").string());
  INFO(p.out);
  REQUIRE(p.code == 0);
  const auto c = sh(kPython + " " + kChecker + " check-generate " +
                    (newest_checkpoint(d / "lm" / "v0") / "model.safetensors").string() + " " +
                    (d / "prompt.txt").string() + " " + (d / "gen.jsonl").string());
  INFO(c.out);
  CHECK(c.code == 0);
  CHECK_THAT(c.out, Catch::Contains("generated 12 equal True"));
}

TEST_CASE("exported: init --model writes a config that trains the .pt2 on the data",
          "[cli][exported]") {
  const auto d = tmpdir("exported_init");
  const fs::path pt2 = exported_model(d);
  const auto i =
      run("init " + kFmnist + " -o " + (d / "mine.yaml").string() + " --model " + pt2.string());
  INFO(i.out);
  REQUIRE(i.code == 0);
  const std::string yaml = slurp(d / "mine.yaml");
  CHECK_THAT(yaml, Catch::Contains("name: exported"));
  CHECK_THAT(yaml, Catch::Contains(pt2.string()));
  CHECK_THAT(yaml, Catch::Contains("input x [B, 1, 28, 28] float32"));
  const auto t =
      run("train " + (d / "mine.yaml").string() + " run.dir=" + d.string() +
          " data.limit_train=512 train.duration=4u train.eval_every=never checkpoint.every=never");
  INFO(t.out);
  CHECK(t.code == 0);
  const auto bad = run("init " + kFmnist + " -o " + (d / "x.yaml").string() + " --model " +
                       (d / "missing.pt2").string());
  CHECK(bad.code == 3);
  CHECK_THAT(bad.out, Catch::Contains("missing.pt2"));
}

TEST_CASE("exported: bad configs exit 2, bad archives and data 3, each naming what and where",
          "[cli][exported]") {
  const auto d = tmpdir("exported_bad");
  const fs::path pt2 = exported_model(d);
  const std::string base = train_args(d, pt2, "bad");
  {
    const auto r = run(base + " model.output=hidden");
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Catch::Contains("model.output"));
    CHECK_THAT(r.out, Catch::Contains("it returns output"));
  }
  {
    const auto r = run("train " + kSrc + "/configs/fashion_mnist_cnn.yaml model.name=exported");
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Catch::Contains("model.path"));
  }
  {
    // Its dropout draws ATen's generator in call order, which the world would change.
    const auto r =
        run(base + " distributed.invariance=bitwise train.global_batch=96 data.batch_size=auto");
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Catch::Contains("exported program's kernels and random draws"));
  }
  {
    const auto r = run(base + " memory.checkpoint=blocks");
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Catch::Contains("no repeated blocks to checkpoint"));
  }
  {
    const auto r = run(base + " model.path=" + (d / "nope.pt2").string());
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Catch::Contains("nope.pt2"));
    CHECK_THAT(r.out, Catch::Contains("not found"));
  }
  {
    std::ofstream(d / "junk.pt2") << "PK\x03\x04 but not really a zip";
    const auto r = run(base + " model.path=" + (d / "junk.pt2").string());
    CHECK(r.code == 3);
    CHECK_THAT(r.out, Catch::Contains("junk.pt2: not a readable zip archive"));
  }
}
