#include "mltrain/task/task.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/runtime/runtime.hpp"

namespace mltrain::task {

namespace F = torch::nn::functional;

namespace {

torch::Tensor forward_fp32(model::Model& m, const torch::Tensor& x, const Amp& amp) {
  torch::Tensor out;
  {
    compat::AutocastGuard guard(amp.enabled, amp.dtype, amp.cuda);
    out = m.forward(x);
  }
  return out.to(torch::kFloat32);
}

std::string sizes_text(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
  return s + "]";
}

// Row r's index of its first largest element, as argmax gives it (NaN is the largest, its first
// occurrence wins), for `cols` floats: the largest in 16 lanes (x > m ? x : m is one max
// instruction), then a scan for its first occurrence, which stays in cache.
__attribute__((target_clones("avx512f", "avx2", "default"))) int64_t first_argmax(const float* x,
                                                                                  int64_t cols) {
  float lane[16];
  std::fill(lane, lane + 16, -std::numeric_limits<float>::infinity());
  bool nan = false;
  int64_t i = 0;
  for (; i + 16 <= cols; i += 16)
    for (int j = 0; j < 16; ++j) {
      lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
      nan |= x[i + j] != x[i + j];
    }
  float m = -std::numeric_limits<float>::infinity();
  for (; i < cols; ++i) {
    m = x[i] > m ? x[i] : m;
    nan |= x[i] != x[i];
  }
  for (const float v : lane) m = v > m ? v : m;
  for (i = 0; i < cols; ++i)
    if (nan ? x[i] != x[i] : x[i] == m) return i;
  return 0;
}

// Sums of every rank, in place (one process: unchanged).
void sum_over_ranks(const Reduce& r, std::vector<torch::Tensor>& t) {
  if (r.sum && r.world > 1) r.sum(t);
}

// Rows of every rank stacked in rank order (exact: each rank adds its rows into zeros).
torch::Tensor gather_rows(const Reduce& r, const torch::Tensor& local) {
  if (!r.sum || r.world <= 1) return local;
  std::vector<torch::Tensor> counts = {torch::zeros({r.world}, torch::kDouble)};
  counts[0][r.rank] = static_cast<double>(local.size(0));
  r.sum(counts);
  const auto c = counts[0].to(torch::kLong);
  const int64_t total = c.sum().item<int64_t>();
  const int64_t offset = c.narrow(0, 0, r.rank).sum().item<int64_t>();
  std::vector<int64_t> shape = local.sizes().vec();
  shape[0] = total;
  std::vector<torch::Tensor> all = {torch::zeros(shape, local.options())};
  all[0].narrow(0, offset, local.size(0)).copy_(local);
  r.sum(all);
  return all[0];
}

// ---- classification ----
class Classification : public Task {
 public:
  explicit Classification(int64_t top_k, int64_t classes)
      : top_k_(top_k > 1 && top_k < classes ? top_k : 0) {}
  const char* name() const override { return "classification"; }
  Step forward(model::Model& m, const data::Batch& b, double smoothing,
               const Amp& amp) const override {
    Step s;
    s.output = forward_fp32(m, b.x, amp);
    const auto opts = F::CrossEntropyFuncOptions().label_smoothing(smoothing);
    s.loss = F::cross_entropy(s.output, b.y, opts);
    if (b.y2.defined())  // mixup/cutmix: the same mix of the two label sets
      s.loss = s.loss * b.lam + F::cross_entropy(s.output, b.y2, opts) * (1 - b.lam);
    s.correct = argmax_rows(s.output.detach()).eq(b.y).sum();
    s.units = b.y.size(0);
    return s;
  }
  std::unique_ptr<Accumulator> accumulator() const override;
  int64_t top_k() const { return top_k_; }

