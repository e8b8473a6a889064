#include "mltrain/model/model.hpp"

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <filesystem>
#include <type_traits>

#include "mltrain/core/error.hpp"
#include "mltrain/core/glob.hpp"
#include "mltrain/model/batchnorm.hpp"
#include "mltrain/model/dropout.hpp"
#include "mltrain/model/script_kernels.hpp"
#include "exported.hpp"
#include "gpt.hpp"
#include "islands.hpp"
#include "layout.hpp"
#include "recompute.hpp"

namespace mltrain::model {
namespace nn = torch::nn;

int64_t Model::num_parameters() {
  int64_t n = 0;
  for (auto& [name, p] : named_parameters()) n += p.numel();
  return n;
}

namespace {

struct MlpImpl : nn::Module {
  nn::Sequential body{nullptr};
  Islands* isl = nullptr;
  std::vector<std::string> names;  // body.<i>: what amp.fp32_modules can match
  MlpImpl(int64_t in, const config::ModelConfig& c, int64_t classes) {
    body = register_module("body", nn::Sequential());
    int64_t width = in;
    body->push_back(nn::Flatten());
    for (auto h : c.hidden) {
      body->push_back(nn::Linear(width, h));
      if (c.batchnorm) body->push_back(nn::BatchNorm1d(h));
      body->push_back(nn::ReLU());
      if (c.dropout > 0) body->push_back(Dropout(c.dropout));
      width = h;
    }
    body->push_back(nn::Linear(width, classes));
    for (size_t i = 0; i < body->size(); ++i) names.push_back("body." + std::to_string(i));
  }
  torch::Tensor forward(torch::Tensor x) { return units(x, 0, int64_t(names.size())); }
  // Pipeline units: the body's layers (flatten, linear, batchnorm, relu, dropout), in order.
  torch::Tensor units(torch::Tensor x, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      x = isl->call(names[size_t(i)], x,
                    [&](const torch::Tensor& t) { return (body->begin() + i)->forward(t); });
    return x;
  }
};
TORCH_MODULE(Mlp);

// The "2 Conv + pooling" network of Fashion-MNIST's benchmark table: two 5x5 convolutions, each
// followed by (BatchNorm), ReLU and 2x2 max-pooling, then a hidden fully connected layer.
struct CnnImpl : nn::Module {
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr};
  Dropout drop{nullptr};
  bool bn, cl;
  Islands* isl = nullptr;
  const std::vector<std::string> names = {"conv1", "bn1", "conv2", "bn2", "fc1", "fc2"};
  CnnImpl(const std::vector<int64_t>& shape, const config::ModelConfig& c, int64_t classes)
      : bn(c.batchnorm), cl(c.channels_last) {
    const int64_t ch = shape[0], h = shape[1], w = shape[2];
    conv1 = register_module(
        "conv1",
        nn::Conv2d(nn::Conv2dOptions(ch, c.channels[0], /*kernel_size=*/5).padding(2).bias(!bn)));
    conv2 = register_module(
        "conv2",
        nn::Conv2d(nn::Conv2dOptions(c.channels[0], c.channels[1], 5).padding(2).bias(!bn)));
    if (bn) {
      bn1 = register_module("bn1", nn::BatchNorm2d(c.channels[0]));
      bn2 = register_module("bn2", nn::BatchNorm2d(c.channels[1]));
    }
    fc1 = register_module("fc1", nn::Linear(c.channels[1] * (h / 4) * (w / 4), c.fc));
    fc2 = register_module("fc2", nn::Linear(c.fc, classes));
    drop = register_module("drop", Dropout(c.dropout));
  }
  // relu(max_pool(x)) == max_pool(relu(x)) in value and gradient (ReLU is monotonic), on 4x
  // fewer elements; flatten(1) keeps PyTorch's NCHW feature order, so weights stay interchangeable.
  torch::Tensor forward(torch::Tensor x) {
    if (cl) x = channels_last(x);
    auto run = [this](const std::string& n, const torch::Tensor& t, auto& m) {
      return isl->call(n, t, [&](const torch::Tensor& in) { return m(in); });
    };
    // (BN), pool, ReLU; with BatchNorm and no fp32 islands one fused node (model/batchnorm.hpp).
    auto norm_pool_relu = [&](const torch::Tensor& t, size_t i, nn::BatchNorm2d& b) {
      if (bn && isl->idle()) return batchnorm_pool_relu(t, *b);
      return torch::relu(torch::max_pool2d(bn ? run(names[i], t, b) : t, 2));
    };
    x = norm_pool_relu(run(names[0], x, conv1), 1, bn1);
    x = norm_pool_relu(run(names[2], x, conv2), 3, bn2);
    x = torch::relu(run(names[4], x.flatten(1), fc1));
    return run(names[5], drop(x), fc2);
  }
};
TORCH_MODULE(Cnn);

struct BlockImpl : nn::Module {
  nn::Conv2d c1{nullptr}, c2{nullptr}, sc{nullptr};
  nn::BatchNorm2d b1{nullptr}, b2{nullptr}, sb{nullptr};
  Islands* isl = nullptr;
  std::string prefix;              // stages.<i>
  std::vector<std::string> names;  // <prefix>.{conv1,bn1,conv2,bn2,shortcut,shortcut_bn}
  // bn=false: the BatchNorm-free form `mltrain fuse` writes (BN folded into biased convs).
  BlockImpl(int64_t in, int64_t out, int64_t stride, bool bn = true) {
    c1 = register_module(
        "conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(!bn)));
    if (bn) b1 = register_module("bn1", nn::BatchNorm2d(out));
    c2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(!bn)));
    if (bn) b2 = register_module("bn2", nn::BatchNorm2d(out));
    if (stride != 1 || in != out) {
      sc = register_module("shortcut",
                           nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(!bn)));
      if (bn) sb = register_module("shortcut_bn", nn::BatchNorm2d(out));
    }
  }
  void name(const std::string& p) {
    prefix = p;
    names.clear();
    for (const char* n : {"conv1", "bn1", "conv2", "bn2", "shortcut", "shortcut_bn"})
      names.push_back(prefix + "." + n);
  }
  template <class M>
  torch::Tensor run(size_t i, M& m, const torch::Tensor& x) {
    if (!m) return x;
    return isl->call(names[i], x, [&](const torch::Tensor& t) { return m(t); });
  }
  torch::Tensor forward(torch::Tensor x) {
    if (b1 && isl->idle()) {  // "BN, (+ shortcut), ReLU" as fused nodes (model/batchnorm.hpp)
      auto y = batchnorm_relu(c1(x), *b1);
      return batchnorm_relu(c2(y), *b2, sc ? sb(sc(x)) : x);
    }
    auto y = torch::relu(run(1, b1, run(0, c1, x)));
    y = run(3, b2, run(2, c2, y));
    return torch::relu(y + (sc ? run(5, sb, run(4, sc, x)) : x));
  }
};
TORCH_MODULE(Block);

