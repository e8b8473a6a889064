// `mltrain evaluate` and `mltrain predict`: a trained run on other data.
#include "cli_support.hpp"

namespace {

// The summary record of a finished run's metrics.jsonl.
nlohmann::json summary_of_run(const fs::path& run) {
  for (const auto& line : lines_of(run / "metrics.jsonl")) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "summary") return j;
  }
  FAIL("no summary record in " << (run / "metrics.jsonl"));
  return {};
}

// A small MLP on Fashion-MNIST (2,000 training images, one epoch), evaluated on the whole test set.
fs::path train_mlp(const fs::path& d) {
  const auto t = run(tiny_mlp(d, "mlp", 2000,
                              "train.duration=2ep train.eval_every=1ep checkpoint.every=1ep"
                              " checkpoint.keep_last=1 checkpoint.keep_best=1 model.hidden=[32]"
                              " runtime.threads=2 data.workers=1"));
  INFO(t.out);
  REQUIRE(t.code == 0);
  return d / "mlp" / "v0";
}

}  // namespace

TEST_CASE("evaluate: the run's own test split gives its final test metrics exactly",
          "[cli][evaluate]") {
  const auto d = tmpdir("evaluate");
  const fs::path r = train_mlp(d);
  const auto summary = summary_of_run(r);
  const auto e = run("evaluate " + r.string() + " --json");
  INFO(e.out);
  REQUIRE(e.code == 0);
  const auto j = json_of(e.out);
  CHECK(j["samples"] == 10000);
  CHECK(j["split"] == "test");
  CHECK(j["metrics"]["accuracy"].get<double>() == summary["test_accuracy"].get<double>());
  CHECK(j["metrics"]["loss"].get<double>() == summary["test_loss"].get<double>());
  CHECK(nlohmann::json::parse(slurp(r / "evaluation_test.json")) == j);

  // --best: the kept checkpoint with the best eval accuracy, which its trainer.json records.
  const auto b = run("evaluate " + r.string() + " --best --json -o " + (d / "best.json").string());
  REQUIRE(b.code == 0);
  const auto bj = nlohmann::json::parse(slurp(d / "best.json"));
  const auto ts = nlohmann::json::parse(slurp(fs::path(bj["checkpoint"]) / "trainer.json"));
  CHECK(bj["metrics"]["accuracy"].get<double>() == ts["monitor"].get<double>());

  // Another data set through the config's keys: the training images as the test split.
  const auto o =
      run("evaluate " + r.string() + " --json data.dataset=files data.train_images=" + kFmnist +
          "/t10k-images-idx3-ubyte.gz data.train_labels=" + kFmnist +
          "/t10k-labels-idx1-ubyte.gz data.test_images=" + kFmnist +
          "/train-images-idx3-ubyte.gz data.test_labels=" + kFmnist +
          "/train-labels-idx1-ubyte.gz data.limit_train=0");
  INFO(o.out);
  REQUIRE(o.code == 0);
  CHECK(json_of(o.out)["samples"] == 60000);

  // Refused: no validation split, EMA weights the run never kept, a folder without checkpoints.
  const auto v = run("evaluate " + r.string() + " --split val");
  CHECK(v.code == 2);
  CHECK_THAT(v.out, Catch::Contains("no validation split"));
  const auto ema = run("evaluate " + r.string() + " --ema");
  CHECK(ema.code == 2);
  CHECK_THAT(ema.out, Catch::Contains("no EMA weights"));
  fs::create_directories(d / "empty" / "checkpoints");
  const auto n = run("evaluate " + (d / "empty").string());
  CHECK(n.code == 3);
  CHECK_THAT(n.out, Catch::Contains("holds no intact checkpoint"));
}