 private:
  int64_t top_k_;
};

class ClassificationMetrics : public Accumulator {
 public:
  explicit ClassificationMetrics(int64_t top_k) : top_k_(top_k) {}
  void add(const Step& s, const data::Batch& b) override {
    loss_ += F::cross_entropy(s.output, b.y, F::CrossEntropyFuncOptions().reduction(torch::kSum))
                 .item<double>();
    correct_ += s.correct.item<double>();
    if (top_k_ > 0)
      top_ +=
          std::get<1>(s.output.topk(top_k_, 1)).eq(b.y.unsqueeze(1)).any(1).sum().item<double>();
    count_ += static_cast<double>(b.y.size(0));
    if (s.output.dim() == 2 && s.output.size(1) == 2) {  // two classes: ROC AUC of class 1
      // logit_1 - logit_0 orders the samples as the softmax probability of class 1 does
      const auto o = s.output.detach().to(torch::kCPU, torch::kDouble);
      scores_.push_back((o.select(1, 1) - o.select(1, 0)).contiguous());
      labels_.push_back(b.y.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true));
    }
  }
  Metrics compute(const Reduce& r) override {
    std::vector<torch::Tensor> t = {torch::tensor({loss_, correct_, top_, count_}, torch::kDouble)};
    sum_over_ranks(r, t);
    const auto v = t[0];
    const double n = std::max(1.0, v[3].item<double>());
    Metrics m = {{"loss", v[0].item<double>() / n}, {"accuracy", v[1].item<double>() / n}};
    if (top_k_ > 0) m["top" + std::to_string(top_k_) + "_accuracy"] = v[2].item<double>() / n;
    if (!scores_.empty())
      m["roc_auc"] =
          roc_auc(gather_rows(r, torch::cat(scores_)), gather_rows(r, torch::cat(labels_)));
    return m;
  }

 private:
  int64_t top_k_;
  double loss_ = 0, correct_ = 0, top_ = 0, count_ = 0;
  std::vector<torch::Tensor> scores_, labels_;  // two classes only
};

std::unique_ptr<Accumulator> Classification::accumulator() const {
  return std::make_unique<ClassificationMetrics>(top_k_);
}

// ---- regression ----
class Regression : public Task {
 public:
  explicit Regression(const config::TaskConfig& c) : loss_(c.loss), delta_(c.huber_delta) {}
  const char* name() const override { return "regression"; }
  Step forward(model::Model& m, const data::Batch& b, double, const Amp& amp) const override {
    Step s;
    auto out = forward_fp32(m, b.x, amp);
    if (out.numel() != b.y.numel())
      throw ConfigError("task.name",
                        "regression: the model returns " + sizes_text(out) +
                            " for targets of shape " + sizes_text(b.y),
                        "give the model one output per target element");
    s.output = out.reshape(b.y.sizes());
    if (loss_ == "l1")
      s.loss = F::l1_loss(s.output, b.y);
    else if (loss_ == "huber")
      s.loss = torch::huber_loss(s.output, b.y, at::Reduction::Mean, delta_);
    else
      s.loss = F::mse_loss(s.output, b.y);
    s.units = b.y.size(0);
    return s;
  }
  std::unique_ptr<Accumulator> accumulator() const override;

 private:
  std::string loss_;
  double delta_;
};

class RegressionMetrics : public Accumulator {
 public:
  void add(const Step& s, const data::Batch& b) override {
    const int64_t n = b.y.size(0);
    auto part = regression_sums(s.output.reshape({n, -1}), b.y.reshape({n, -1}));
    if (!sums_.n.defined()) {
      sums_ = part;
    } else {
      sums_.n += part.n, sums_.sum_y += part.sum_y, sums_.sum_y2 += part.sum_y2;
      sums_.sse += part.sse, sums_.sae += part.sae;
    }
    loss_ += s.loss.item<double>() * static_cast<double>(n);
    count_ += static_cast<double>(n);
  }
  Metrics compute(const Reduce& r) override {
    if (!sums_.n.defined()) return {{"loss", 0}};
    std::vector<torch::Tensor> t = {sums_.n,   sums_.sum_y, sums_.sum_y2,
                                    sums_.sse, sums_.sae,   torch::tensor({loss_, count_})};
    sum_over_ranks(r, t);
    Metrics m = regression_metrics({t[0], t[1], t[2], t[3], t[4]});
    m["loss"] = t[5][0].item<double>() / std::max(1.0, t[5][1].item<double>());
    return m;
  }

 private:
  RegressionSums sums_;
  double loss_ = 0, count_ = 0;
};

std::unique_ptr<Accumulator> Regression::accumulator() const {
  return std::make_unique<RegressionMetrics>();
}

// ---- multilabel ----
class Multilabel : public Task {
 public:
  explicit Multilabel(const config::TaskConfig& c) : threshold_(c.threshold) {
    if (!c.pos_weight.empty())
      pos_weight_ = torch::tensor(std::vector<double>(c.pos_weight), torch::kFloat32);
  }
  const char* name() const override { return "multilabel"; }
  Step forward(model::Model& m, const data::Batch& b, double, const Amp& amp) const override {
    Step s;
    s.output = forward_fp32(m, b.x, amp);
    if (s.output.sizes() != b.y.sizes())
      throw ConfigError("task.name",
                        "multilabel: the model returns " + sizes_text(s.output) + " for labels " +
                            sizes_text(b.y),
                        "the model needs one logit per class (data.num_classes)");
    auto opts = F::BinaryCrossEntropyWithLogitsFuncOptions();
    if (pos_weight_.defined()) opts.pos_weight(pos_weight_.to(s.output.device()));
    s.loss = F::binary_cross_entropy_with_logits(s.output, b.y, opts);
    s.units = b.y.size(0);
    return s;
  }
  std::unique_ptr<Accumulator> accumulator() const override;

