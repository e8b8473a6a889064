#include "mltrain/deploy/fuse.hpp"

#include <spdlog/spdlog.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/fold_conv_bn.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "mltrain/config/format.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/formats/safetensors.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/train/pipeline.hpp"

namespace fs = std::filesystem;

namespace mltrain::deploy {
using config::format_fixed;
using train::load_trained_model;
using train::plain_loader_options;
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kBnEps = 1e-5;  // LibTorch's BatchNorm default; the registry never changes it

using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

std::string module_of(const std::string& param) { return param.substr(0, param.rfind('.')); }

// The BatchNorm that follows a layer, by the registry's naming: convK -> bnK, X -> X_bn, and in a
// Sequential index k -> k + 1.
std::string bn_after(const std::string& mod, const std::map<std::string, torch::Tensor>& buffers) {
  const auto dot = mod.rfind('.');
  const std::string prefix = dot == std::string::npos ? "" : mod.substr(0, dot + 1);
  const std::string leaf = dot == std::string::npos ? mod : mod.substr(dot + 1);
  std::vector<std::string> cands = {prefix + leaf + "_bn"};
  if (leaf.rfind("conv", 0) == 0) cands.push_back(prefix + "bn" + leaf.substr(4));
  if (!leaf.empty() && leaf.find_first_not_of("0123456789") == std::string::npos)
    cands.push_back(prefix + std::to_string(std::stoll(leaf) + 1));
  for (const auto& c : cands)
    if (buffers.count(c + ".running_mean")) return c;
  return "";
}

Timing time_model(const Forward& f, const torch::Tensor& x1, const torch::Tensor& x128) {
  torch::NoGradGuard ng;
  Timing t;
  for (int i = 0; i < 5; ++i) f(x1);
  std::vector<double> lat;
  for (int i = 0; i < 200; ++i) {
    const auto t0 = Clock::now();
    f(x1);
    lat.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::nth_element(lat.begin(), lat.begin() + lat.size() / 2, lat.end());
  t.latency_ms_batch1 = lat[lat.size() / 2];
  t.samples_per_s_batch128 = batch_throughput(f, x128);
  return t;
}

std::string ident(const std::string& name) {
  std::string s = name;
  std::replace(s.begin(), s.end(), '.', '_');
  return "p_" + s;
}

// TorchScript source for the BatchNorm-free registry model (model.batchnorm=false), parameters
// registered as attributes named after the model's own parameter names.
std::string script_source(const config::ModelConfig& c, const model::NamedTensors& params) {
  std::map<std::string, std::string> id;
  for (const auto& [n, p] : params) id[n] = "self." + ident(n);
  auto has = [&](const std::string& n) { return id.count(n) > 0; };
  std::ostringstream s;
  s << "def forward(self, x: Tensor) -> Tensor:\n";
  if (c.name == "mlp") {
    std::vector<std::string> layers;
    for (const auto& [n, p] : params)
      if (p.dim() == 2) layers.push_back(module_of(n));
    s << "    x = x.flatten(1)\n";
    for (size_t i = 0; i < layers.size(); ++i) {
      const std::string lin =
          "torch.linear(x, " + id[layers[i] + ".weight"] + ", " + id[layers[i] + ".bias"] + ")";
      s << "    x = " << (i + 1 < layers.size() ? "torch.relu(" + lin + ")" : lin) << "\n";
    }
    s << "    return x\n";
  } else if (c.name == "cnn") {
    for (const char* conv : {"conv1", "conv2"})
      s << "    x = torch.relu(torch.max_pool2d(torch.conv2d(x, "
        << id[std::string(conv) + ".weight"] << ", " << id[std::string(conv) + ".bias"]
        << ", [1, 1], [2, 2]), [2, 2]))\n";
    s << "    x = torch.relu(torch.linear(x.flatten(1), " << id["fc1.weight"] << ", "
      << id["fc1.bias"] << "))\n";
    s << "    return torch.linear(x, " << id["fc2.weight"] << ", " << id["fc2.bias"] << ")\n";
  } else if (c.name == "resnet") {
    s << "    x = torch.relu(torch.conv2d(x, " << id["stem.weight"] << ", " << id["stem.bias"]
      << ", [1, 1], [1, 1]))\n";
    int64_t k = 0;
    for (size_t st = 0; st < c.widths.size(); ++st)
      for (int64_t b = 0; b < c.depths[st]; ++b, ++k) {
        const std::string p = "stages." + std::to_string(k) + ".";
        const int stride = (b == 0 && st > 0) ? 2 : 1;
        const std::string sv =
            std::string("[") + std::to_string(stride) + ", " + std::to_string(stride) + "]";
        s << "    y = torch.relu(torch.conv2d(x, " << id[p + "conv1.weight"] << ", "
          << id[p + "conv1.bias"] << ", " << sv << ", [1, 1]))\n";
        s << "    y = torch.conv2d(y, " << id[p + "conv2.weight"] << ", " << id[p + "conv2.bias"]
          << ", [1, 1], [1, 1])\n";
        if (has(p + "shortcut.weight"))
          s << "    x = torch.relu(y + torch.conv2d(x, " << id[p + "shortcut.weight"] << ", "
            << id[p + "shortcut.bias"] << ", " << sv << ", [0, 0]))\n";
        else
          s << "    x = torch.relu(y + x)\n";
      }
    s << "    x = torch.adaptive_avg_pool2d(x, [1, 1]).flatten(1)\n";
    s << "    return torch.linear(x, " << id["head.weight"] << ", " << id["head.bias"] << ")\n";
  } else {
    throw RuntimeError("fuse", "no TorchScript writer for model '" + c.name + "'");
  }
  return s.str();
}

// BatchNorm forward calls left in a TorchScript module's forward graphs (recursively).
int batchnorm_calls(const torch::jit::Module& m) {
  int n = 0;
  if (auto f = m.find_method("forward"))
    for (const auto* node : f->graph()->nodes())
      if (node->kind() == c10::prim::CallMethod)
        if (auto cls = node->input(0)->type()->cast<c10::ClassType>())
          if (cls->name() && cls->name()->name().find("BatchNorm") != std::string::npos) ++n;
  for (const auto& child : m.children()) n += batchnorm_calls(child);
  return n;
}

}  // namespace

double batch_throughput(const std::function<torch::Tensor(const torch::Tensor&)>& f,
                        const torch::Tensor& batch) {
  torch::NoGradGuard ng;
  for (int i = 0; i < 5; ++i) f(batch);
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < 10; ++i) f(batch);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / 10);
  }
  return batch.size(0) / best;
}