// A CIFAR-style ResNet (He et al. 2016, section 4.2) scaled by widths/depths.
struct ResNetImpl : nn::Module {
  nn::Conv2d stem{nullptr};
  nn::BatchNorm2d stem_bn{nullptr};
  nn::Sequential stages{nullptr};
  Dropout drop{nullptr};
  nn::Linear head{nullptr};
  std::vector<Block> blocks;  // stages' children, in order
  Islands* isl = nullptr;
  int64_t checkpoint_every = 0;
  const std::vector<std::string> names = {"stem", "stem_bn", "head"};
  ResNetImpl(const std::vector<int64_t>& shape, const config::ModelConfig& c, int64_t classes) {
    stem = register_module(
        "stem",
        nn::Conv2d(nn::Conv2dOptions(shape[0], c.widths[0], 3).padding(1).bias(!c.batchnorm)));
    if (c.batchnorm) stem_bn = register_module("stem_bn", nn::BatchNorm2d(c.widths[0]));
    stages = register_module("stages", nn::Sequential());
    int64_t in = c.widths[0];
    for (size_t s = 0; s < c.widths.size(); ++s)
      for (int64_t b = 0; b < c.depths[s]; ++b) {
        blocks.push_back(Block(in, c.widths[s], (b == 0 && s > 0) ? 2 : 1, c.batchnorm));
        blocks.back()->name("stages." + std::to_string(blocks.size() - 1));
        stages->push_back(blocks.back());
        in = c.widths[s];
      }
    drop = register_module("drop", Dropout(c.dropout));
    head = register_module("head", nn::Linear(in, classes));
  }
  bool cl = false;
  // Pipeline units: 0 the stem, 1..n the blocks, n+1 pooling and the head. The blocks run without
  // activation checkpointing here (the config refuses both together).
  int64_t num_units() const { return int64_t(blocks.size()) + 2; }
  torch::Tensor units(torch::Tensor x, int64_t begin, int64_t end) {
    const int64_t last = num_units() - 1;
    for (int64_t u = begin; u < end; ++u) {
      if (u == 0) {
        if (cl) x = channels_last(x);
        x = isl->call(names[0], x, [&](const torch::Tensor& t) { return stem(t); });
        if (stem_bn) x = isl->call(names[1], x, [&](const torch::Tensor& t) { return stem_bn(t); });
        x = torch::relu(x);
      } else if (u == last) {
        x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
        x = isl->call(names[2], drop(x), [&](const torch::Tensor& t) { return head(t); });
      } else {
        Block& b = blocks[size_t(u - 1)];
        x = b->isl->call(b->prefix, x, [&](const torch::Tensor& in) { return b->forward(in); });
      }
    }
    return x;
  }
  int64_t unit_of(const std::string& name) const {
    if (name.rfind("stem", 0) == 0) return 0;
    if (name.rfind("stages.", 0) == 0) return 1 + std::atoll(name.c_str() + 7);
    return num_units() - 1;  // head
  }
  torch::Tensor forward(torch::Tensor x) {
    if (cl) x = channels_last(x);
    x = isl->call(names[0], x, [&](const torch::Tensor& t) { return stem(t); });
    if (stem_bn && isl->idle()) {
      x = batchnorm_relu(x, *stem_bn);
    } else {
      if (stem_bn) x = isl->call(names[1], x, [&](const torch::Tensor& t) { return stem_bn(t); });
      x = torch::relu(x);
    }
    x = run_segments(
        blocks, checkpoint_every, x,
        [](Block& b, const torch::Tensor& t) {
          return b->isl->call(b->prefix, t,
                              [&](const torch::Tensor& in) { return b->forward(in); });
        },
        [](Block& b) { return b->buffers(); });
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return isl->call(names[2], drop(x), [&](const torch::Tensor& t) { return head(t); });
  }
};
TORCH_MODULE(ResNet);

