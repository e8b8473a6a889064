// `mltrain train` beyond classification: regression on .npy tables, a character-level language
// model on real text (SIGKILL and bitwise resume), models that compute their own loss, starting
// from weights with frozen layers, and the bad input each brings (exit codes and messages).
#include "cli_support.hpp"

namespace {

// A little-endian float32 .npy (v1 header).
void write_npy(const fs::path& p, const std::vector<int64_t>& shape, const std::vector<float>& v) {
  std::string dims;
  for (auto d : shape) dims += std::to_string(d) + ", ";
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::ofstream f(p, std::ios::binary);
  f << "\x93NUMPY" << '\x01' << '\x00' << static_cast<char>(h.size() & 0xff)
    << static_cast<char>(h.size() >> 8) << h;
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
}

// Deterministic uniform draws in [-1, 1] (a linear congruential generator: the data is fixed).
struct Uniform {
  uint32_t s;
  float operator()() {
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(s >> 8) / static_cast<float>(1 << 24) * 2.f - 1.f;
  }
};

// y = 2 x0 - x1 + 0.5 x2 (+ a little deterministic noise), 4 features in [-1, 1].
void write_regression(const fs::path& dir, const std::string& split, int64_t n, uint32_t seed) {
  std::vector<float> x, y;
  Uniform u{seed};
  for (int64_t i = 0; i < n; ++i) {
    float f[4] = {u(), u(), u(), u()};
    x.insert(x.end(), f, f + 4);
    y.push_back(2 * f[0] - f[1] + 0.5f * f[2] + 0.05f * u());
  }
  write_npy(dir / (split + "_x.npy"), {n, 4}, x);
  write_npy(dir / (split + "_y.npy"), {n}, y);
}

std::string regression_args(const fs::path& d) {
  return "train " + kSrc + "/configs/diabetes_regression.yaml run.dir=" + d.string() +
         " data.train_images=" + (d / "train_x.npy").string() +
         " data.train_labels=" + (d / "train_y.npy").string() +
         " data.test_images=" + (d / "test_x.npy").string() +
         " data.test_labels=" + (d / "test_y.npy").string() + " train.duration=30ep";
}

nlohmann::json last_record(const fs::path& metrics, const std::string& event) {
  nlohmann::json last;
  for (const auto& l : lines_of(metrics)) {
    auto j = nlohmann::json::parse(l);
    if (j["event"] == event) last = j;
  }
  return last;
}

}  // namespace

TEST_CASE("regression from .npy tables: MAE, RMSE, R2 reported, the relation learnt",
          "[cli][task]") {
  auto d = tmpdir("regression");
  write_regression(d, "train", 512, 1);
  write_regression(d, "test", 128, 2);
  auto r = run(regression_args(d) + " run.name=reg");
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("test loss") && Catch::Contains(" r2 "));
  const auto eval = last_record(d / "reg/v0/metrics.jsonl", "eval");
  REQUIRE(eval.contains("r2"));
  CHECK(eval["r2"].get<double>() > 0.9);
  CHECK(eval["rmse"].get<double>() < 0.4);
  CHECK_FALSE(eval.contains("accuracy"));
  const auto summary = last_record(d / "reg/v0/metrics.jsonl", "summary");
  CHECK(summary["task"] == "regression");
  CHECK(summary["test_r2"].get<double>() == Approx(eval["r2"].get<double>()));
  // Commands that check class logits refuse the run, naming the key.
  auto fused = run("fuse " + (d / "reg/v0").string());
  CHECK(fused.code == 2);
  CHECK_THAT(fused.out, Catch::Contains("task.name") && Catch::Contains("regression"));
}

TEST_CASE("task bad input: unknown metric (2, listing the task's), misfit targets (3)",
          "[cli][task]") {
  auto d = tmpdir("task_bad");
  write_regression(d, "train", 64, 1);
  write_regression(d, "test", 32, 2);
  auto wrong = run(regression_args(d) + " checkpoint.monitor=eval_accuracy");
  CHECK(wrong.code == 2);
  CHECK_THAT(wrong.out, Catch::Contains("checkpoint.monitor") &&
                            Catch::Contains("eval_loss, eval_mae, eval_rmse, eval_r2"));
  write_npy(d / "short_y.npy", {10}, std::vector<float>(10, 1.f));
  auto misfit = run(regression_args(d) + " data.train_labels=" + (d / "short_y.npy").string());
  CHECK(misfit.code == 3);
  CHECK_THAT(misfit.out,
             Catch::Contains("short_y.npy") && Catch::Contains("targets 10 for 64 samples"));
  write_npy(d / "hot.npy", {64, 2}, std::vector<float>(128, 0.5f));
  auto hot =
      run(regression_args(d) +
          " task.name=multilabel data.num_classes=2 data.train_labels=" + (d / "hot.npy").string());
  CHECK(hot.code == 3);
  CHECK_THAT(hot.out, Catch::Contains("multilabel target at sample 0, element 0 is 0.5"));
  auto metrics =
      run("config metrics task.name=multilabel data.dataset=files data.num_classes=2 "
          "data.train_images=a.npy data.test_images=b.npy");
  REQUIRE(metrics.code == 0);
  CHECK_THAT(metrics.out, Catch::Contains("eval_roc_auc_macro\tmax") &&
                              Catch::Contains("eval_roc_auc_class1\tmax") &&
                              Catch::Contains("eval_loss\tmin"));
}