std::pair<torch::Tensor, torch::Tensor> fold_batchnorm(
    const torch::Tensor& w, const torch::Tensor& b, const torch::Tensor& gamma,
    const torch::Tensor& beta, const torch::Tensor& mean, const torch::Tensor& var, double eps) {
  torch::NoGradGuard ng;
  // Computed in float64 and rounded once, so folding adds one rounding per element.
  const auto s = gamma.to(torch::kDouble) / (var.to(torch::kDouble) + eps).sqrt();
  std::vector<int64_t> shape(static_cast<size_t>(w.dim()), 1);
  shape[0] = w.size(0);
  auto w2 = (w.to(torch::kDouble) * s.view(shape)).to(w.scalar_type());
  auto b0 = b.defined() ? b.to(torch::kDouble) : torch::zeros({w.size(0)}, torch::kDouble);
  auto b2 = ((b0 - mean.to(torch::kDouble)) * s + beta.to(torch::kDouble)).to(w.scalar_type());
  return {w2.contiguous(), b2};
}

namespace {

// Real batches of the test split, in order.
std::vector<torch::Tensor> test_batches(const train::TrainedModel& tm, int64_t n) {
  data::Loader loader(tm.splits.test,
                      plain_loader_options(tm.cfg, 128, /*shuffle=*/false, /*drop_last=*/true));
  loader.start_epoch(0);
  std::vector<torch::Tensor> xs;
  data::Batch b;
  while (static_cast<int64_t>(xs.size()) < n && loader.next(b)) xs.push_back(b.x.clone());
  if (xs.empty()) throw DataError("test split", "has no full batch of 128 to compare on");
  return xs;
}

// The folded model: its forward and its TorchScript form. Owned on the heap so the forward
// function can refer to them after the struct moves.
struct Folded {
  std::shared_ptr<torch::jit::Module> script = std::make_shared<torch::jit::Module>();
  std::shared_ptr<model::Model> model;
  Forward forward;
  std::vector<std::string> names;
  int count = 0;
};

// TorchScript input: LibTorch's own pass, in eval mode with the trained weights.
Folded fold_torchscript(const train::TrainedModel& tm) {
  torch::jit::Module m = torch::jit::load(tm.cfg.model.path);
  std::map<std::string, torch::Tensor> trained;
  for (auto& [n, t] : tm.model->named_parameters()) trained[n] = t;
  for (auto& [n, t] : tm.model->named_buffers()) trained[n] = t;
  for (const auto& p : m.named_parameters(true)) p.value.detach().copy_(trained.at(p.name));
  for (const auto& p : m.named_buffers(true))
    if (trained.count(p.name)) p.value.detach().copy_(trained.at(p.name));
  m.eval();
  Folded f;
  const int bn_before = batchnorm_calls(m);
  *f.script = torch::jit::FoldConvBatchNorm(m);
  f.count = bn_before - batchnorm_calls(*f.script);
  if (f.count > 0)
    f.names.push_back(std::to_string(f.count) +
                      " conv->BatchNorm call(s) folded by LibTorch's FoldConvBatchNorm");
  auto script = f.script;
  f.forward = [script](const torch::Tensor& x) { return script->forward({x}).toTensor(); };
  return f;
}

// Registry models: the same architecture without BatchNorm (model.batchnorm=false), layers paired
// by order, each layer's BatchNorm found by the registry's names and folded into it; written as
// safetensors, config.yaml and generated TorchScript.
Folded fold_registry(const train::TrainedModel& tm, const fs::path& out) {
  const auto& cfg = tm.cfg;
  config::ExperimentConfig fused_cfg = cfg;
  fused_cfg.model.batchnorm = false;
  Folded f;
  // The trained model's twin without BatchNorm, on the CPU like the model it is folded from.
  f.model = model::build_model(fused_cfg.model, tm.splits.train.sample_shape, cfg.data.num_classes,
                               cfg.run.seed);
  f.model->set_training(false);
  std::map<std::string, torch::Tensor> P, B, FP;
  for (auto& [n, t] : tm.model->named_parameters()) P[n] = t;
  for (auto& [n, t] : tm.model->named_buffers()) B[n] = t;
  std::vector<std::string> src, dst;
  for (auto& [n, t] : tm.model->named_parameters())
    if (t.dim() >= 2) src.push_back(n);
  const auto fused_params = f.model->named_parameters();
  for (auto& [n, t] : fused_params) {
    FP[n] = t;
    if (t.dim() >= 2) dst.push_back(n);
  }
  if (src.size() != dst.size())
    throw RuntimeError("fuse", "the BatchNorm-free " + cfg.model.name + " has another layer count");
  for (size_t i = 0; i < src.size(); ++i) {
    const std::string sm = module_of(src[i]), dm = module_of(dst[i]);
    const auto& w = P.at(src[i]);
    if (w.sizes() != FP.at(dst[i]).sizes())
      throw RuntimeError("fuse", "shape mismatch at " + src[i]);
    const torch::Tensor bias = P.count(sm + ".bias") ? P.at(sm + ".bias") : torch::Tensor();
    const std::string bn = bn_after(sm, B);
    torch::Tensor w2 = w, b2 = bias.defined() ? bias : torch::zeros({w.size(0)}, w.options());
    if (!bn.empty()) {
      std::tie(w2, b2) =
          fold_batchnorm(w, bias, P.at(bn + ".weight"), P.at(bn + ".bias"),
                         B.at(bn + ".running_mean"), B.at(bn + ".running_var"), kBnEps);
      ++f.count;
      f.names.push_back(sm + " <- " + bn);
    }
    FP.at(dst[i]).detach().copy_(w2);
    if (!FP.count(dm + ".bias"))
      throw RuntimeError("fuse", "the BatchNorm-free layer " + dm + " has no bias");
    FP.at(dm + ".bias").detach().copy_(b2);
  }
  auto fused = f.model;
  f.forward = [fused](const torch::Tensor& x) { return fused->forward(x); };

  // The same weights as a TorchScript module (loadable by torch.jit.load and model.name=torchscript).
  *f.script = torch::jit::Module("MltrainFused" + cfg.model.name);
  for (auto& [n, t] : fused_params)
    f.script->register_parameter(ident(n), t.detach().contiguous().clone(), false);
  f.script->define(script_source(fused_cfg.model, fused_params));
  f.script->eval();
  formats::save_safetensors((out / "model.safetensors").string(), fused_params,
                            {{"format", "pt"}, {"fused_from", tm.checkpoint.string()}});
  write_file_atomic((out / "config.yaml").string(), config::to_yaml(fused_cfg));
  return f;
}

// Differences on real batches: original vs folded, and the reloaded TorchScript file vs folded.
void compare_outputs(const Forward& original, const Folded& f, const std::string& pt,
                     const std::vector<torch::Tensor>& xs, FuseReport& r) {
  double sum_diff = 0;
  int64_t n = 0;
  torch::jit::Module reloaded = torch::jit::load(pt);
  reloaded.eval();
  for (const auto& x : xs) {
    const auto a = original(x), y = f.forward(x);
    const auto d = (a - y).abs();
    r.max_abs_diff = std::max(r.max_abs_diff, d.max().item<double>());
    sum_diff += d.sum().item<double>();
    n += d.numel();
    r.max_abs_logit = std::max(r.max_abs_logit, a.abs().max().item<double>());
    r.torchscript_max_abs_diff =
        std::max(r.torchscript_max_abs_diff,
                 (reloaded.forward({x}).toTensor() - y).abs().max().item<double>());
  }
  r.mean_abs_diff = sum_diff / std::max<int64_t>(1, n);
  r.compared_batches = static_cast<int64_t>(xs.size());
}

}  // namespace

