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

struct Timing {
  double latency_ms_b1 = 0, samples_per_s_b128 = 0;
};
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
  t.latency_ms_b1 = lat[lat.size() / 2];
  t.samples_per_s_b128 = batch_throughput(f, x128);
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
        const std::string sv = "[" + std::to_string(stride) + ", " + std::to_string(stride) + "]";
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

nlohmann::json fuse_run(const std::string& where, const FuseOptions& opt) {
  auto tm = load_trained_model(where, "fuse");
  const auto& cfg = tm.cfg;
  const fs::path out = opt.out_dir.empty() ? tm.run_dir / "fused" : fs::path(opt.out_dir);
  torch::NoGradGuard ng;

  // Real batches of the test split, in order.
  data::Loader loader(tm.splits.test,
                      plain_loader_options(cfg, 128, /*shuffle=*/false, /*drop_last=*/true));
  loader.start_epoch(0);
  std::vector<torch::Tensor> xs;
  data::Batch b;
  while (static_cast<int64_t>(xs.size()) < opt.batches && loader.next(b)) xs.push_back(b.x.clone());
  if (xs.empty()) throw DataError("test split", "has no full batch of 128 to compare on");

  Forward original = [&](const torch::Tensor& x) { return tm.model->forward(x); };
  Forward fused_fwd;
  std::unique_ptr<model::Model> fused_model;
  torch::jit::Module script;
  int folded = 0;
  std::vector<std::string> folded_names;
  config::ExperimentConfig fused_cfg = cfg;
  fs::create_directories(out);

  if (cfg.model.name == "torchscript") {
    // LibTorch's own pass for TorchScript models: eval mode, then fold conv->BN pairs.
    torch::jit::Module m = torch::jit::load(cfg.model.path);
    std::map<std::string, torch::Tensor> trained;
    for (auto& [n, t] : tm.model->named_parameters()) trained[n] = t;
    for (auto& [n, t] : tm.model->named_buffers()) trained[n] = t;
    for (const auto& p : m.named_parameters(true)) p.value.detach().copy_(trained.at(p.name));
    for (const auto& p : m.named_buffers(true))
      if (trained.count(p.name)) p.value.detach().copy_(trained.at(p.name));
    m.eval();
    const int bn_before = batchnorm_calls(m);
    script = torch::jit::FoldConvBatchNorm(m);
    folded = bn_before - batchnorm_calls(script);
    if (folded > 0)
      folded_names.push_back(std::to_string(folded) +
                             " conv->BatchNorm call(s) folded by LibTorch's FoldConvBatchNorm");
    fused_fwd = [&](const torch::Tensor& x) { return script.forward({x}).toTensor(); };
  } else {
    fused_cfg.model.batchnorm = false;
    fused_model = model::build_model(fused_cfg.model, tm.splits.train.sample_shape,
                                     cfg.data.num_classes, cfg.run.seed);
    fused_model->set_training(false);
    std::map<std::string, torch::Tensor> P, B;
    for (auto& [n, t] : tm.model->named_parameters()) P[n] = t;
    for (auto& [n, t] : tm.model->named_buffers()) B[n] = t;
    std::vector<std::string> src, dst;
    for (auto& [n, t] : tm.model->named_parameters())
      if (t.dim() >= 2) src.push_back(n);
    auto fused_params = fused_model->named_parameters();
    std::map<std::string, torch::Tensor> FP;
    for (auto& [n, t] : fused_params) {
      FP[n] = t;
      if (t.dim() >= 2) dst.push_back(n);
    }
    if (src.size() != dst.size())
      throw RuntimeError("fuse",
                         "the BatchNorm-free " + cfg.model.name + " has another layer count");
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
        ++folded;
        folded_names.push_back(sm + " <- " + bn);
      }
      FP.at(dst[i]).detach().copy_(w2);
      if (!FP.count(dm + ".bias"))
        throw RuntimeError("fuse", "the BatchNorm-free layer " + dm + " has no bias");
      FP.at(dm + ".bias").detach().copy_(b2);
    }
    fused_fwd = [&](const torch::Tensor& x) { return fused_model->forward(x); };

    // The same weights as a TorchScript module (loadable by torch.jit.load and model.name=torchscript).
    script = torch::jit::Module("MltrainFused" + cfg.model.name);
    for (auto& [n, t] : fused_params)
      script.register_parameter(ident(n), t.detach().contiguous().clone(), false);
    script.define(script_source(fused_cfg.model, fused_params));
    script.eval();
    formats::save_safetensors((out / "model.safetensors").string(), fused_params,
                              {{"format", "pt"}, {"fused_from", tm.checkpoint.string()}});
    write_file_atomic((out / "config.yaml").string(), config::to_yaml(fused_cfg));
  }
  const std::string pt = (out / "model.pt").string();
  script.save(pt);

  // Proof: outputs on real batches, then speed.
  double max_diff = 0, sum_diff = 0, max_logit = 0, script_diff = 0;
  int64_t n = 0;
  torch::jit::Module reloaded = torch::jit::load(pt);
  reloaded.eval();
  for (const auto& x : xs) {
    const auto a = original(x), f = fused_fwd(x);
    const auto d = (a - f).abs();
    max_diff = std::max(max_diff, d.max().item<double>());
    sum_diff += d.sum().item<double>();
    n += d.numel();
    max_logit = std::max(max_logit, a.abs().max().item<double>());
    script_diff =
        std::max(script_diff, (reloaded.forward({x}).toTensor() - f).abs().max().item<double>());
  }
  const double allowed = opt.tolerance * std::max(1.0, max_logit);
  const auto x1 = xs[0].slice(0, 0, 1).clone(), x128 = xs[0];
  const Timing before = time_model(original, x1, x128), after = time_model(fused_fwd, x1, x128);
  nlohmann::json r = {
      {"run", tm.run_dir.string()},
      {"checkpoint", tm.checkpoint.string()},
      {"model", cfg.model.name},
      {"folded_batchnorms", folded},
      {"folded", folded_names},
      {"compared", {{"batches", xs.size()}, {"batch_size", 128}, {"split", "test"}}},
      {"max_abs_diff", max_diff},
      {"mean_abs_diff", sum_diff / std::max<int64_t>(1, n)},
      {"max_abs_logit", max_logit},
      {"tolerance", allowed},
      {"within_tolerance", max_diff <= allowed},
      {"torchscript_max_abs_diff", script_diff},
      {"before",
       {{"latency_ms_batch1", before.latency_ms_b1},
        {"samples_per_s_batch128", before.samples_per_s_b128}}},
      {"after",
       {{"latency_ms_batch1", after.latency_ms_b1},
        {"samples_per_s_batch128", after.samples_per_s_b128}}},
      {"speedup_batch1", before.latency_ms_b1 / after.latency_ms_b1},
      {"speedup_batch128", after.samples_per_s_b128 / before.samples_per_s_b128},
      {"files", {{"torchscript", pt}, {"dir", out.string()}}}};
  write_file_atomic((out / "fuse.json").string(), r.dump(2) + "\n");
  if (!(max_diff <= allowed) || !(script_diff <= allowed))
    throw RuntimeError("fuse",
                       "fused outputs differ by " +
                           std::to_string(std::max(max_diff, script_diff)) + " (allowed " +
                           std::to_string(allowed) + "); nothing to trust",
                       "report this with " + (out / "fuse.json").string());
  return r;
}