// Per registry net: which sub-module calls amp.fp32_modules can name, and whether it has blocks.
void attach(Mlp& m, Islands* i) { m->isl = i; }
void attach(Cnn& m, Islands* i) { m->isl = i; }
void attach(ResNet& m, Islands* i) {
  m->isl = i;
  for (auto& b : m->blocks) b->isl = i;
}
std::vector<std::string> island_names_of(const Mlp& m) { return m->names; }
std::vector<std::string> island_names_of(const Cnn& m) {
  return m->bn ? m->names : std::vector<std::string>{"conv1", "conv2", "fc1", "fc2"};
}
std::vector<std::string> island_names_of(const ResNet& m) {
  std::vector<std::string> out = {"stem"};
  if (m->stem_bn) out.push_back("stem_bn");
  for (const auto& b : m->blocks) {
    out.push_back(b->prefix);
    const nn::Module* parts[] = {b->c1.get(),
                                 b->b1 ? b->b1.get() : nullptr,
                                 b->c2.get(),
                                 b->b2 ? b->b2.get() : nullptr,
                                 b->sc ? b->sc.get() : nullptr,
                                 b->sb ? b->sb.get() : nullptr};
    for (size_t k = 0; k < b->names.size(); ++k)
      if (parts[k]) out.push_back(b->names[k]);
  }
  out.push_back("head");
  return out;
}