 private:
  double threshold_;
  torch::Tensor pos_weight_;
};

class MultilabelMetrics : public Accumulator {
 public:
  explicit MultilabelMetrics(double threshold) : threshold_(threshold) {}
  void add(const Step& s, const data::Batch& b) override {
    // Copies: the batch's tensors live in a loader slot that the next batch overwrites.
    logits_.push_back(s.output.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true));
    labels_.push_back(b.y.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true));
    loss_ += s.loss.item<double>() * static_cast<double>(b.y.size(0));
    count_ += static_cast<double>(b.y.size(0));
  }
  Metrics compute(const Reduce& r) override {
    if (logits_.empty()) return {{"loss", 0}};
    const auto logits = gather_rows(r, torch::cat(logits_));
    const auto labels = gather_rows(r, torch::cat(labels_));
    std::vector<torch::Tensor> t = {torch::tensor({loss_, count_}, torch::kDouble)};
    sum_over_ranks(r, t);
    Metrics m = {{"loss", t[0][0].item<double>() / std::max(1.0, t[0][1].item<double>())}};
    double auc_sum = 0;
    int64_t defined = 0;
    for (int64_t k = 0; k < logits.size(1); ++k) {
      const double auc = roc_auc(logits.select(1, k), labels.select(1, k));
      m["roc_auc_class" + std::to_string(k)] = auc;
      if (std::isfinite(auc)) auc_sum += auc, ++defined;
    }
    m["roc_auc_macro"] = defined ? auc_sum / static_cast<double>(defined) : NAN;
    const F1 f1 = f1_scores(torch::sigmoid(logits.to(torch::kDouble)).ge(threshold_), labels);
    m["f1_micro"] = f1.micro;
    m["f1_macro"] = f1.macro;
    return m;
  }

 private:
  double threshold_;
  std::vector<torch::Tensor> logits_, labels_;
  double loss_ = 0, count_ = 0;
};

std::unique_ptr<Accumulator> Multilabel::accumulator() const {
  return std::make_unique<MultilabelMetrics>(threshold_);
}

// ---- language model: next-token cross-entropy over [B, T] token windows ----
class LanguageModel : public Task {
 public:
  explicit LanguageModel(int64_t ignore_index) : ignore_(ignore_index) {}
  const char* name() const override { return "language_model"; }
  Step forward(model::Model& m, const data::Batch& b, double, const Amp& amp) const override {
    Step s;
    s.output = forward_fp32(m, b.x, amp);
    if (s.output.dim() != 3 || s.output.size(0) != b.y.size(0) || s.output.size(1) != b.y.size(1))
      throw ConfigError("task.name",
                        "language_model: the model returns " + sizes_text(s.output) +
                            " for targets " + sizes_text(b.y) + "; it must return [B, T, vocab]",
                        "use model.name=gpt, or a TorchScript model returning logits per position");
    const int64_t v = s.output.size(2);
    const auto flat_y = b.y.reshape({-1});
    s.loss = F::cross_entropy(s.output.reshape({-1, v}), flat_y,
                              F::CrossEntropyFuncOptions().ignore_index(ignore_));
    const auto valid = flat_y.ne(ignore_);
    s.correct = argmax_rows(s.output.detach().reshape({-1, v})).eq(flat_y).logical_and(valid).sum();
    s.units = valid.sum().item<int64_t>();
    return s;
  }
  std::unique_ptr<Accumulator> accumulator() const override;

 private:
  int64_t ignore_;
};

class LanguageModelMetrics : public Accumulator {
 public:
  void add(const Step& s, const data::Batch&) override {
    loss_ += s.loss.item<double>() * static_cast<double>(s.units);
    correct_ += s.correct.item<double>();
    tokens_ += static_cast<double>(s.units);
  }
  Metrics compute(const Reduce& r) override {
    std::vector<torch::Tensor> t = {torch::tensor({loss_, correct_, tokens_}, torch::kDouble)};
    sum_over_ranks(r, t);
    const double n = std::max(1.0, t[0][2].item<double>());
    const double loss = t[0][0].item<double>() / n;
    return {{"loss", loss},
            {"accuracy", t[0][1].item<double>() / n},
            {"perplexity", std::exp(loss)},
            {"bits_per_token", loss / std::log(2.0)}};
  }