TEST_CASE("language model on real text: tokenize, train, SIGKILL, resume bitwise", "[cli][task]") {
  auto d = tmpdir("lm");
  auto tok = run("data tokenize /usr/share/games/fortunes/literature -o " +
                 (d / "tokens").string() + " --bytes --val-fraction 0.1");
  REQUIRE(tok.code == 0);
  CHECK_THAT(tok.out, Catch::Contains("vocab 256"));
  auto args = [&](const std::string& name) {
    return std::vector<std::string>{kBin,
                                    "train",
                                    kSrc + "/configs/text_char_gpt.yaml",
                                    "run.dir=" + d.string(),
                                    "run.name=" + name,
                                    "data.root=" + (d / "tokens").string(),
                                    "model.n_layer=1",
                                    "model.n_head=2",
                                    "model.n_embd=32",
                                    "model.block_size=32",
                                    "model.dropout=0.1",  // dropout's RNG must resume too
                                    "data.batch_size=16",
                                    "train.duration=80u",
                                    "train.eval_every=40u",
                                    "train.log_every=2u",
                                    "checkpoint.every=10u",
                                    "checkpoint.keep_last=3",
                                    "runtime.threads=2"};
  };
  REQUIRE(run(join(args("reference"), 1)).code == 0);
  const auto eval = last_record(d / "reference/v0/metrics.jsonl", "eval");
  CHECK(eval["bits_per_token"].get<double>() > 0);
  CHECK(eval["bits_per_token"].get<double>() < 8);  // below a uniform guess over 256 bytes
  CHECK(eval["perplexity"].get<double>() == Approx(std::exp(eval["loss"].get<double>())));

  auto killed = args("killed");
  pid_t pid = spawn(killed, d / "killed.log");
  // Killed once a step-20 checkpoint exists and training has logged step 24 past it.
  const fs::path latest = d / "killed/v0/checkpoints/latest";
  const fs::path metrics = d / "killed/v0/metrics.jsonl";
  REQUIRE(wait_for(
      [&] {
        if (!fs::exists(latest) || slurp(latest).find("step_20") == std::string::npos) return false;
        return slurp(metrics).find("\"step\":24") != std::string::npos;
      },
      120));
  kill(pid, SIGKILL);
  CHECK(wait_exit(pid) == 128 + SIGKILL);
  CHECK_FALSE(fs::exists(d / "killed/v0/checkpoints/step_80"));
  auto resumed = run(join(killed, 1));
  REQUIRE(resumed.code == 0);
  CHECK_THAT(resumed.out, Catch::Contains("resuming in"));
  for (const char* f : {"model.safetensors", "state.safetensors"}) {
    INFO(f);
    const auto a = slurp(d / "reference/v0/checkpoints/step_80" / f);
    REQUIRE(a.size() > 1000);
    CHECK(a == slurp(d / "killed/v0/checkpoints/step_80" / f));
  }

  // A vocabulary smaller than the text's bytes: exit 3 naming the token's offset.
  auto small = run(join(args("small_vocab"), 1) + " data.vocab_size=100");
  CHECK(small.code == 3);
  CHECK_THAT(small.out, Catch::Contains("train.bin") && Catch::Contains("at offset") &&
                            Catch::Contains("outside the vocabulary [0, 100)"));
  auto wide = run(join(args("wide"), 1) + " model.block_size=100000");
  CHECK(wide.code == 3);
  CHECK_THAT(wide.out, Catch::Contains("shorter than one window"));
}