template <class M>
class ModuleModel : public Model {
 public:
  ModuleModel(M m, std::string desc) : m_(std::move(m)), desc_(std::move(desc)) {
    attach(m_, islands());
  }
  std::vector<std::string> island_names() const override { return island_names_of(m_); }
  // Of the ModuleModels only the ResNet has blocks.
  int64_t num_blocks() const override {
    if constexpr (std::is_same_v<M, ResNet>) return static_cast<int64_t>(m_->blocks.size());
    return 0;
  }
  void set_checkpointing(int64_t every) override {
    if constexpr (std::is_same_v<M, ResNet>)
      m_->checkpoint_every = every;
    else
      Model::set_checkpointing(every);
  }
  torch::Tensor forward(const torch::Tensor& x) override { return m_->forward(x); }
  int64_t num_units() const override {
    if constexpr (std::is_same_v<M, Mlp>) return int64_t(m_->names.size());
    if constexpr (std::is_same_v<M, ResNet>) return m_->num_units();
    return 0;
  }
  torch::Tensor forward_units(const torch::Tensor& x, int64_t begin, int64_t end) override {
    if constexpr (std::is_same_v<M, Mlp> || std::is_same_v<M, ResNet>)
      return m_->units(x, begin, end);
    return Model::forward_units(x, begin, end);
  }
  int64_t unit_of(const std::string& name) const override {
    if constexpr (std::is_same_v<M, Mlp>) return std::atoll(name.c_str() + 5);  // body.<i>.
    if constexpr (std::is_same_v<M, ResNet>) return m_->unit_of(name);
    return Model::unit_of(name);
  }
  NamedTensors named_parameters() override {
    NamedTensors out;
    for (auto& item : m_->named_parameters()) out.emplace_back(item.key(), item.value());
    return out;
  }
  NamedTensors named_buffers() override {
    NamedTensors out;
    for (auto& item : m_->named_buffers()) out.emplace_back(item.key(), item.value());
    return out;
  }
  void set_training(bool on) override { m_->train(on); }
  void to(const torch::Device& device) override { m_->to(device); }
  std::string describe() const override { return desc_; }

 private:
  M m_;
  std::string desc_;
};

class ScriptModel : public Model {
 public:
  ScriptModel(torch::jit::Module m, std::string path, bool cl, bool own_kernels)
      : m_(std::move(m)), path_(std::move(path)), cl_(cl) {
    if (own_kernels) kernels_ = use_mltrain_kernels(m_).text();
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    auto out = m_.forward({cl_ ? channels_last(x) : x});
    if (!out.isTensor())
      throw RuntimeError(path_, "forward() must return one tensor of logits",
                         "return logits from forward");
    return out.toTensor();
  }
  c10::IValue forward_with_targets(const torch::Tensor& x, const torch::Tensor& y) override {
    const size_t args = m_.get_method("forward").function().getSchema().arguments().size();
    if (args != 3)  // self, inputs, targets
      throw ConfigError("task.name",
                        path_ + ": forward takes " + std::to_string(args - 1) +
                            " argument(s); task custom calls forward(inputs, targets)",
                        "script a model whose forward(self, inputs, targets) returns the loss "
                        "(or a dict with 'loss'), or use another task");
    return m_.forward({cl_ ? channels_last(x) : x, y});
  }
  NamedTensors named_parameters() override {
    NamedTensors out;
    for (const auto& p : m_.named_parameters(/*recurse=*/true)) out.emplace_back(p.name, p.value);
    return out;
  }
  NamedTensors named_buffers() override {
    NamedTensors out;
    for (const auto& b : m_.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
    return out;
  }
  void set_training(bool on) override { m_.train(on); }
  void to(const torch::Device& device) override { m_.to(device); }
  std::string describe() const override {
    return "torchscript(" + path_ + (kernels_.empty() ? "" : "; mltrain kernels: " + kernels_) +
           ")";
  }

 private:
  torch::jit::Module m_;
  std::string path_;
  bool cl_;  // model.channels_last: 4-D inputs and weights NHWC (depthwise convolutions gain most)
  std::string kernels_;  // what model.script_kernels=mltrain rewrote ("" when off)
};

}  // namespace

