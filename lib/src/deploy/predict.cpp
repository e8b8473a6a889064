// mltrain evaluate and mltrain predict: a trained run rebuilt by train::restore_run, its test
// split (or any data) scored with the task's metrics, or new inputs through the model.
#include "mltrain/deploy/predict.hpp"
#include "mltrain/core/clock.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include "mltrain/config/format.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/data/open.hpp"
#include "mltrain/train/pipeline.hpp"

namespace fs = std::filesystem;

namespace mltrain::deploy {

namespace {

using Clock = std::chrono::steady_clock;

train::RestoredRun restore(const UseOptions& o, const std::string& who) {
  std::vector<std::string> overrides = o.overrides;
  if (o.ema) overrides.push_back("ema.evaluate=true");
  auto r = train::restore_run(o.where, overrides,
                              o.best ? train::Weights::kBest : train::Weights::kLast, who);
  if (o.ema && !r.pipeline->cfg.ema.enabled)
    throw ConfigError("--ema", "the run kept no EMA weights (ema.enabled is false in its config)",
                      "drop --ema");
  return r;
}

std::string weights_text(const UseOptions& o, const train::Pipeline& p) {
  const bool ema = p.cfg.ema.enabled && p.cfg.ema.evaluate;
  return std::string(o.best ? "best" : "last") + (ema ? " (EMA)" : "");
}

// %.9g: a float32 survives the round trip through text.
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// Rows to a CSV file, a JSON-lines file, or JSON lines on stdout (logs go to stderr).
class RowWriter {
 public:
  explicit RowWriter(const std::string& out) : path_(out) {
    csv_ = out.size() > 4 && out.compare(out.size() - 4, 4, ".csv") == 0;
    if (out.empty() || out == "-") return;
    tmp_ = out + ".tmp." + std::to_string(::getpid());
    file_ = std::make_unique<std::ofstream>(tmp_, std::ios::binary);
    if (!*file_)
      throw RuntimeError(out, "cannot be written", "check the folder exists and is writable");
  }
  bool csv() const { return csv_; }
  std::ostream& os() { return file_ ? *file_ : std::cout; }
  // The CSV header comes from the first row's keys (every row has the same ones).
  void row(const std::vector<std::pair<std::string, std::string>>& cells, const nlohmann::json& j) {
    if (!csv_) {
      os() << j.dump() << "\n";
      return;
    }
    if (!header_) {
      for (size_t i = 0; i < cells.size(); ++i) os() << (i ? "," : "") << csv_cell(cells[i].first);
      os() << "\n";
      header_ = true;
    }
    for (size_t i = 0; i < cells.size(); ++i) os() << (i ? "," : "") << csv_cell(cells[i].second);
    os() << "\n";
  }
  void finish() {  // the whole file appears at once, or not at all
    if (!file_) return std::cout.flush(), void();
    file_->flush();
    if (!*file_) throw RuntimeError(path_, "write failed (disk full?)", "free space and rerun");
    file_.reset();
    fs::rename(tmp_, path_);
  }
  ~RowWriter() {
    if (file_) {
      file_.reset();
      std::error_code ec;
      fs::remove(tmp_, ec);
    }
  }

