// task: losses and streaming held-out metrics per task against scikit-learn 1.2 and PyTorch 1.13
// goldens (tests/golden/make_metrics_golden.py), fed in batches whose last one is short, so a
// dropped or double-counted sample shows; and the task's metric names at config time.
#include <catch2/catch.hpp>

#include <fstream>

#include <nlohmann/json.hpp>

#include "mltrain/config/experiment.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/task/task.hpp"

using namespace mltrain;
using Catch::Matchers::Contains;

#ifndef MLTRAIN_SOURCE_DIR
#define MLTRAIN_SOURCE_DIR "."
#endif

namespace {

nlohmann::json golden() {
  std::ifstream in(std::string(MLTRAIN_SOURCE_DIR) + "/tests/golden/metrics.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// Nested JSON lists -> a double tensor of their shape.
torch::Tensor tensor_of(const nlohmann::json& j) {
  std::vector<int64_t> shape;
  for (const nlohmann::json* p = &j; p->is_array(); p = &(*p)[0]) shape.push_back(p->size());
  std::vector<double> flat;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& v) {
    if (v.is_array())
      for (const auto& e : v) walk(e);
    else
      flat.push_back(v.get<double>());
  };
  walk(j);
  return torch::tensor(flat, torch::kDouble).reshape(shape);
}

// A model whose output for sample i is row i of a fixed table (x holds the row numbers).
class TableModel : public model::Model {
 public:
  explicit TableModel(torch::Tensor table) : table_(table.to(torch::kFloat32)) {}
  torch::Tensor forward(const torch::Tensor& x) override {
    return table_.index_select(0, x.reshape({-1}).to(torch::kLong));
  }
  model::NamedTensors named_parameters() override { return {}; }
  model::NamedTensors named_buffers() override { return {}; }
  void set_training(bool) override {}
  void to(const torch::Device&) override {}
  std::string describe() const override { return "table"; }

 private:
  torch::Tensor table_;
};

// Every sample through task.forward and an accumulator, `batch` at a time (the last one short).
task::Metrics stream(const task::Task& t, model::Model& m, const torch::Tensor& targets,
                     int64_t batch) {
  auto acc = t.accumulator();
  const int64_t n = targets.size(0);
  // One target buffer reused for every batch, as the loader's slots are: an accumulator that keeps
  // a batch's tensors without copying them sees them overwritten.
  auto slot = torch::empty_like(targets.narrow(0, 0, std::min(batch, n)));
  for (int64_t begin = 0; begin < n; begin += batch) {
    const int64_t len = std::min(batch, n - begin);
    data::Batch b;
    b.x = torch::arange(begin, begin + len, torch::kFloat32).reshape({len, 1});
    b.y = slot.narrow(0, 0, len).copy_(targets.narrow(0, begin, len));
    acc->add(t.forward(m, b, 0.0, {}), b);
  }
  return acc->compute({});
}

config::ExperimentConfig config_for(const std::string& task, int64_t classes) {
  config::ExperimentConfig c;
  c.task.name = task;
  c.data.num_classes = classes;
  c.data.dataset = "files";
  return c;
}

}  // namespace

TEST_CASE("classification: accuracy, top-k and loss equal sklearn and PyTorch", "[task]") {
  const auto g = golden()["classification"];
  TableModel m(tensor_of(g["logits"]));
  auto cfg = config_for("classification", 6);
  cfg.task.top_k = 3;
  const auto t = task::make_task(cfg);
  const auto r = stream(*t, m, tensor_of(g["labels"]).to(torch::kLong), 8);
  CHECK(r.at("accuracy") == Approx(g["accuracy"].get<double>()).epsilon(1e-12));
  CHECK(r.at("top3_accuracy") == Approx(g["top3_accuracy"].get<double>()).epsilon(1e-12));
  CHECK(r.at("loss") == Approx(g["loss"].get<double>()).epsilon(1e-6));
}

TEST_CASE("classification with two classes reports the ROC AUC of class 1 (sklearn's example)",
          "[task]") {
  // sklearn.metrics.roc_auc_score([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) = 0.75; here those scores
  // are logit_1 - logit_0, and the logits are shifted so that only the difference carries them.
  const auto diff = torch::tensor({0.1, 0.4, 0.35, 0.8}, torch::kFloat32);
  const auto base = torch::tensor({2.0, -1.0, 0.5, 3.0}, torch::kFloat32);
  TableModel m(torch::stack({base, base + diff}, 1));
  const auto t = task::make_task(config_for("classification", 2));
  for (int64_t batch : {1, 3}) {  // accumulated over batches
    const auto r = stream(*t, m, torch::tensor({0, 0, 1, 1}, torch::kLong), batch);
    CHECK(r.at("roc_auc") == Approx(0.75).epsilon(1e-6));
  }
  const auto ten = stream(*task::make_task(config_for("classification", 3)),
                          *std::make_unique<TableModel>(torch::zeros({4, 3})),
                          torch::tensor({0, 1, 2, 1}, torch::kLong), 2);
  CHECK(ten.count("roc_auc") == 0);  // more than two classes: none
  const auto listed = config::task_metrics(config_for("classification", 2));
  CHECK(std::find(listed.begin(), listed.end(), "eval_roc_auc") != listed.end());
}

TEST_CASE("regression: MAE, RMSE and R2 equal sklearn's uniform averages", "[task]") {
  const auto g = golden()["regression"];
  const auto pred = tensor_of(g["pred"]), target = tensor_of(g["target"]).to(torch::kFloat32);
  TableModel m(pred.reshape({pred.size(0), -1}));  // the model's flat outputs, reshaped by the task
  auto cfg = config_for("regression", 1);
  for (int64_t batch : {1, 7, 41}) {
    INFO("batch " << batch);
    const auto r = stream(*task::make_task(cfg), m, target, batch);
    CHECK(r.at("mae") == Approx(g["mae"].get<double>()).epsilon(1e-6));
    CHECK(r.at("rmse") == Approx(g["rmse"].get<double>()).epsilon(1e-6));
    CHECK(r.at("r2") == Approx(g["r2"].get<double>()).epsilon(1e-6));
    CHECK(r.at("loss") == Approx(g["mse_loss"].get<double>()).epsilon(1e-5));
  }
  cfg.task.loss = "l1";
  CHECK(stream(*task::make_task(cfg), m, target, 41).at("loss") ==
        Approx(g["l1_loss"].get<double>()).epsilon(1e-5));
  cfg.task.loss = "huber";
  cfg.task.huber_delta = 2.0;
  CHECK(stream(*task::make_task(cfg), m, target, 41).at("loss") ==
        Approx(g["huber_loss_delta_2"].get<double>()).epsilon(1e-5));
}

TEST_CASE("regression: a constant target scores R2 1 when exact, 0 otherwise (sklearn)", "[task]") {
  const auto g = golden()["regression_constant"];
  const auto y = torch::full({5, 1}, 2.5, torch::kDouble);
  const auto off = y + torch::arange(5, torch::kDouble).reshape({5, 1}) * 0.1;
  CHECK(task::regression_metrics(task::regression_sums(y, y)).at("r2") == g["exact"].get<double>());
  CHECK(task::regression_metrics(task::regression_sums(off, y)).at("r2") == g["off"].get<double>());
}

TEST_CASE("multilabel: exact ROC-AUC with ties, F1 and weighted BCE equal sklearn/PyTorch",
          "[task]") {
  const auto g = golden()["multilabel"];
  TableModel m(tensor_of(g["logits"]));
  auto cfg = config_for("multilabel", 5);
  cfg.task.pos_weight = g["pos_weight"].get<std::vector<double>>();
  const auto r = stream(*task::make_task(cfg), m, tensor_of(g["labels"]).to(torch::kFloat32), 8);
  for (int k = 0; k < 5; ++k)
    CHECK(r.at("roc_auc_class" + std::to_string(k)) ==
          Approx(g["roc_auc_per_class"][k].get<double>()).epsilon(1e-12));
  CHECK(r.at("roc_auc_macro") == Approx(g["roc_auc_macro"].get<double>()).epsilon(1e-12));
  CHECK(r.at("f1_micro") == Approx(g["f1_micro"].get<double>()).epsilon(1e-12));
  CHECK(r.at("f1_macro") == Approx(g["f1_macro"].get<double>()).epsilon(1e-12));
  CHECK(r.at("loss") == Approx(g["bce_loss"].get<double>()).epsilon(1e-5));
}

TEST_CASE("multilabel edge cases: zero division, all-tied scores, one-class labels", "[task]") {
  const auto g = golden()["multilabel_edge"];
  const auto f1 = task::f1_scores(tensor_of(g["pred"]), tensor_of(g["labels"]));
  CHECK(f1.micro == Approx(g["f1_micro"].get<double>()).epsilon(1e-12));
  CHECK(f1.macro == Approx(g["f1_macro"].get<double>()).epsilon(1e-12));
  CHECK(task::roc_auc(torch::tensor({0.3, 0.3, 0.3, 0.3}), torch::tensor({0., 1., 0., 1.})) ==
        g["auc_all_tied"].get<double>());
  CHECK(std::isnan(task::roc_auc(torch::tensor({0.1, 0.7}), torch::tensor({1., 1.}))));
}

TEST_CASE("language model: loss per token, perplexity, bits, accuracy with ignored positions",
          "[task]") {
  const auto g = golden()["language_model"];
  TableModel m(tensor_of(g["logits"]));
  const auto r = stream(*task::make_task(config_for("language_model", 11)), m,
                        tensor_of(g["targets"]).to(torch::kLong), 2);
  CHECK(r.at("loss") == Approx(g["loss"].get<double>()).epsilon(1e-6));
  CHECK(r.at("perplexity") == Approx(g["perplexity"].get<double>()).epsilon(1e-6));
  CHECK(r.at("bits_per_token") == Approx(g["bits_per_token"].get<double>()).epsilon(1e-6));
  CHECK(r.at("accuracy") == Approx(g["accuracy"].get<double>()).epsilon(1e-12));
}

TEST_CASE("a model output that does not fit the task's targets is a ConfigError naming task.name",
          "[task]") {
  TableModel m(torch::zeros({4, 3}));
  data::Batch b;
  b.x = torch::arange(4, torch::kFloat32).reshape({4, 1});
  b.y = torch::zeros({4, 2});
  try {
    task::make_task(config_for("regression", 1))->forward(m, b, 0, {});
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Contains("task.name") && Contains("[4,3]") && Contains("[4,2]"));
  }
  CHECK_THROWS_AS(task::make_task(config_for("multilabel", 2))->forward(m, b, 0, {}), ConfigError);
  CHECK_THROWS_AS(task::make_task(config_for("custom", 2))->forward(m, b, 0, {}), ConfigError);
}