TEST_CASE("task custom: the model's own loss and named metrics; a model without a loss: exit 2",
          "[cli][task]") {
  auto d = tmpdir("custom");
  const std::string base =
      "train " + kSrc + "/configs/fashion_mnist_mlp.yaml run.dir=" + d.string() +
      " task.name=custom model.name=torchscript data.limit_train=2000 "
      "train.duration=1ep train.target_accuracy=0 data.eval_batch_size=1000 "
      "'early_stopping.metrics=[{monitor: eval_acc, mode: max, patience: 3}]' ";
  auto ok = run(base + "run.name=ok model.path=" + kSrc + "/tests/golden/custom_loss.pt");
  REQUIRE(ok.code == 0);
  const auto eval = last_record(d / "ok/v0/metrics.jsonl", "eval");
  REQUIRE(eval.contains("acc"));
  CHECK(eval["acc"].get<double>() > 0.6);  // a linear model after one short epoch
  CHECK(eval["loss"].get<double>() < 1.5);
  auto bad = run(base + "run.name=bad model.path=" + kSrc + "/tests/golden/custom_no_loss.pt");
  CHECK(bad.code == 2);
  CHECK_THAT(bad.out,
             Catch::Contains("custom_no_loss.pt") && Catch::Contains("returned no scalar loss"));
  CHECK_FALSE(fs::exists(d / "bad/v0/checkpoints/latest"));
}

TEST_CASE("fine-tuning: init_from a run, frozen body, only the head trains", "[cli][task]") {
  auto d = tmpdir("finetune");
  auto src = small_run(d, "source");
  src.push_back("train.duration=20u");
  REQUIRE(run(join(src, 1)).code == 0);
  auto tune = small_run(d, "tuned");
  for (const std::string& a : std::vector<std::string>{
           "train.duration=10u", "model.init_from=" + (d / "source/v0").string(),
           "optim.param_groups=[{pattern: \"fc2.*\"}, {pattern: \"*\", freeze: true}]"})
    tune.push_back(a);
  auto r = run(join(tune, 1));
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("[init_from]") && Catch::Contains("frozen"));
  const auto a = slurp(d / "source/v0/checkpoints/step_20/model.safetensors");
  const auto b = slurp(d / "tuned/v0/checkpoints/step_10/model.safetensors");
  // conv1.weight is the first tensor in both files (same names, same order): unchanged bytes.
  const auto header = [](const std::string& s) {
    uint64_t n = 0;
    std::memcpy(&n, s.data(), 8);
    return nlohmann::json::parse(s.substr(8, n));
  };
  const auto ha = header(a), hb = header(b);
  for (const char* name : {"conv1.weight", "fc2.weight"}) {
    INFO(name);
    const auto ra = ha[name]["data_offsets"], rb = hb[name]["data_offsets"];
    const auto off = [](const nlohmann::json& h, const std::string& s) {
      uint64_t n = 0;
      std::memcpy(&n, s.data(), 8);
      return 8 + n + h[0].get<uint64_t>();
    };
    const auto len = ra[1].get<uint64_t>() - ra[0].get<uint64_t>();
    const bool same = a.substr(off(ra, a), len) == b.substr(off(rb, b), len);
    CHECK(same == (std::string(name) == "conv1.weight"));
  }
}