 private:
  double loss_ = 0, correct_ = 0, tokens_ = 0;
};

std::unique_ptr<Accumulator> LanguageModel::accumulator() const {
  return std::make_unique<LanguageModelMetrics>();
}

// ---- custom: the model computes its own loss ----
double scalar_of(const c10::IValue& v, const std::string& key, const std::string& model) {
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().item<double>();
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  throw ConfigError("model.path",
                    model + ": forward's '" + key +
                        "' is not a scalar (tensor of one element, "
                        "float or int)",
                    "return only scalar metrics next to 'loss'");
}

class Custom : public Task {
 public:
  explicit Custom(std::string path) : path_(std::move(path)) {}
  const char* name() const override { return "custom"; }
  Step forward(model::Model& m, const data::Batch& b, double, const Amp& amp) const override {
    c10::IValue r;
    {
      compat::AutocastGuard guard(amp.enabled, amp.dtype, amp.cuda);
      r = m.forward_with_targets(b.x, b.y);
    }
    Step s;
    s.units = b.x.size(0);
    if (r.isTensor()) {
      s.loss = r.toTensor();
    } else if (r.isGenericDict()) {
      for (const auto& e : r.toGenericDict()) {
        if (!e.key().isString()) continue;
        const std::string key = e.key().toStringRef();
        if (key == "loss" && e.value().isTensor())
          s.loss = e.value().toTensor();
        else
          s.extra[key] = scalar_of(e.value(), key, path_);
      }
    }
    if (!s.loss.defined() || s.loss.numel() != 1)
      throw ConfigError("model.path",
                        path_ +
                            ": forward(inputs, targets) returned no scalar loss (a tensor, or a "
                            "dict with a 'loss' tensor of one element)",
                        "return the mean loss, or {'loss': loss, 'name': metric, ...}");
    s.loss = s.loss.reshape({}).to(torch::kFloat32);
    return s;
  }
  std::unique_ptr<Accumulator> accumulator() const override;

 private:
  std::string path_;
};

class CustomMetrics : public Accumulator {
 public:
  void add(const Step& s, const data::Batch&) override {
    const double n = static_cast<double>(s.units);
    sums_["loss"] += s.loss.item<double>() * n;
    for (const auto& [k, v] : s.extra) sums_[k] += v * n;
    count_ += n;
  }
  Metrics compute(const Reduce& r) override {
    std::vector<double> flat = {count_};
    for (const auto& [k, v] : sums_) flat.push_back(v);
    std::vector<torch::Tensor> t = {torch::tensor(flat, torch::kDouble)};
    sum_over_ranks(r, t);
    const double n = std::max(1.0, t[0][0].item<double>());
    Metrics m;
    int64_t i = 1;
    for (const auto& [k, v] : sums_) m[k] = t[0][i++].item<double>() / n;
    return m;
  }

 private:
  std::map<std::string, double> sums_;
  double count_ = 0;
};

std::unique_ptr<Accumulator> Custom::accumulator() const {
  return std::make_unique<CustomMetrics>();
}

}  // namespace

// LibTorch's argmax reduces a row with a scalar loop (GPT-2's 256 x 50,257 logits: 11.4 ms, against
// 1.0 ms for their maxima).
torch::Tensor argmax_rows(const torch::Tensor& t) {
  if (!t.device().is_cpu() || t.scalar_type() != torch::kFloat || t.dim() != 2 || t.size(1) == 0)
    return t.argmax(1);
  const torch::Tensor c = t.contiguous();
  const int64_t rows = c.size(0), cols = c.size(1);
  torch::Tensor out = torch::empty({rows}, torch::kLong);
  const float* x = c.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  runtime::parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 16) / cols),
                        [&](int64_t begin, int64_t end) {
                          for (int64_t r = begin; r < end; ++r)
                            o[r] = first_argmax(x + r * cols, cols);
                        });
  return out;
}

std::unique_ptr<Task> make_task(const config::ExperimentConfig& cfg) {
  const auto& t = cfg.task;
  if (t.name == "regression") return std::make_unique<Regression>(t);
  if (t.name == "multilabel") return std::make_unique<Multilabel>(t);
  if (t.name == "language_model") return std::make_unique<LanguageModel>(t.ignore_index);
  if (t.name == "custom") return std::make_unique<Custom>(cfg.model.path);
  return std::make_unique<Classification>(t.top_k, cfg.data.num_classes);
}