std::string fuse_text(const nlohmann::json& r) {
  std::ostringstream o;
  o << "fused " << r.value("model", "") << " from " << r.value("checkpoint", "") << ": "
    << r.value("folded_batchnorms", 0) << " BatchNorm layer(s) folded\n";
  for (const auto& f : r["folded"]) o << "  " << f.get<std::string>() << "\n";
  o << "outputs on " << r["compared"].value("batches", 0) << " test batches of 128: max |diff| "
    << config::format_double(r.value("max_abs_diff", 0.0)) << ", mean |diff| "
    << config::format_double(r.value("mean_abs_diff", 0.0)) << " (allowed "
    << config::format_double(r.value("tolerance", 0.0)) << " = 1e-4 x max(1, max |logit| "
    << format_fixed(r.value("max_abs_logit", 0.0), 2) << ")); TorchScript file vs fused: "
    << config::format_double(r.value("torchscript_max_abs_diff", 0.0)) << "\n";
  o << "batch 1:   " << format_fixed(r["before"].value("latency_ms_batch1", 0.0), 3) << " ms -> "
    << format_fixed(r["after"].value("latency_ms_batch1", 0.0), 3) << " ms ("
    << format_fixed(r.value("speedup_batch1", 0.0), 2) << "x)\n";
  o << "batch 128: " << format_fixed(r["before"].value("samples_per_s_batch128", 0.0), 0) << " -> "
    << format_fixed(r["after"].value("samples_per_s_batch128", 0.0), 0) << " samples/s ("
    << format_fixed(r.value("speedup_batch128", 0.0), 2) << "x)\n";
  o << "wrote " << r["files"].value("dir", "")
    << "/{model.pt, model.safetensors, config.yaml, fuse.json}\n";
  return o.str();
}

}  // namespace mltrain::deploy