TEST_CASE("predict: PyTorch's softmax of the run's weights; inputs that do not fit exit 3",
          "[cli][predict]") {
  const auto d = tmpdir("predict");
  const fs::path r = train_mlp(d);
  // 7 random images; PyTorch's forward from model.safetensors is the golden.
  REQUIRE(sh(kPython + " -c \"import numpy as np; np.save('" + (d / "x.npy").string() +
             "', np.random.default_rng(3).integers(0, 256, (7, 28, 28), dtype=np.uint8)); "
             "np.save('" +
             (d / "small.npy").string() + "', np.zeros((2, 14, 14), dtype=np.uint8))\"")
              .code == 0);
  const auto p =
      run("predict " + r.string() + " " + (d / "x.npy").string() + " -o " + (d / "p.csv").string());
  INFO(p.out);
  REQUIRE(p.code == 0);
  const auto rows = lines_of(d / "p.csv");
  REQUIRE(rows.size() == 8);
  CHECK(rows[0].rfind("id,prediction,p_0,p_1,", 0) == 0);
  CHECK(rows[1].rfind((d / "x.npy").string() + ":0,", 0) == 0);
  // The newest checkpoint: the weights predict used.
  const auto ck = r / "checkpoints";
  fs::path newest;
  for (const auto& e : fs::directory_iterator(ck))
    if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0 &&
        (newest.empty() || std::stoll(e.path().filename().string().substr(5)) >
                               std::stoll(newest.filename().string().substr(5))))
      newest = e.path();
  const auto g = sh(kPython + " " + kSrc + "/tests/golden/check_predict.py " +
                    (newest / "model.safetensors").string() + " " + (d / "x.npy").string() + " " +
                    (d / "p.csv").string() + " 0.2860 0.3530 1e-5");
  INFO(g.out);
  CHECK(g.code == 0);
  CHECK_THAT(g.out, Catch::Contains("argmax_agree True"));

  // JSON lines with the 3 likeliest classes, in order.
  const auto k = run("predict " + r.string() + " " + (d / "x.npy").string() + " --top-k 3 -o " +
                     (d / "p.jsonl").string());
  REQUIRE(k.code == 0);
  const auto jl = lines_of(d / "p.jsonl");
  REQUIRE(jl.size() == 7);
  const auto first = nlohmann::json::parse(jl[0]);
  REQUIRE(first["top"].size() == 3);
  CHECK(first["top"][0]["probability"].get<double>() >=
        first["top"][1]["probability"].get<double>());
  CHECK(first["top"][0]["class"] == first["prediction"]);

  // Inputs that do not fit: another image size, a file that is not there.
  const auto s = run("predict " + r.string() + " " + (d / "small.npy").string());
  CHECK(s.code == 3);
  CHECK_THAT(s.out, Catch::Contains("small.npy"));
  CHECK_THAT(s.out, Catch::Contains("the model was trained on [1,28,28]"));
  const auto m = run("predict " + r.string() + " " + (d / "missing.npy").string());
  CHECK(m.code == 3);
  CHECK_THAT(m.out, Catch::Contains("missing.npy: does not exist"));
  CHECK_FALSE(fs::exists(d / "missing.csv"));
}

TEST_CASE("predict on a CSV table: the training table's columns by name, in any order",
          "[cli][predict][csv]") {
  const auto d = tmpdir("predict_csv");
  // y is "hi" when a + b > 0: a rule an MLP learns in a few epochs.
  std::ofstream tr(d / "train.csv"), te(d / "test.csv");
  tr << "a,b,noise,y\n";
  te << "a,b,noise,y\n";
  for (int i = 0; i < 400; ++i) {
    const double a = ((i * 37) % 101 - 50) / 25.0, b = ((i * 59) % 97 - 48) / 24.0;
    (i < 300 ? tr : te) << a << "," << b << "," << (i % 7) << "," << (a + b > 0 ? "hi" : "lo")
                        << "\n";
  }
  tr.close(), te.close();
  const std::string cfg = kSrc + "/configs/breast_cancer_csv.yaml run.dir=" + d.string() +
                          " data.train_images=" + (d / "train.csv").string() +
                          " data.test_images=" + (d / "test.csv").string() +
                          " data.csv.target=[y] train.duration=30ep train.eval_every=10ep";
  REQUIRE(run("train " + cfg).code == 0);
  const fs::path r = d / "breast_cancer_csv" / "v0";
  // New rows: no target column, the features in another order.
  std::ofstream(d / "new.csv") << "noise,b,a\n0,2.0,1.5\n3,-2.0,-1.5\n";
  const auto p = run("predict " + r.string() + " " + (d / "new.csv").string() + " -o " +
                     (d / "out.csv").string());
  INFO(p.out);
  REQUIRE(p.code == 0);
  const auto rows = lines_of(d / "out.csv");
  REQUIRE(rows.size() == 3);
  CHECK(rows[0] == "id,prediction,p_hi,p_lo");
  CHECK(rows[1].rfind((d / "new.csv").string() + ":1,hi,", 0) == 0);
  CHECK(rows[2].rfind((d / "new.csv").string() + ":2,lo,", 0) == 0);
  // A table without one of the training table's feature columns.
  std::ofstream(d / "short.csv") << "a,noise\n1,0\n";
  const auto s = run("predict " + r.string() + " " + (d / "short.csv").string());
  CHECK(s.code == 3);
  CHECK_THAT(s.out,
             Catch::Contains("short.csv: the training table's feature column 'b' not found"));
  // Another test table through the config: the run's metrics on it.
  const auto e =
      run("evaluate " + r.string() + " --json data.test_images=" + (d / "train.csv").string());
  REQUIRE(e.code == 0);
  CHECK(json_of(e.out)["samples"] == 300);
}