data::TargetSpec target_spec(const config::ExperimentConfig& cfg) {
  data::TargetSpec s;
  s.num_classes = cfg.data.num_classes;
  const auto& t = cfg.task.name;
  s.kind = t == "regression"   ? data::TargetKind::kFloat
           : t == "multilabel" ? data::TargetKind::kMultiHot
           : t == "custom"     ? data::TargetKind::kAuto
                               : data::TargetKind::kClassId;
  return s;
}

int64_t model_outputs(const config::ExperimentConfig& cfg, const data::Dataset& train) {
  if (cfg.task.name == "regression") return std::max<int64_t>(1, train.target_elems());
  if (train.token_windows) return train.num_classes;  // the vocabulary
  return cfg.data.num_classes;
}

// ---- formulas ----

double roc_auc(const torch::Tensor& scores, const torch::Tensor& labels) {
  const auto s = scores.to(torch::kDouble).contiguous();
  const auto y = labels.to(torch::kDouble).contiguous();
  const int64_t n = s.numel();
  const double pos = y.sum().item<double>();
  const double neg = static_cast<double>(n) - pos;
  if (pos == 0 || neg == 0) return NAN;
  const auto order = s.argsort().contiguous();
  const double* sp = s.data_ptr<double>();
  const double* yp = y.data_ptr<double>();
  const int64_t* op = order.data_ptr<int64_t>();
  // Midranks: a run of tied scores shares the mean of the ranks it spans.
  double pos_rank_sum = 0;
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    while (j + 1 < n && sp[op[j + 1]] == sp[op[i]]) ++j;
    const double rank = 0.5 * static_cast<double>(i + j) + 1.0;
    for (int64_t k = i; k <= j; ++k) pos_rank_sum += yp[op[k]] * rank;
    i = j + 1;
  }
  return (pos_rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

F1 f1_scores(const torch::Tensor& predicted, const torch::Tensor& labels) {
  const auto p = predicted.to(torch::kDouble);
  const auto y = labels.to(torch::kDouble);
  const auto tp = (p * y).sum(0), fp = (p * (1 - y)).sum(0), fn = ((1 - p) * y).sum(0);
  F1 f;
  const double tps = tp.sum().item<double>(), fps = fp.sum().item<double>(),
               fns = fn.sum().item<double>();
  f.micro = tps > 0 ? 2 * tps / (2 * tps + fps + fns) : 0;
  for (int64_t k = 0; k < p.size(1); ++k) {
    const double a = tp[k].item<double>(), b = fp[k].item<double>(), c = fn[k].item<double>();
    f.per_class.push_back(a > 0 ? 2 * a / (2 * a + b + c) : 0);
    f.macro += f.per_class.back();
  }
  if (!f.per_class.empty()) f.macro /= static_cast<double>(f.per_class.size());
  return f;
}

RegressionSums regression_sums(const torch::Tensor& predicted, const torch::Tensor& target) {
  const auto p = predicted.detach().to(torch::kCPU, torch::kDouble);
  const auto y = target.detach().to(torch::kCPU, torch::kDouble);
  const auto d = p - y;
  return {torch::full({y.size(1)}, static_cast<double>(y.size(0)), torch::kDouble), y.sum(0),
          (y * y).sum(0), (d * d).sum(0), d.abs().sum(0)};
}

Metrics regression_metrics(const RegressionSums& s) {
  const auto n = s.n.clamp_min(1);
  const auto mae = (s.sae / n).mean().item<double>();
  const auto rmse = (s.sse / n).sqrt().mean().item<double>();
  const auto sst = s.sum_y2 - s.sum_y * s.sum_y / n;
  double r2 = 0;
  const int64_t outputs = s.n.size(0);
  for (int64_t j = 0; j < outputs; ++j) {
    const double tot = sst[j].item<double>(), err = s.sse[j].item<double>();
    // sklearn (force_finite): a constant target scores 1 when predicted exactly, else 0.
    // (A constant target's total can come out a rounding error above 0: compare it to its scale.)
    const bool constant = tot <= 1e-12 * std::max(1.0, s.sum_y2[j].item<double>());
    r2 += !constant ? 1 - err / tot : (err == 0 ? 1.0 : 0.0);
  }
  return {{"mae", mae},
          {"rmse", rmse},
          {"r2", r2 / static_cast<double>(std::max<int64_t>(1, outputs))}};
}

}  // namespace mltrain::task