Model::Model() : islands_(std::make_shared<Islands>()) {}

void Model::set_checkpointing(int64_t every) {
  if (every <= 0) return;
  throw ConfigError("memory.checkpoint",
                    describe() + " has no repeated blocks to checkpoint (resnet and gpt do)",
                    "set memory.checkpoint=none, or use model.name=resnet or gpt");
}

std::vector<std::string> Model::set_fp32_modules(const std::vector<std::string>& patterns) {
  const auto names = island_names();
  std::set<std::string> chosen;
  for (const auto& pat : patterns) {
    bool any = false;
    for (const auto& n : names)
      if (glob_match(pat, n)) chosen.insert(n), any = true;
    if (any) continue;
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    throw ConfigError("amp.fp32_modules",
                      "pattern '" + pat + "' matches no module of " + describe() +
                          (names.empty() ? " (it has no named modules islands apply to)"
                                         : "; its modules: " + list),
                      names.empty() ? "remove amp.fp32_modules for this model"
                                    : "use one of these names or a glob over them (h.*.ln_*)");
  }
  islands_->choose(chosen);
  return {chosen.begin(), chosen.end()};
}

void Model::record_dtypes(bool on) { islands_->record(on); }

std::map<std::string, std::string> Model::recorded_dtypes() const {
  std::map<std::string, std::string> out;
  for (const auto& [n, t] : islands_->outputs()) out[n] = c10::toString(t);
  return out;
}

torch::Tensor Model::forward_units(const torch::Tensor&, int64_t, int64_t) {
  throw ConfigError("distributed.pipeline.stages",
                    describe() + " cannot be cut into pipeline stages (mlp, resnet and gpt can)",
                    "set distributed.pipeline.stages=1, or model.name=mlp, resnet or gpt");
}

int64_t Model::unit_of(const std::string&) const { return 0; }

c10::IValue Model::forward_with_targets(const torch::Tensor&, const torch::Tensor&) {
  throw ConfigError("task.name",
                    "task custom needs a model that computes its own loss; " + describe() +
                        " returns outputs only",
                    "set model.name=torchscript with a forward(inputs, targets), or pick the "
                    "task that matches the data");
}

namespace {
// PyTorch's fans (torch.nn.init._calculate_fan_in_and_fan_out): the input and output feature
// counts times the kernel's receptive field.
int64_t receptive(const torch::Tensor& w) { return w.numel() / (w.size(0) * w.size(1)); }
int64_t fan_in(const torch::Tensor& w) { return w.size(1) * receptive(w); }
int64_t fan_out(const torch::Tensor& w) { return w.size(0) * receptive(w); }
}  // namespace