FuseReport fuse_run(const std::string& where, const FuseOptions& opt) {
  auto tm = load_trained_model(where, "fuse");
  if (tm.cfg.model.name == "exported")
    throw ConfigError(
        "model.name",
        "mltrain fuse folds the registry's models and TorchScript files; " + tm.cfg.model.path +
            " is an exported program",
        "fold BatchNorm in PyTorch (load the run's model.safetensors into your class, "
        "torch.ao.quantization.fuse_modules, export again)");
  const fs::path out = opt.out_dir.empty() ? tm.run_dir / "fused" : fs::path(opt.out_dir);
  torch::NoGradGuard ng;
  const auto xs = test_batches(tm, opt.batches);
  fs::create_directories(out);
  const Folded folded =
      tm.cfg.model.name == "torchscript" ? fold_torchscript(tm) : fold_registry(tm, out);
  const std::string pt = (out / "model.pt").string();
  folded.script->save(pt);

  // Proof: outputs on real batches, then speed.
  FuseReport r;
  r.run = tm.run_dir.string();
  r.checkpoint = tm.checkpoint.string();
  r.model = tm.cfg.model.name;
  r.folded = folded.names;
  r.folded_batchnorms = folded.count;
  r.torchscript_file = pt;
  r.out_dir = out.string();
  const Forward original = [&](const torch::Tensor& x) { return tm.model->forward(x); };
  compare_outputs(original, folded, pt, xs, r);
  r.tolerance = opt.tolerance * std::max(1.0, r.max_abs_logit);
  const auto x1 = xs[0].slice(0, 0, 1).clone(), x128 = xs[0];
  r.before = time_model(original, x1, x128);
  r.after = time_model(folded.forward, x1, x128);
  write_file_atomic((out / "fuse.json").string(), r.to_json().dump(2) + "\n");
  if (!r.within_tolerance() || !(r.torchscript_max_abs_diff <= r.tolerance))
    throw RuntimeError("fuse",
                       "fused outputs differ by " +
                           std::to_string(std::max(r.max_abs_diff, r.torchscript_max_abs_diff)) +
                           " (allowed " + std::to_string(r.tolerance) + "); nothing to trust",
                       "report this with " + (out / "fuse.json").string());
  return r;
}