 private:
  std::string path_, tmp_;
  bool csv_ = false, header_ = false;
  std::unique_ptr<std::ofstream> file_;
};

std::vector<std::string> class_names(const train::Pipeline& p, int64_t k) {
  std::vector<std::string> names = p.splits.class_names;
  if (static_cast<int64_t>(names.size()) != k) {
    names.clear();
    for (int64_t i = 0; i < k; ++i) names.push_back(std::to_string(i));
  }
  return names;
}

// One sample's output as a row, per task.
void write_sample(RowWriter& w, const train::Pipeline& p, const PredictOptions& o,
                  const std::vector<std::string>& names, const std::string& id,
                  const torch::Tensor& out) {
  const std::string& task = p.cfg.task.name;
  std::vector<std::pair<std::string, std::string>> cells = {{"id", id}};
  nlohmann::json j = {{"id", id}};
  if (task == "classification") {
    const auto prob = torch::softmax(out.to(torch::kDouble), 0);
    const int64_t k = prob.size(0), best = prob.argmax().item<int64_t>();
    cells.emplace_back("prediction", names[size_t(best)]);
    j["prediction"] = names[size_t(best)];
    if (o.top_k > 0) {
      const auto [v, idx] = prob.topk(std::min(o.top_k, k));
      nlohmann::json top = nlohmann::json::array();
      for (int64_t i = 0; i < v.size(0); ++i) {
        const auto c = names[size_t(idx[i].item<int64_t>())];
        const double pv = v[i].item<double>();
        top.push_back({{"class", c}, {"probability", pv}});
        cells.emplace_back("class_" + std::to_string(i + 1), c);
        cells.emplace_back("p_" + std::to_string(i + 1), num(pv));
      }
      j["top"] = top;
    } else {
      nlohmann::json probs = nlohmann::json::object();
      for (int64_t c = 0; c < k; ++c) {
        probs[names[size_t(c)]] = prob[c].item<double>();
        cells.emplace_back("p_" + names[size_t(c)], num(prob[c].item<double>()));
      }
      j["probabilities"] = probs;
    }
  } else if (task == "multilabel") {
    const auto score = torch::sigmoid(out.to(torch::kDouble));
    std::string labels;
    nlohmann::json on = nlohmann::json::array(), scores = nlohmann::json::object();
    for (int64_t c = 0; c < score.size(0); ++c) {
      const double s = score[c].item<double>();
      if (s >= p.cfg.task.threshold) {
        labels += (labels.empty() ? "" : ";") + names[size_t(c)];
        on.push_back(names[size_t(c)]);
      }
      scores[names[size_t(c)]] = s;
    }
    cells.emplace_back("labels", labels);
    for (int64_t c = 0; c < score.size(0); ++c)
      cells.emplace_back("score_" + names[size_t(c)], num(score[c].item<double>()));
    j["labels"] = on;
    j["scores"] = scores;
  } else {  // regression: the values, one column per target element
    const auto v = out.reshape({-1}).to(torch::kDouble);
    if (v.size(0) == 1) {
      cells.emplace_back("prediction", num(v[0].item<double>()));
      j["prediction"] = v[0].item<double>();
    } else {
      nlohmann::json a = nlohmann::json::array();
      for (int64_t i = 0; i < v.size(0); ++i) {
        cells.emplace_back("prediction_" + std::to_string(i), num(v[i].item<double>()));
        a.push_back(v[i].item<double>());
      }
      j["prediction"] = a;
    }
  }
  w.row(cells, j);
}

// Samples of one input file or folder through the model, rows in input order.
int64_t predict_inputs(train::Pipeline& p, const PredictOptions& o, const std::string& path,
                       RowWriter& w) {
  const data::OpenedData trained{p.splits.train, p.splits.test, p.splits.class_names, p.splits.csv};
  const data::Inputs in = data::open_inputs(p.cfg, trained, path);
  data::Loader loader(in.data, p.eval_options);
  int64_t next = 0;
  std::vector<std::string> names;
  p.trainer->predict(loader, [&](const torch::Tensor& out) {
    if (names.empty()) names = class_names(p, out.dim() > 1 ? out.size(1) : 1);
    for (int64_t i = 0; i < out.size(0); ++i, ++next)
      write_sample(w, p, o, names, in.ids[size_t(next)], out[i]);
  });
  return next;
}

// A language model's input: a token file (.bin/.npy), or text when the run's tokens are bytes.
std::vector<int64_t> lm_tokens(const train::Pipeline& p, const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw DataError(path, "is not a file", "give a token file (.bin, .npy) or a text file");
  const std::string ext = fs::path(path).extension().string();
  std::vector<int64_t> ids;
  if (ext == ".bin" || ext == ".npy") {
    ids = data::read_token_stream(path);
  } else {
    if (!data::byte_tokens(p.splits.train.source))
      throw DataError(path,
                      "is text, but the run's tokens (" + p.splits.train.source +
                          ") did not come from `mltrain data tokenize --bytes`",
                      "tokenize it with the run's tokenizer and pass the token file");
    for (const unsigned char c : read_file(path)) ids.push_back(c);
  }
  const int64_t vocab = p.splits.train.num_classes;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw DataError(path,
                      "token " + std::to_string(ids[i]) + " at offset " + std::to_string(i) +
                          " is outside the model's vocabulary [0, " + std::to_string(vocab) + ")",
                      "tokenize with the run's tokenizer");
  if (ids.empty()) throw DataError(path, "is empty", "give at least one token");
  return ids;
}

std::string token_text(const train::Pipeline& p, int64_t t) {
  if (!data::byte_tokens(p.splits.train.source)) return std::to_string(t);
  return std::string(1, static_cast<char>(t));
}

// Next-token log-probabilities after the input and, with --generate N, N sampled tokens.
void predict_lm(train::Pipeline& p, const PredictOptions& o, const std::string& path,
                RowWriter& w) {
  if (w.csv())
    throw ConfigError("-o", "a language model's predictions are JSON lines",
                      "write to a .jsonl file or to stdout");
  std::vector<int64_t> ids = lm_tokens(p, path);
  const int64_t block = p.cfg.model.block_size;
  const bool bytes = data::byte_tokens(p.splits.train.source);
  torch::manual_seed(o.seed);
  nlohmann::json j = {{"id", path}, {"context_tokens", std::min<int64_t>(block, ids.size())}};
  std::vector<int64_t> generated;
  p.trainer->with_eval_weights([&](model::Model& m) {
    auto next_logits = [&] {
      const int64_t n = std::min<int64_t>(block, ids.size());
      auto x = torch::tensor(std::vector<int64_t>(ids.end() - n, ids.end()), torch::kLong)
                   .unsqueeze(0)
                   .to(p.device);
      return m.forward(x).select(0, 0).select(0, n - 1).to(torch::kCPU, torch::kFloat);
    };
    const auto logp = torch::log_softmax(next_logits().to(torch::kDouble), 0);
    const auto [v, idx] = logp.topk(std::min<int64_t>(o.top_k > 0 ? o.top_k : 5, logp.size(0)));
    nlohmann::json top = nlohmann::json::array();
    for (int64_t i = 0; i < v.size(0); ++i) {
      nlohmann::json e = {{"token", idx[i].item<int64_t>()}, {"logprob", v[i].item<double>()}};
      if (bytes) e["text"] = token_text(p, idx[i].item<int64_t>());
      top.push_back(e);
    }
    j["next_token"] = top;
    for (int64_t g = 0; g < o.generate; ++g) {
      auto logits = next_logits();
      int64_t t;
      if (o.temperature <= 0) {
        t = logits.argmax().item<int64_t>();
      } else {
        logits = logits / o.temperature;
        if (o.sample_top_k > 0 && o.sample_top_k < logits.size(0)) {
          const auto kth = std::get<0>(logits.topk(o.sample_top_k)).min();
          logits = logits.masked_fill(logits < kth, -INFINITY);
        }
        t = torch::multinomial(torch::softmax(logits, 0), 1).item<int64_t>();
      }
      ids.push_back(t);
      generated.push_back(t);
    }
  });
  if (o.generate > 0) {
    j["generated_tokens"] = generated;
    if (bytes) {
      std::string text;
      for (const int64_t t : generated) text += static_cast<char>(t);
      j["generated"] = text;  // bytes off a UTF-8 boundary are replaced when written
    }
  }
  w.os() << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

}  // namespace

EvaluateReport evaluate_run(const EvaluateOptions& o) {
  const auto t0 = Clock::now();
  train::RestoredRun r = restore(o, "evaluate");
  train::Pipeline& p = *r.pipeline;
  const data::Dataset* ds = &p.splits.test;
  if (o.split == "train") {
    ds = &p.splits.train;
  } else if (o.split == "val") {
    if (p.splits.eval_name != "val")
      throw ConfigError("--split", "the run holds out no validation split",
                        "evaluate --split test, or set data.val_fraction / data.folds");
    ds = &p.splits.eval;
  }
  data::Loader loader(*ds, p.eval_options);
  const train::EvalResult e = p.trainer->evaluate(loader);
  EvaluateReport rep;
  rep.run = r.run_dir.string();
  rep.checkpoint = r.checkpoint.string();
  rep.split = o.split;
  rep.task = p.cfg.task.name;
  rep.weights = weights_text(o, p);
  rep.step = r.step;
  rep.samples = e.count;
  rep.metrics = e.metrics;
  rep.seconds = seconds_since(t0);
  const std::string out =
      o.out.empty() ? (r.run_dir / ("evaluation_" + o.split + ".json")).string() : o.out;
  write_file_atomic(out, rep.to_json().dump(2) + "\n");
  spdlog::info("[evaluate] wrote {}", out);
  return rep;
}

nlohmann::json EvaluateReport::to_json() const {
  return {
      {"run", run},        {"checkpoint", checkpoint}, {"step", step},       {"split", split},
      {"task", task},      {"weights", weights},       {"samples", samples}, {"metrics", metrics},
      {"seconds", seconds}};
}

std::string EvaluateReport::to_text() const {
  std::string t = run + ": " + split + " split, " + std::to_string(samples) + " samples, " +
                  weights + " weights of step " + std::to_string(step) + "\n";
  for (const auto& [k, v] : metrics) t += "  " + k + " " + num(v) + "\n";
  return t;
}

PredictReport predict_run(const PredictOptions& o) {
  const auto t0 = Clock::now();
  if (o.inputs.empty())
    throw ConfigError("predict", "no inputs",
                      "give image files or folders, a .csv, arrays or text");
  train::RestoredRun r = restore(o, "predict");
  train::Pipeline& p = *r.pipeline;
  if (p.cfg.task.name == "custom")
    throw ConfigError("task.name", "a custom task's model returns its loss, not predictions",
                      "export it (mltrain fuse) and call it directly");
  RowWriter w(o.out);
  PredictReport rep;
  for (const std::string& in : o.inputs) {
    if (p.cfg.task.name == "language_model") {
      predict_lm(p, o, in, w);
      ++rep.samples;
    } else {
      rep.samples += predict_inputs(p, o, in, w);
    }
  }
  w.finish();
  rep.out = o.out.empty() ? "-" : o.out;
  rep.seconds = seconds_since(t0);
  spdlog::info("[predict] {} predictions in {:.2f} s{}", rep.samples, rep.seconds,
               rep.out == "-" ? "" : " -> " + rep.out);
  return rep;
}

}  // namespace mltrain::deploy