void init_weights(const NamedTensors& params, const std::string& scheme) {
  if (scheme == "default") return;
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    const bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    if (p.dim() < 2) {  // biases and norm affine parameters
      if (is_bias) p.zero_();
      continue;
    }
    if (scheme == "kaiming_normal")
      torch::nn::init::kaiming_normal_(p, 0, torch::kFanIn, torch::kReLU);
    else if (scheme == "kaiming_uniform")
      torch::nn::init::kaiming_uniform_(p, 0, torch::kFanIn, torch::kReLU);
    else if (scheme == "xavier_normal")
      torch::nn::init::xavier_normal_(p);
    else if (scheme == "xavier_uniform")
      torch::nn::init::xavier_uniform_(p);
    else if (scheme == "orthogonal")
      torch::nn::init::orthogonal_(p);
    else if (scheme == "layer_adaptive_uniform") {
      // The field guide's: U(-a, a), a = sqrt(3 / (fan_in sqrt(fan_out))): variance
      // 1 / (fan_in sqrt(fan_out)), so a wide layer starts smaller than LeCun's 1 / fan_in.
      const double a = std::sqrt(3.0 / (double(fan_in(p)) * std::sqrt(double(fan_out(p)))));
      p.uniform_(-a, a);
    } else if (scheme == "lecun_normal")  // the field guide's normal init: std 1 / sqrt(fan_in)
      p.normal_(0.0, 1.0 / std::sqrt(double(fan_in(p))));
    else
      throw ConfigError("model.init", "unknown init '" + scheme + "'");
  }
}

std::unique_ptr<Model> build_model(const config::ModelConfig& c, const std::vector<int64_t>& shape,
                                   int64_t num_classes, uint64_t seed) {
  torch::manual_seed(seed);
  std::unique_ptr<Model> m;
  int64_t in = 1;
  for (auto d : shape) in *= d;
  auto need_image = [&] {
    if (shape.size() != 3)
      throw ConfigError("model.name",
                        c.name + " needs image samples [C,H,W], got " +
                            std::to_string(shape.size()) + "-D samples",
                        "use model.name=mlp for flat samples");
  };
  if (c.name == "mlp") {
    m = std::make_unique<ModuleModel<Mlp>>(Mlp(in, c, num_classes), "mlp");
  } else if (c.name == "cnn") {
    need_image();
    m = std::make_unique<ModuleModel<Cnn>>(Cnn(shape, c, num_classes), "cnn");
  } else if (c.name == "resnet") {
    need_image();
    ResNet net(shape, c, num_classes);
    net->cl = c.channels_last;
    m = std::make_unique<ModuleModel<ResNet>>(net, "resnet");
  } else if (c.name == "gpt") {
    if (shape.size() != 1)
      throw ConfigError(
          "model.name",
          "gpt reads token windows [T]; these samples are " + std::to_string(shape.size()) + "-D",
          "set data.dataset=tokens");
    m = make_gpt(c, num_classes);
  } else if (c.name == "torchscript") {
    if (!std::filesystem::exists(c.path))
      throw ConfigError("model.path", "TorchScript file '" + c.path + "' not found",
                        "save one with torch.jit.save(torch.jit.script(model), path)");
    // Read when the forward method first runs, so it must be set before then. Measured on the
    // pytorch/examples MNIST CNN, batch 128 (README, "Memory"): peak RSS 403 vs 479 MiB.
    torch::jit::getProfilingMode() = c.script_executor == "profiling";
    torch::jit::Module loaded;
    try {
      loaded = torch::jit::load(c.path);
    } catch (const c10::Error& e) {
      throw DataError(c.path, "not a loadable TorchScript file",
                      "save it with torch.jit.save(torch.jit.script(model), path)");
    }
    // Outside the try: a failure of the rewrite is mltrain's, not a sign of a bad file.
    m = std::make_unique<ScriptModel>(std::move(loaded), c.path, c.channels_last,
                                      c.script_kernels == "mltrain");
  } else if (c.name == "exported") {
    // The program's own weights; model.channels_last does not apply (its view ops assume the
    // layout it was exported with).
    m = make_exported(c, shape);
  } else {
    throw ConfigError("model.name", "unknown model '" + c.name + "'");
  }
  init_weights(m->named_parameters(), c.init);
  if (c.channels_last && (c.name == "cnn" || c.name == "resnet" || c.name == "torchscript")) {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : m->named_parameters())
      if (p.dim() == 4) p.set_data(channels_last(p));
  }
  return m;
}

}  // namespace mltrain::model