TEST_CASE("metric names: per task, checked at config time with the task's list", "[task][config]") {
  auto reg = config::load_experiment("", {"task.name=regression", "data.dataset=files",
                                          "data.train_images=a", "data.test_images=b"});
  const auto names = config::task_metrics(reg);
  CHECK(names ==
        std::vector<std::string>{"train_loss", "eval_loss", "eval_mae", "eval_rmse", "eval_r2"});
  CHECK(config::checkpoint_monitor(reg) == "eval_loss");
  CHECK(config::checkpoint_mode(reg) == "min");
  CHECK(config::checkpoint_monitor(config::load_experiment("", {})) == "eval_accuracy");
  CHECK(config::checkpoint_mode(config::load_experiment("", {})) == "max");
  CHECK(config::metric_mode("eval_r2") == "max");
  CHECK(config::metric_mode("eval_bits_per_token") == "min");
  try {
    config::load_experiment("",
                            {"task.name=regression", "data.dataset=files", "data.train_images=a",
                             "data.test_images=b", "checkpoint.monitor=eval_accuracy"});
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Contains("checkpoint.monitor") && Contains("eval_accuracy") &&
                             Contains("eval_mae, eval_rmse, eval_r2"));
  }
  CHECK_THROWS_AS(config::load_experiment("", {"schedule.monitor=eval_r2"}), ConfigError);
  CHECK_THROWS_AS(config::load_experiment("", {"task.name=regression"}), ConfigError);  // FMNIST
  CHECK_THROWS_AS(config::load_experiment(
                      "", {"task.name=multilabel", "data.dataset=files", "data.train_images=a",
                           "data.test_images=b", "data.num_classes=3", "task.pos_weight=[1,2]"}),
                  ConfigError);
}