static nlohmann::json timing_json(const Timing& t) {
  return {{"latency_ms_batch1", t.latency_ms_batch1},
          {"samples_per_s_batch128", t.samples_per_s_batch128}};
}

nlohmann::json FuseReport::to_json() const {
  return {{"run", run},
          {"checkpoint", checkpoint},
          {"model", model},
          {"folded_batchnorms", folded_batchnorms},
          {"folded", folded},
          {"compared", {{"batches", compared_batches}, {"batch_size", 128}, {"split", "test"}}},
          {"max_abs_diff", max_abs_diff},
          {"mean_abs_diff", mean_abs_diff},
          {"max_abs_logit", max_abs_logit},
          {"tolerance", tolerance},
          {"within_tolerance", within_tolerance()},
          {"torchscript_max_abs_diff", torchscript_max_abs_diff},
          {"before", timing_json(before)},
          {"after", timing_json(after)},
          {"speedup_batch1", speedup_batch1()},
          {"speedup_batch128", speedup_batch128()},
          {"files", {{"torchscript", torchscript_file}, {"dir", out_dir}}}};
}

std::string FuseReport::to_text() const {
  std::ostringstream o;
  o << "fused " << model << " from " << checkpoint << ": " << folded_batchnorms
    << " BatchNorm layer(s) folded\n";
  for (const auto& f : folded) o << "  " << f << "\n";
  o << "outputs on " << compared_batches << " test batches of 128: max |diff| "
    << config::format_double(max_abs_diff) << ", mean |diff| "
    << config::format_double(mean_abs_diff) << " (allowed " << config::format_double(tolerance)
    << " = 1e-4 x max(1, max |logit| " << format_fixed(max_abs_logit, 2)
    << ")); TorchScript file vs fused: " << config::format_double(torchscript_max_abs_diff) << "\n";
  o << "batch 1:   " << format_fixed(before.latency_ms_batch1, 3) << " ms -> "
    << format_fixed(after.latency_ms_batch1, 3) << " ms (" << format_fixed(speedup_batch1(), 2)
    << "x)\n";
  o << "batch 128: " << format_fixed(before.samples_per_s_batch128, 0) << " -> "
    << format_fixed(after.samples_per_s_batch128, 0) << " samples/s ("
    << format_fixed(speedup_batch128(), 2) << "x)\n";
  o << "wrote " << out_dir << "/{model.pt, model.safetensors, config.yaml, fuse.json}\n";
  return o.str();
}

}  // namespace mltrain::deploy
