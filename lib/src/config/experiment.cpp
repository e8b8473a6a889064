#include "mltrain/config/experiment.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mltrain/config/reader.hpp"
#include "mltrain/config/writer.hpp"

namespace mltrain::config {

std::vector<std::string> task_metrics(const ExperimentConfig& c) {
  std::vector<std::string> m = {"train_loss", "eval_loss"};
  const auto& t = c.task;
  if (t.name == "classification") {
    m.push_back("eval_accuracy");
    if (t.top_k > 1 && t.top_k < c.data.num_classes)
      m.push_back("eval_top" + std::to_string(t.top_k) + "_accuracy");
    if (c.data.num_classes == 2) m.push_back("eval_roc_auc");  // of class 1
  } else if (t.name == "regression") {
    m.insert(m.end(), {"eval_mae", "eval_rmse", "eval_r2"});
  } else if (t.name == "multilabel") {
    m.insert(m.end(), {"eval_roc_auc_macro", "eval_f1_micro", "eval_f1_macro"});
    for (int64_t k = 0; k < c.data.num_classes; ++k)
      m.push_back("eval_roc_auc_class" + std::to_string(k));
  } else if (t.name == "language_model") {
    m.insert(m.end(), {"eval_accuracy", "eval_perplexity", "eval_bits_per_token"});
  }
  return m;
}

std::string metric_mode(const std::string& metric) {
  for (const char* up : {"accuracy", "r2", "roc_auc", "f1"})
    if (metric.find(up) != std::string::npos) return "max";
  return "min";
}

std::vector<std::string> recipe_notes(const ExperimentConfig& c) {
  std::vector<std::string> out;
  const auto& o = c.optim;
  // The field guide: Adam wants about 10x less weight decay than SGD. The values SGD recipes
  // use (1e-4 .. 1e-3) on an Adam-family optimizer look copied.
  if ((o.name == "adam" || o.name == "adamw") && o.weight_decay >= 1e-4 && o.weight_decay <= 1e-3) {
    std::ostringstream s;
    s << "optim.weight_decay " << o.weight_decay << " with " << o.name
      << " is a typical SGD value; the field guide advises about 10x smaller for Adam ("
      << o.weight_decay / 10 << ")"
      << (o.name == "adamw"
              ? ", but adamw's decay is decoupled and multiplied by the LR, so it is commonly "
                "set far larger (PyTorch's default 0.01): choose by a tune study, not by copying"
              : "; or use adamw, whose decay does not pass through Adam's scaling");
    out.push_back(s.str());
  }
  return out;
}

std::vector<double> sampler_class_weights(const ExperimentConfig& c) {
  const auto& s = c.data.sampler;
  if (s.name != "weighted") return {};
  if (!s.class_weights.empty()) return s.class_weights;
  std::vector<double> w(size_t(std::max<int64_t>(c.data.num_classes, 0)), 1.0);
  if (s.oversample.size() == 2 && s.oversample[0] >= 0 && size_t(s.oversample[0]) < w.size())
    w[size_t(s.oversample[0])] = s.oversample[1];
  return w;
}

static void curriculum_checks(const ExperimentConfig& c, Issues& issues, const std::string& file) {
  const auto& a = c.data.augment;
  if (a.curriculum == "none") return;
  const std::pair<const char*, const AugOpConfig*> phased[] = {
      {"crop", &a.crop},           {"flip", &a.flip},   {"rotate", &a.rotate}, {"color", &a.color},
      {"grayscale", &a.grayscale}, {"mixup", &a.mixup}, {"cutmix", &a.cutmix}};
  for (const auto& [name, op] : phased)
    if (op->window != std::vector<double>{0.0, 1.0})
      issues.add(file, std::string("data.augment.") + name + ".window",
                 "data.augment.curriculum sets this window: leave it at [0, 1], or set "
                 "data.augment.curriculum=none");
}

static void sampler_checks(const ExperimentConfig& c, Issues& issues, const std::string& file) {
  const auto& s = c.data.sampler;
  auto need = [&](bool ok, const std::string& key, const std::string& msg) {
    if (!ok) issues.add(file, key, msg);
  };
  if (s.name != "weighted") {
    need(s.class_weights.empty() && s.oversample.empty(), "data.sampler.name",
         "class_weights and oversample are for the weighted sampler: set "
         "data.sampler.name=weighted");
    return;
  }
  const int64_t k = c.data.num_classes;
  need(c.task.name == "classification", "data.sampler.name",
       "the weighted sampler draws by class label: it is for task classification");
  need(s.class_weights.empty() != s.oversample.empty(), "data.sampler.class_weights",
       "give either class_weights (one per class) or oversample: [class, k], not both or neither");
  if (!s.class_weights.empty()) {
    need(int64_t(s.class_weights.size()) == k, "data.sampler.class_weights",
         std::to_string(s.class_weights.size()) + " weights for " + std::to_string(k) +
             " classes (data.num_classes): give one per class");
    double sum = 0;
    bool negative = false;
    for (double w : s.class_weights) sum += w, negative |= !(w >= 0) || !std::isfinite(w);
    need(!negative, "data.sampler.class_weights", "every weight must be a finite number >= 0");
    need(negative || sum > 0, "data.sampler.class_weights",
         "the weights sum to zero: no sample could be drawn; give some class a weight > 0");
  }
  if (!s.oversample.empty()) {
    const bool shape = s.oversample.size() == 2;
    need(shape, "data.sampler.oversample", "write [class, k], e.g. [1, 3]");
    if (shape) {
      const double cls = s.oversample[0];
      need(cls >= 0 && cls < double(k) && cls == std::floor(cls), "data.sampler.oversample",
           "class " + (std::ostringstream() << cls).str() + " does not exist: classes are 0.." +
               std::to_string(k - 1) + " (data.num_classes " + std::to_string(k) + ")");
      need(s.oversample[1] > 0 && std::isfinite(s.oversample[1]), "data.sampler.oversample",
           "k must be > 0 (k > 1 draws the class more often, k < 1 less)");
    }
  }
}

std::string checkpoint_monitor(const ExperimentConfig& c) {
  if (c.checkpoint.monitor != "auto") return c.checkpoint.monitor;
  return c.task.name == "classification" ? "eval_accuracy" : "eval_loss";
}

std::string checkpoint_mode(const ExperimentConfig& c) {
  return c.checkpoint.mode != "auto" ? c.checkpoint.mode : metric_mode(checkpoint_monitor(c));
}

// A monitored metric must be one the task reports (custom tasks: any eval_ name, checked against
// the model's dict at the first evaluation).
static void check_metric(const ExperimentConfig& c, Issues& issues, const std::string& file,
                         const std::string& path, const std::string& name, bool train_ok) {
  const auto known = task_metrics(c);
  if (c.task.name == "custom" && name.rfind("eval_", 0) == 0) return;
  if (std::find(known.begin(), known.end(), name) != known.end() &&
      (train_ok || name != "train_loss"))
    return;
  std::string list;
  for (const auto& k : known)
    if (train_ok || k != "train_loss") list += (list.empty() ? "" : ", ") + k;
  issues.add(file, path,
             "'" + name + "' is not a metric of task " + c.task.name + "; it reports: " + list);
}

static void task_checks(const ExperimentConfig& c, Issues& issues, const std::string& file) {
  auto need = [&](bool ok, const std::string& path, const std::string& msg) {
    if (!ok) issues.add(file, path, msg);
  };
  const std::string& task = c.task.name;
  check_metric(c, issues, file, "schedule.monitor", c.schedule.monitor, false);
  check_metric(c, issues, file, "label_smoothing.schedule.monitor",
               c.label_smoothing.schedule.monitor, false);
  if (c.checkpoint.monitor != "auto")
    check_metric(c, issues, file, "checkpoint.monitor", c.checkpoint.monitor, false);
  for (size_t i = 0; i < c.early_stopping.metrics.size(); ++i)
    check_metric(c, issues, file, "early_stopping.metrics[" + std::to_string(i) + "].monitor",
                 c.early_stopping.metrics[i].monitor, true);
  need(c.task.pos_weight.empty() ||
           static_cast<int64_t>(c.task.pos_weight.size()) == c.data.num_classes,
       "task.pos_weight", "give one weight per class (data.num_classes) or none");
  for (size_t i = 0; i < c.task.pos_weight.size(); ++i)
    need(c.task.pos_weight[i] >= 0, "task.pos_weight",
         "entry " + std::to_string(i) + " is negative: weights must be >= 0");
  const bool tokens = c.data.dataset == "tokens";
  if (task == "language_model")
    need(tokens, "data.dataset",
         "task language_model reads token streams: set data.dataset=tokens");
  else if (task != "custom")
    need(!tokens, "data.dataset",
         "token streams are for task language_model (or custom): set task.name=language_model");
  need(task == "classification" || task == "custom" || task == "language_model" ||
           c.data.dataset == "files",
       "data.dataset",
       "fashion_mnist holds class labels only; task " + task +
           " needs data.dataset=files with its own targets files");
  need(c.model.name != "gpt" || task == "language_model", "model.name",
       "gpt predicts the next token: use it with task.name=language_model");
  need(c.optim.momentum_reference_batch == 0 || c.optim.name == "sgd",
       "optim.momentum_reference_batch",
       "momentum compensation rescales SGD's momentum: set optim.name=sgd, or set it to 0");
  need(c.optim.momentum_reference_batch == 0 || !c.data.batch_size.is_auto(),
       "optim.momentum_reference_batch",
       "needs a fixed data.batch_size (auto changes the batch during the run)");
  need(c.model.name == "gpt" || c.model.embedding_noise == 0, "model.embedding_noise",
       "model " + c.model.name + " has no token embeddings: set it to 0, or use model.name=gpt");
  need(c.model.share == "none" || (c.model.name == "gpt" && c.model.n_layer >= 2), "model.share",
       c.model.name == "gpt"
           ? "a gpt with n_layer 1 has no repeated blocks to share weights across: set "
             "model.n_layer >= 2, or model.share=none"
           : "gated weight sharing is built for gpt's repeated transformer blocks; model " +
                 c.model.name + " has none: set model.share=none, or use model.name=gpt");
  need(c.model.name != "gpt" || c.model.n_embd % c.model.n_head == 0, "model.n_head",
       "must divide model.n_embd (" + std::to_string(c.model.n_embd) + ")");
  for (size_t i = 0; i < c.model.init_prefix_map.size(); ++i)
    need(c.model.init_prefix_map[i].find('=') != std::string::npos, "model.init_prefix_map",
         "entry " + std::to_string(i) + " '" + c.model.init_prefix_map[i] +
             "' is not 'from=to' (e.g. 'module.=')");
  const auto& a = c.data.augment;
  need(task == "classification" || (a.mixup.p == 0 && a.cutmix.p == 0), "data.augment.mixup",
       "mixup and cutmix mix class labels: they are for task classification only");
  need(task == "classification" || c.label_smoothing.value == 0, "label_smoothing.value",
       "label smoothing applies to class labels: set it to 0 for task " + task);
  need(task == "classification" || c.train.target_accuracy == 0, "train.target_accuracy",
       "time-to-accuracy needs classification accuracy: set it to 0 for task " + task);
  need(task != "custom" || c.model.name == "torchscript", "model.name",
       "task custom calls forward(inputs, targets) of a TorchScript model: set model.name to "
       "torchscript and model.path");
}

// distributed.pipeline: what the stages can split, and the techniques that need the whole model's
// gradients on one rank (or a per-rank state the stages would not agree on).
static void pipeline_checks(const ExperimentConfig& c, Issues& issues, const std::string& file) {
  const auto& pp = c.distributed.pipeline;
  if (pp.stages <= 1) return;
  auto need = [&](bool ok, const std::string& path, const std::string& msg) {
    if (!ok) issues.add(file, path, msg);
  };
  const std::string why = " with distributed.pipeline.stages > 1";
  need(c.model.name == "mlp" || c.model.name == "resnet" || c.model.name == "gpt", "model.name",
       c.model.name +
           " cannot be cut into pipeline stages (mlp, resnet and gpt can): set "
           "model.name=mlp, resnet or gpt, or distributed.pipeline.stages=1");
  need(c.task.name != "custom", "task.name",
       "custom models compute their own loss" + why + ": set distributed.pipeline.stages=1");
  need(c.data.batch_size.is_auto() || pp.microbatches.is_auto() ||
           pp.microbatches <= c.data.batch_size,
       "distributed.pipeline.microbatches",
       std::to_string(pp.microbatches) + " micro-batches of a batch of " +
           std::to_string(int64_t(c.data.batch_size)) +
           " samples: lower it to at most data.batch_size");
  need(!c.data.batch_size.is_auto(), "data.batch_size",
       "auto is not supported" + why + ": give a number (the stages split it into micro-batches)");
  need(c.memory.checkpoint == "none", "memory.checkpoint",
       "not supported" + why +
           ": set memory.checkpoint=none (more micro-batches also lower "
           "each stage's activation memory)");
  need(c.memory.micro_batch.is_auto(), "memory.micro_batch",
       "the pipeline's micro-batches replace it" + why +
           ": remove memory.micro_batch and set distributed.pipeline.microbatches");
  need(!c.ema.enabled, "ema.enabled", "not supported" + why + ": set ema.enabled=false");
  need(c.optim.name != "onebit_adam", "optim.name",
       "1-bit Adam exchanges every parameter's momentum" + why + ": use adam or adamw");
  need(!(c.amp.enabled && c.amp.dtype == "fp16"), "amp.dtype",
       "fp16 loss scaling is not supported" + why + ": use amp.dtype=bf16");
}

// distributed.invariance: bitwise fixes every input of the arithmetic; settings whose result would
// still depend on the world, or that cannot be made to, are refused with their fix.
static void invariance_checks(const ExperimentConfig& c, Issues& issues, const std::string& file) {
  const auto& d = c.distributed;
  if (d.invariance != "bitwise") return;
  auto need = [&](bool ok, const std::string& path, const std::string& msg) {
    if (!ok) issues.add(file, path, msg);
  };
  const std::string why = " under distributed.invariance=bitwise";
  const int64_t v = d.virtual_shards;
  need(c.train.global_batch > 0 && c.train.global_batch % v == 0, "train.global_batch",
       std::to_string(c.train.global_batch) + " is not a positive multiple of " +
           "distributed.virtual_shards " + std::to_string(v) + why +
           ": set it to the samples per optimizer step, e.g. " + std::to_string(v * 10));
  need(c.data.batch_size.is_auto(), "data.batch_size",
       "is train.global_batch / world" + why + ": set data.batch_size=auto");
  need(c.train.accumulate.is_auto() || c.train.accumulate.value == 1, "train.accumulate",
       "the virtual shards are the micro-batches" + why + ": set train.accumulate=auto");
  need(c.memory.micro_batch.is_auto(), "memory.micro_batch",
       "the virtual shards are the micro-batches" + why +
           ": remove it (raise distributed.virtual_shards for smaller ones)");
  need(c.train.lr_scaling == "none", "train.lr_scaling",
       "would scale the LR with the world" + why +
           ": set train.lr_scaling=none and give optim.lr for the global batch");
  need(c.distributed.compress == "none", "distributed.compress",
       "gradients are summed exactly in integers" + why + ": set distributed.compress=none");
  need(c.optim.name != "onebit_adam", "optim.name",
       "1-bit Adam's compressed momenta depend on the world" + why + ": use adam or adamw");
  need(!(c.amp.enabled && c.amp.dtype == "fp16"), "amp.dtype",
       "fp16 loss scaling is not supported" + why + ": use amp.dtype=bf16 or amp.enabled=false");
  need(d.pipeline.stages <= 1, "distributed.pipeline.stages",
       "pipeline stages are not supported" + why + ": set distributed.pipeline.stages=1");
  need(c.model.name != "torchscript" && c.model.name != "exported", "model.name",
       "a " +
           std::string(c.model.name == "exported" ? "exported program's" : "TorchScript model's") +
           " kernels and random draws (its dropout draws ATen's generator in call order, which "
           "the world changes) are outside mltrain's control" +
           why + ": use a built-in model, or distributed.invariance=none");
  need(!c.schedule.on_plateau(), "schedule.name",
       "plateau follows evaluation metrics summed over ranks in a world-dependent order" + why +
           ": use a step schedule (cosine, step, onecycle ...)");
  need(c.data.augment.mixup.p == 0 && c.data.augment.cutmix.p == 0, "data.augment.mixup",
       "mixup and cutmix mix whole loader batches, whose size depends on the world" + why +
           ": set data.augment.mixup.p=0 and data.augment.cutmix.p=0");
  need(c.runtime.device != "cuda", "runtime.device",
       "bitwise invariance is built and verified on CPU ranks" + why + ": set runtime.device=cpu");
}

static void cross_checks(const ExperimentConfig& c, Issues& issues, const std::string& file) {
  sampler_checks(c, issues, file);
  curriculum_checks(c, issues, file);
  auto need = [&](bool ok, const std::string& path, const std::string& msg) {
    if (!ok) issues.add(file, path, msg);
  };
  need(c.data.format == "auto" || c.data.dataset == "files", "data.format",
       c.data.format + " reads data.train_images/test_images: set data.dataset=files");
  const std::string& d = c.data.csv.delimiter;
  need(d.size() == 1 || d == "\\t", "data.csv.delimiter",
       "'" + d + "' is not one character: use e.g. ',' ';' '|' or '\\t'");
  const std::string& f = c.data.csv.fill;
  char* end = nullptr;
  const bool numeric = !f.empty() && (std::strtod(f.c_str(), &end), end && *end == 0);
  need(f == "error" || f == "mean" || f == "zero" || numeric, "data.csv.fill",
       "'" + f + "' is not error, mean, zero or a number");
  if (c.data.folds > 0) {
    need(c.data.fold < c.data.folds, "data.fold",
         std::to_string(c.data.fold) + " is not a fold of " + std::to_string(c.data.folds) +
             ": use 0.." + std::to_string(c.data.folds - 1));
    need(c.data.val_fraction == 0, "data.folds",
         "folds hold out their own validation samples: set data.val_fraction=0");
    need(c.data.dataset != "tokens", "data.folds",
         "token streams are not cut into folds (windows overlap): use data.val_fraction or the "
         "stream's val.bin");
  }
  if (c.data.dataset == "files") {
    need(!c.data.train_images.empty(), "data.train_images", "required when data.dataset is files");
    need(!c.data.test_images.empty(), "data.test_images", "required when data.dataset is files");
  }
  need((c.model.name != "torchscript" && c.model.name != "exported") || !c.model.path.empty(),
       "model.path", "required when model.name is " + c.model.name);
  need(c.model.name == "exported" || c.model.output.empty(), "model.output",
       "names an output of an exported program: set model.name=exported, or remove it");
  need(c.model.widths.size() == c.model.depths.size(), "model.depths",
       "needs one entry per model.widths entry");
  need(c.model.channels.size() == 2, "model.channels",
       "the cnn has exactly two conv layers: give 2 values");
  need(!c.model.hidden.empty(), "model.hidden", "give at least one hidden width");
  need(!c.data.batch_size.is_auto() || c.train.global_batch > 0, "data.batch_size",
       "auto needs train.global_batch (the samples per optimizer step stay fixed; the "
       "micro-batch is probed): set train.global_batch, or give a number");
  need(
      !c.data.batch_size.is_auto() || c.train.accumulate.is_auto() || c.train.accumulate.value == 1,
      "train.accumulate",
      "with data.batch_size=auto each loader batch is the whole step: set train.accumulate=1 "
      "(micro-batches come from memory.micro_batch)");
  pipeline_checks(c, issues, file);
  invariance_checks(c, issues, file);
  task_checks(c, issues, file);
}

ExperimentConfig load_experiment(const std::string& path,
                                 const std::vector<std::string>& overrides) {
  Issues issues;
  YAML::Node root;
  if (!path.empty())
    root = load_yaml_file(path, "config", "configs/ has examples", "run:, data:, model:", issues);
  ExperimentConfig cfg;
  read_settings(root, path.empty() ? "<defaults>" : path, overrides, issues, cfg);
  if (cfg.run.name.empty() && !path.empty())
    cfg.run.name = std::filesystem::path(path).stem().string();
  if (cfg.run.name.empty()) cfg.run.name = "default";
  if (issues.empty()) cross_checks(cfg, issues, path.empty() ? "<defaults>" : path);
  issues.throw_if_any();
  return cfg;
}

std::string to_yaml(const ExperimentConfig& cfg) { return yaml_of(cfg); }

std::string schema_text() { return schema_of<ExperimentConfig>(); }

int64_t memory_budget_bytes(const std::string& text) {
  int64_t bytes = 0;
  parse_memory_size(text, bytes);  // checked when the config was read
  return bytes;
}

}  // namespace mltrain::config