TEST_CASE("argmax_rows: LibTorch's argmax indices, ties, NaN and infinities included", "[task]") {
  torch::manual_seed(3);
  // GPT-2's logit width (not a multiple of 16) and a narrow one; random rows, then rows built to
  // trip a scan: ties (the first wins), NaN (the first NaN wins, wherever the largest is), -inf
  // rows, +inf with a tie, a largest element in the tail past the last full 16 lanes, -0 and +0.
  for (const int64_t cols : {int64_t{50257}, int64_t{10}}) {
    torch::Tensor x = torch::randn({64, cols});
    auto at = [&](int64_t r, int64_t c) -> float& { return x.data_ptr<float>()[r * cols + c]; };
    const int64_t last = cols - 1, mid = cols / 2;
    at(0, mid) = 50, at(0, last) = 50;                   // tie: mid
    at(1, last) = NAN, at(1, 3) = 1e30f;                 // NaN wins over the largest
    at(2, mid) = NAN, at(2, last) = NAN;                 // the first NaN
    x[3].fill_(-INFINITY);                               // all -inf: 0
    at(4, 2) = INFINITY, at(4, last) = INFINITY;         // +inf tie: 2
    at(5, last) = 99;                                    // the tail
    x[6].fill_(0.f), at(6, 1) = -0.f, at(6, mid) = 0.f;  // zeros of both signs: 0
    x[7].fill_(-1.f), at(7, 5 % cols) = -0.f;            // a single -0 above -1
    const torch::Tensor want = x.argmax(1);
    CHECK(torch::equal(task::argmax_rows(x), want));
    CHECK(task::argmax_rows(x)[1].item<int64_t>() == last);
    CHECK(task::argmax_rows(x)[3].item<int64_t>() == 0);
    // A non-contiguous view and other dtypes go through LibTorch: the same indices.
    CHECK(torch::equal(task::argmax_rows(x.t().contiguous().t()), want));
    CHECK(torch::equal(task::argmax_rows(x.to(torch::kDouble)), want));
  }
}