TEST_CASE("profile and tune take every task: a regression run profiled, a study maximising r2",
          "[cli][task]") {
  auto d = tmpdir("task_tools");
  write_regression(d, "train", 256, 1);
  write_regression(d, "test", 64, 2);
  auto prof = run("profile " + regression_args(d).substr(6) +
                  " run.name=prof --wait 1 --warmup 1 --active 3 --json");
  REQUIRE(prof.code == 0);
  const auto j = json_of(prof.out);
  CHECK(j["diagnosis"].contains("verdict"));
  CHECK(j["measure"].is_object());

  std::ofstream(d / "study.yaml")
      << "study: {name: r2_study, dir: " << (d / "tune").string() << ", seed: 0, n_trials: 3}\n"
      << "sampler: {name: random}\n"
      << "objective: {metric: r2, direction: maximize}\n"
      << "trial:\n  train: " << kSrc << "/configs/diabetes_regression.yaml\n"
      << "  overrides: [train.duration=5ep, train.eval_every=5ep, run.dir=" << (d / "runs").string()
      << ", data.train_images=" << (d / "train_x.npy").string()
      << ", data.train_labels=" << (d / "train_y.npy").string()
      << ", data.test_images=" << (d / "test_x.npy").string()
      << ", data.test_labels=" << (d / "test_y.npy").string() << "]\n"
      << "space:\n  optim.lr: {type: float, low: 1.0e-3, high: 3.0e-2, log: true}\n";
  auto tune = run("tune " + (d / "study.yaml").string());
  REQUIRE(tune.code == 0);
  const auto csv = slurp(d / "tune/r2_study/trials.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 4);  // header + 3 trials
  const auto rows = lines_of(d / "tune/r2_study/trials.csv");
  for (size_t i = 1; i < rows.size(); ++i) {  // number,state,value (the trial's last r2),...
    INFO(rows[i]);
    CHECK_THAT(rows[i], Catch::Contains(",COMPLETE,"));
    const double r2 = std::stod(rows[i].substr(rows[i].find("COMPLETE,") + 9));
    CHECK(r2 > 0);
    CHECK(r2 <= 1);
  }
  CHECK(fs::exists(d / "tune/r2_study/best.yaml"));
  // best.yaml is a runnable config: it trains as it is (shortened here).
  auto best = run("train " + (d / "tune/r2_study/best.yaml").string() +
                  " train.duration=2ep run.name=best_rerun");
  INFO(best.out);
  CHECK(best.code == 0);
  CHECK_THAT(best.out, Catch::Contains("r2"));

  // A study in which no trial completes is a failure: exit 1 naming the study folder, after the
  // summary (here every trial's training data is missing).
  std::ofstream(d / "broken.yaml")
      << "study: {name: broken, dir: " << (d / "tune").string() << ", seed: 0, n_trials: 2}\n"
      << "sampler: {name: random}\n"
      << "objective: {metric: r2, direction: maximize}\n"
      << "trial:\n  train: " << kSrc << "/configs/diabetes_regression.yaml\n"
      << "  overrides: [train.duration=1ep, run.dir=" << (d / "runs").string()
      << ", data.train_images=" << (d / "missing.npy").string() << "]\n"
      << "space:\n  optim.lr: {type: float, low: 1.0e-3, high: 3.0e-2, log: true}\n";
  auto broken = run("tune " + (d / "broken.yaml").string());
  INFO(broken.out);
  CHECK(broken.code == 1);
  CHECK_THAT(broken.out, Catch::Contains("tune/broken: no trial completed ("));
  CHECK_THAT(broken.out, Catch::Contains("trials.csv"));
}

TEST_CASE("multilabel on 2 Gloo ranks: every held-out sample counted once, metrics as one process",
          "[cli][task][dist]") {
  auto d = tmpdir("multilabel_ddp");
  // 8 features in [-1, 1]; 3 labels, each a sign of a feature combination. 257 test samples: odd,
  // so an even split over 2 ranks would drop one.
  auto write = [&](const std::string& split, int64_t n, uint32_t seed) {
    std::vector<float> x, y;
    Uniform u{seed};
    for (int64_t i = 0; i < n; ++i) {
      float f[8];
      for (float& v : f) v = u();
      x.insert(x.end(), f, f + 8);
      y.push_back(f[0] > 0), y.push_back(f[1] + f[2] > 0), y.push_back(f[3] * f[4] > 0);
    }
    write_npy(d / (split + "_x.npy"), {n, 8}, x);
    write_npy(d / (split + "_y.npy"), {n, 3}, y);
  };
  write("train", 1024, 3);
  write("test", 257, 4);
  const std::string common =
      kSrc + "/configs/diabetes_regression.yaml task.name=multilabel data.num_classes=3 " +
      "model.dropout=0 train.duration=4ep train.eval_every=4ep checkpoint.every=4ep run.dir=" +
      d.string() + " data.train_images=" + (d / "train_x.npy").string() +
      " data.train_labels=" + (d / "train_y.npy").string() +
      " data.test_images=" + (d / "test_x.npy").string() +
      " data.test_labels=" + (d / "test_y.npy").string();
  REQUIRE(run("train " + common + " run.name=one data.batch_size=64").code == 0);
  auto two = run("launch --nproc-per-node 2 -- mltrain train " + common +
                 " run.name=two data.batch_size=32");
  INFO(two.out);
  REQUIRE(two.code == 0);
  const auto a = last_record(d / "one/v0/metrics.jsonl", "eval");
  const auto b = last_record(d / "two/v0/metrics.jsonl", "eval");
  CHECK(a["samples"] == 257);
  CHECK(b["samples"] == 257);
  CHECK(a["roc_auc_macro"].get<double>() > 0.8);  // the labels are learnable
  for (const char* m : {"loss", "roc_auc_macro", "f1_micro", "f1_macro"}) {
    INFO(m);
    CHECK(b[m].get<double>() == Approx(a[m].get<double>()).margin(2e-3));
  }
}