TEST_CASE("predict with a language model: next-token log-probabilities and sampled text",
          "[cli][predict][lm]") {
  const auto d = tmpdir("predict_lm");
  REQUIRE(run("data tokenize /usr/share/games/fortunes/literature -o " + (d / "tokens").string() +
              " --bytes")
              .code == 0);
  const auto t = run("train " + kSrc + "/configs/text_char_gpt.yaml run.dir=" + d.string() +
                     " data.root=" + (d / "tokens").string() +
                     " model.n_layer=1 model.n_head=2 model.n_embd=32 model.block_size=32"
                     " data.batch_size=16 train.duration=30u train.eval_every=15u"
                     " checkpoint.every=15u train.final_eval=sample train.final_eval_samples=64");
  INFO(t.out);
  REQUIRE(t.code == 0);
  const fs::path r = d / "text_char_gpt" / "v0";
  std::ofstream(d / "prompt.txt") << "The quick brown fox";
  auto gen = [&](const std::string& extra) {
    const auto g = run("predict " + r.string() + " " + (d / "prompt.txt").string() +
                       " --generate 24 " + extra + " 2>/dev/null");
    INFO(g.out);
    REQUIRE(g.code == 0);
    return nlohmann::json::parse(g.out);
  };
  const auto greedy = gen("--temperature 0");
  CHECK(greedy["context_tokens"] == 19);
  CHECK(greedy["generated_tokens"].size() == 24);
  REQUIRE(greedy["next_token"].size() == 5);
  double prev = 0;
  for (const auto& e : greedy["next_token"]) {
    CHECK(e["logprob"].get<double>() <= prev);
    prev = e["logprob"].get<double>();
  }
  CHECK(greedy["generated_tokens"][0] == greedy["next_token"][0]["token"]);
  CHECK(gen("--temperature 0") == greedy);  // greedy is deterministic
  CHECK(gen("--seed 7 --sample-top-k 10") == gen("--seed 7 --sample-top-k 10"));  // seeded
  // A language model's predictions are JSON lines, not CSV.
  const auto c = run("predict " + r.string() + " " + (d / "prompt.txt").string() + " -o " +
                     (d / "x.csv").string());
  CHECK(c.code == 2);
  // `mltrain runs` shows the run's own monitored metric (the eval loss), not "-" for accuracy.
  const auto runs = run("runs " + d.string());
  INFO(runs.out);
  CHECK_THAT(runs.out, Catch::Contains("best (monitored)"));
  CHECK_THAT(runs.out, Catch::Matches("(.|\n)*text_char_gpt/v0 +finished +loss [0-9.]+(.|\n)*"));
}

TEST_CASE("predict for regression and multilabel runs: values, and labels at the threshold",
          "[cli][predict][tasks]") {
  const auto d = tmpdir("predict_tasks");
  // 8 features in [-1, 1]; a regression target and 3 labels, each a sign of a feature combination.
  REQUIRE(
      sh(kPython +
         " -c \"import numpy as np; r = np.random.default_rng(5); "
         "x = r.uniform(-1, 1, (600, 8)).astype(np.float32); "
         "np.save('" +
         (d / "x.npy").string() +
         "', x); "
         "np.save('" +
         (d / "reg.npy").string() +
         "', (x[:, 0] + 2 * x[:, 1]).astype(np.float32)); "
         "np.save('" +
         (d / "hot.npy").string() +
         "', np.stack([x[:, 0] > 0, x[:, 1] + x[:, 2] > 0, x[:, 3] > 0], 1).astype(np.float32))\"")
          .code == 0);
  const std::string common = "train " + kSrc +
                             "/configs/diabetes_regression.yaml run.dir=" + d.string() +
                             " train.duration=20ep train.eval_every=20ep" +
                             " data.train_images=" + (d / "x.npy").string() +
                             " data.test_images=" + (d / "x.npy").string();
  REQUIRE(run(common + " run.name=reg data.train_labels=" + (d / "reg.npy").string() +
              " data.test_labels=" + (d / "reg.npy").string())
              .code == 0);
  auto p = run("predict " + (d / "reg" / "v0").string() + " " + (d / "x.npy").string() + " -o " +
               (d / "reg.csv").string());
  INFO(p.out);
  REQUIRE(p.code == 0);
  auto rows = lines_of(d / "reg.csv");
  REQUIRE(rows.size() == 601);
  CHECK(rows[0] == "id,prediction");
  CHECK(rows[1].rfind((d / "x.npy").string() + ":0,", 0) == 0);

  REQUIRE(run(common + " run.name=hot task.name=multilabel data.num_classes=3 data.train_labels=" +
              (d / "hot.npy").string() + " data.test_labels=" + (d / "hot.npy").string())
              .code == 0);
  p = run("predict " + (d / "hot" / "v0").string() + " " + (d / "x.npy").string() + " -o " +
          (d / "hot.jsonl").string());
  INFO(p.out);
  REQUIRE(p.code == 0);
  const auto jl = lines_of(d / "hot.jsonl");
  REQUIRE(jl.size() == 600);
  int64_t on = 0;
  for (const auto& line : jl) {
    const auto j = nlohmann::json::parse(line);
    REQUIRE(j["scores"].size() == 3);
    std::set<std::string> want;
    for (const auto& [label, score] : j["scores"].items()) {
      CHECK(score.get<double>() >= 0);
      CHECK(score.get<double>() <= 1);
      if (score.get<double>() >= 0.5) want.insert(label);
    }
    std::set<std::string> got;
    for (const auto& l : j["labels"]) got.insert(l.get<std::string>());
    CHECK(got == want);
    on += static_cast<int64_t>(got.size());
  }
  CHECK(on > 300);  // the labels are on about half the time; a model that learnt says so
}
