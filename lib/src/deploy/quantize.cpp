#include "mltrain/deploy/quantize.hpp"

#include <ATen/core/dispatch/Dispatcher.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/frontend/sugared_value.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "mltrain/config/format.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/sha256.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/deploy/observers.hpp"
#include "mltrain/deploy/fuse.hpp"
#include "mltrain/train/pipeline.hpp"

namespace fs = std::filesystem;

namespace mltrain::deploy {
using config::format_fixed;
namespace {

// Boxed call of a quantized:: operator (its packed-weight types live in headers Debian does not ship).
c10::IValue call(const char* op, const char* overload, torch::jit::Stack stack) {
  const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(op, overload);
  handle.callBoxed(&stack);
  return stack.at(0);
}

at::QEngine pick_engine(const std::string& want) {
  const auto& have = at::globalContext().supportedQEngines();
  auto has = [&](at::QEngine e) { return std::find(have.begin(), have.end(), e) != have.end(); };
  std::string names;
  for (auto e : have) names += std::string(names.empty() ? "" : ", ") + c10::toString(e);
  if (want == "onednn" || (want == "auto" && has(at::QEngine::ONEDNN))) {
    if (!has(at::QEngine::ONEDNN))
      throw RuntimeError("quantize",
                         "this LibTorch has no onednn quantized engine (has: " + names + ")",
                         "use --engine qnnpack or auto");
    return at::QEngine::ONEDNN;
  }
  if (want == "qnnpack" || (want == "auto" && has(at::QEngine::QNNPACK))) {
    if (!has(at::QEngine::QNNPACK))
      throw RuntimeError("quantize",
                         "this LibTorch has no qnnpack quantized engine (has: " + names + ")",
                         "use --engine onednn or auto");
    return at::QEngine::QNNPACK;
  }
  throw RuntimeError(
      "quantize",
      "this LibTorch has no quantized CPU engine (has: " + (names.empty() ? "none" : names) + ")",
      "use a LibTorch built with oneDNN, QNNPACK or FBGEMM quantized kernels");
}

torch::Tensor quantize_weight(const torch::Tensor& w) {
  const auto qp = per_channel_symmetric(w, -128, 127, 0);
  std::vector<double> scales;
  for (const auto& q : qp) scales.push_back(q.scale);
  return torch::quantize_per_channel(w.contiguous(), torch::tensor(scales, torch::kDouble),
                                     torch::zeros({static_cast<int64_t>(qp.size())}, torch::kLong),
                                     0, torch::kQInt8);
}

constexpr int kCalibrationVersion = 2;  // 2: entropy observer searches each side on its own

// ---- the graph ------------------------------------------------------------------------------

enum class Op { Conv, Linear, MaxPool, Flatten, GlobalAvgPool, Add };
enum class Mode { Fp32, Int8, Dynamic };

struct Node {
  Op op;
  std::string
      name;  // the layer's parameter prefix ("conv1", "stages.0.conv2", "body.1") or "<block>.add"
  std::vector<int> in;  // value indices; value 0 is the input, node k writes value k + 1
  bool relu = false;
  torch::Tensor w, b;  // folded fp32 (conv/linear), NCHW contiguous
  torch::Tensor w_cl;  // conv weights channels-last, for the fp32 path
  int64_t stride = 1, pad = 0;
  c10::IValue packed;  // int8 weights, prepacked for the engine
  Node(Op o, std::string nm, std::vector<int> i, bool r = false)
      : op(o), name(std::move(nm)), in(std::move(i)), relu(r) {}
  bool weighted() const { return op == Op::Conv || op == Op::Linear; }
  bool passthrough() const {
    return op == Op::MaxPool || op == Op::Flatten || op == Op::GlobalAvgPool;
  }
};

struct Graph {
  std::vector<Node> nodes;
  int add(Node n) {
    nodes.push_back(std::move(n));
    return static_cast<int>(nodes.size());
  }
  // The value whose observed range a value uses: pooling and flattening keep their input's qparams.
  int source(int v) const {
    while (v > 0 && nodes[static_cast<size_t>(v - 1)].passthrough())
      v = nodes[static_cast<size_t>(v - 1)].in[0];
    return v;
  }
};

// Channels-last that LibTorch also recognises as such (with one channel, NCHW and NHWC strides
// coincide and contiguous(ChannelsLast) is a no-op; an explicit copy fixes the suggested format).
// Both the fp32 and the quantized (onednn) convolutions are faster channels-last on this CPU
// (quantized 3x3, 32 channels, 28x28, batch 128: 2.3 vs 4.1 ms).
torch::Tensor channels_last(const torch::Tensor& t) {
  if (t.dim() != 4 || (t.is_contiguous(at::MemoryFormat::ChannelsLast) &&
                       t.suggest_memory_format() == at::MemoryFormat::ChannelsLast))
    return t;
  return torch::empty_like(t, t.options(), at::MemoryFormat::ChannelsLast).copy_(t);
}

// Folded weights by parameter prefix, with the BatchNorm that follows it (if the model has BN).
struct Folder {
  std::map<std::string, torch::Tensor> P, B;
  bool bn;
  std::pair<torch::Tensor, torch::Tensor> get(const std::string& layer,
                                              const std::string& norm) const {
    const auto w = P.at(layer + ".weight").contiguous();
    const auto bias = P.count(layer + ".bias") ? P.at(layer + ".bias") : torch::Tensor();
    if (bn && !norm.empty())
      return fold_batchnorm(w, bias, P.at(norm + ".weight"), P.at(norm + ".bias"),
                            B.at(norm + ".running_mean"), B.at(norm + ".running_var"), 1e-5);
    return {w, bias.defined() ? bias : torch::zeros({w.size(0)})};
  }
};

Graph build_graph(const config::ModelConfig& m, model::Model& model) {
  Folder f;
  for (auto& [n, t] : model.named_parameters()) f.P[n] = t.detach();
  for (auto& [n, t] : model.named_buffers()) f.B[n] = t.detach();
  f.bn = m.batchnorm;
  Graph g;
  auto conv = [&](const std::string& name, const std::string& norm, int in, bool relu,
                  int64_t stride) {
    Node n(Op::Conv, name, {in}, relu);
    std::tie(n.w, n.b) = f.get(name, norm);
    n.stride = stride;
    n.pad = n.w.size(2) / 2;
    n.w_cl = channels_last(n.w);
    return g.add(std::move(n));
  };
  auto linear = [&](const std::string& name, const std::string& norm, int in, bool relu) {
    Node n(Op::Linear, name, {in}, relu);
    std::tie(n.w, n.b) = f.get(name, norm);
    return g.add(std::move(n));
  };
  auto simple = [&](Op op, const std::string& name, std::vector<int> in, bool relu = false) {
    return g.add(Node(op, name, std::move(in), relu));
  };
  if (m.name == "cnn") {
    // conv -> BN -> max-pool -> ReLU in training; ReLU commutes with max-pool, so conv2d_relu then pool.
    int v = conv("conv1", "bn1", 0, true, 1);
    v = simple(Op::MaxPool, "pool1", {v});
    v = conv("conv2", "bn2", v, true, 1);
    v = simple(Op::MaxPool, "pool2", {v});
    v = simple(Op::Flatten, "flatten", {v});
    v = linear("fc1", "", v, true);
    linear("fc2", "", v, false);
  } else if (m.name == "mlp") {
    // The Sequential's indices: Flatten, then per hidden layer Linear, [BatchNorm1d], ReLU, [Dropout].
    int v = simple(Op::Flatten, "flatten", {0});
    int idx = 1;
    for (size_t h = 0; h < m.hidden.size(); ++h) {
      const std::string lin = "body." + std::to_string(idx++);
      const std::string norm = m.batchnorm ? "body." + std::to_string(idx++) : "";
      ++idx;                     // ReLU
      if (m.dropout > 0) ++idx;  // Dropout
      v = linear(lin, norm, v, true);
    }
    linear("body." + std::to_string(idx), "", v, false);
  } else if (m.name == "resnet") {
    int v = conv("stem", "stem_bn", 0, true, 1);
    int k = 0;
    for (size_t s = 0; s < m.widths.size(); ++s)
      for (int64_t b = 0; b < m.depths[s]; ++b, ++k) {
        const std::string p = "stages." + std::to_string(k);
        const int64_t stride = (b == 0 && s > 0) ? 2 : 1;
        int y = conv(p + ".conv1", p + ".bn1", v, true, stride);
        y = conv(p + ".conv2", p + ".bn2", y, false, 1);
        const int sc = f.P.count(p + ".shortcut.weight")
                           ? conv(p + ".shortcut", p + ".shortcut_bn", v, false, stride)
                           : v;
        v = simple(Op::Add, p + ".add", {y, sc}, true);
      }
    v = simple(Op::GlobalAvgPool, "pool", {v});
    v = simple(Op::Flatten, "flatten", {v});
    linear("head", "", v, false);
  } else {
    throw ConfigError(
        "model.name",
        "mltrain quantize handles the registry's mlp, cnn and resnet, not '" + m.name + "'",
        "for a TorchScript model, quantize it in Python (torch.ao.quantization) or train a "
        "registry model");
  }
  return g;
}

// One pass over the graph; each node runs as its mode says, converting its inputs between float and
// quantized as needed (qp: the range each value was calibrated to). acts (fp32 passes): every value.
torch::Tensor run_graph(const Graph& g, const torch::Tensor& x, const std::vector<Mode>& mode,
                        const std::vector<QParams>& qp,
                        std::vector<torch::Tensor>* acts = nullptr) {
  std::vector<torch::Tensor> v(g.nodes.size() + 1);
  v[0] = x.dim() == 4 ? channels_last(x) : x.contiguous();
  auto as_q = [&](int i) {
    if (v[static_cast<size_t>(i)].is_quantized()) return v[static_cast<size_t>(i)];
    const auto& q = qp[static_cast<size_t>(g.source(i))];
    return quantize_activation(v[static_cast<size_t>(i)], q);
  };
  auto as_f = [&](int i) {
    return v[static_cast<size_t>(i)].is_quantized() ? v[static_cast<size_t>(i)].dequantize()
                                                    : v[static_cast<size_t>(i)];
  };
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    const Mode md = mode[k];
    const QParams& out = qp[k + 1];
    torch::Tensor y;
    switch (n.op) {
      case Op::Conv:
        if (md == Mode::Int8)
          y = call(n.relu ? "quantized::conv2d_relu" : "quantized::conv2d", "new",
                   {as_q(n.in[0]), n.packed, double(out.scale), out.zero_point})
                  .toTensor();
        else {
          y = torch::conv2d(as_f(n.in[0]), n.w_cl, n.b, n.stride, n.pad);
          if (n.relu) y = torch::relu(y);
        }
        break;
      case Op::Linear:
        if (md == Mode::Int8)
          y = call(n.relu ? "quantized::linear_relu" : "quantized::linear", "",
                   {as_q(n.in[0]), n.packed, double(out.scale), out.zero_point})
                  .toTensor();
        else if (md == Mode::Dynamic)
          y = call(n.relu ? "quantized::linear_relu_dynamic" : "quantized::linear_dynamic", "",
                   {as_f(n.in[0]), n.packed, false})
                  .toTensor();
        else {
          y = torch::linear(as_f(n.in[0]), n.w, n.b);
          if (n.relu) y = torch::relu(y);
        }
        break;
      case Op::MaxPool:  // quantized max_pool2d in LibTorch 1.13 needs every argument spelled out
        y = torch::max_pool2d(v[static_cast<size_t>(n.in[0])], {2, 2}, {2, 2}, {0, 0}, {1, 1});
        break;
      case Op::Flatten: {
        const auto& t = v[static_cast<size_t>(n.in[0])];
        y = t.contiguous().reshape({t.size(0), -1});
        break;
      }
      case Op::GlobalAvgPool:
        y = torch::adaptive_avg_pool2d(v[static_cast<size_t>(n.in[0])], {1, 1});
        break;
      case Op::Add:
        if (md == Mode::Int8)
          y = call(n.relu ? "quantized::add_relu" : "quantized::add", "",
                   {as_q(n.in[0]), as_q(n.in[1]), double(out.scale), out.zero_point})
                  .toTensor();
        else {
          y = as_f(n.in[0]) + as_f(n.in[1]);
          if (n.relu) y = torch::relu(y);
        }
        break;
    }
    v[k + 1] = y;
  }
  if (acts) *acts = v;
  return as_f(static_cast<int>(g.nodes.size()));
}

// define()'s default resolver knows only `torch.` (as aten::); this one adds `quantized.` for the
// quantized:: operators. Saved code names them as PyTorch does (ops.quantized.conv2d_relu).
struct QuantizedOpsResolver : torch::jit::Resolver {
  std::shared_ptr<torch::jit::SugaredValue> resolveValue(const std::string& name,
                                                         torch::jit::GraphFunction&,
                                                         const torch::jit::SourceRange&) override {
    if (name == "torch") return std::make_shared<torch::jit::BuiltinModule>("aten");
    if (name == "quantized") return std::make_shared<torch::jit::BuiltinModule>("quantized");
    return nullptr;
  }
  c10::TypePtr resolveType(const std::string&, const torch::jit::SourceRange&) override {
    return nullptr;
  }
};

// The graph as a TorchScript module, the deployable int8 model: int8 nodes hold their prepacked
// weights as attributes (LibTorch serialises them unpacked and repacks them for the loading
// process's engine), fp32 nodes their folded weights, and forward() mirrors run_graph with every
// activation scale and zero point as a literal. Loads in PyTorch (torch.jit.load) or LibTorch
// with no mltrain code; the input is normalised as in training.
torch::jit::Module to_script(const Graph& g, const std::vector<Mode>& mode,
                             const std::vector<QParams>& qp, const std::string& model_name,
                             int64_t input_dims) {
  torch::jit::Module m("MltrainInt8" + model_name);
  auto lit = [](double d) {  // exact: 17 significant digits round-trip a double
    char b[40];
    std::snprintf(b, sizeof b, "%.17g", d);
    std::string s = b;
    if (s.find_first_of(".eE") == std::string::npos) s += ".0";
    return s;
  };
  std::vector<bool> quantized(g.nodes.size() + 1, false);
  auto v = [](int i) { return std::string("v") + std::to_string(i); };
  auto as_q = [&](int i) {
    if (quantized[static_cast<size_t>(i)]) return v(i);
    const auto& q = qp[static_cast<size_t>(g.source(i))];
    return "torch.quantize_per_tensor(" + v(i) + ", " + lit(q.scale) + ", " +
           std::to_string(q.zero_point) + ", 13)";  // 13: torch.quint8
  };
  auto as_f = [&](int i) {
    return quantized[static_cast<size_t>(i)] ? v(i) + ".dequantize()" : v(i);
  };
  std::ostringstream s;
  s << "def forward(self, x: Tensor) -> Tensor:\n";
  // memory_format=2 is torch.channels_last (no such name resolves here, nor torch.quint8)
  s << "    v0 = " << (input_dims == 4 ? "x.contiguous(memory_format=2)" : "x.contiguous()")
    << "\n";
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    const Mode md = mode[k];
    const int in0 = n.in[0];
    const std::string out_q = lit(qp[k + 1].scale) + ", " + std::to_string(qp[k + 1].zero_point);
    const std::string attr = "self.n" + std::to_string(k);
    std::string y;
    bool q = false;
    if (n.weighted() && md != Mode::Fp32) {
      m.register_attribute("n" + std::to_string(k), n.packed.type(), n.packed);
    } else if (n.weighted()) {
      m.register_parameter("n" + std::to_string(k) + "_w",
                           (n.op == Op::Conv ? n.w_cl : n.w).clone(), false);
      m.register_parameter("n" + std::to_string(k) + "_b", n.b.clone(), false);
    }
    auto relu = [&](const std::string& e) { return n.relu ? "torch.relu(" + e + ")" : e; };
    switch (n.op) {
      case Op::Conv:
        if (md == Mode::Int8)
          y = std::string("quantized.") + (n.relu ? "conv2d_relu" : "conv2d") + "(" + as_q(in0) +
              ", " + attr + ", " + out_q + ")",
          q = true;
        else
          y = relu("torch.conv2d(" + as_f(in0) + ", " + attr + "_w, " + attr + "_b, [" +
                   std::to_string(n.stride) + ", " + std::to_string(n.stride) + "], [" +
                   std::to_string(n.pad) + ", " + std::to_string(n.pad) + "])");
        break;
      case Op::Linear:
        if (md == Mode::Int8)
          y = std::string("quantized.") + (n.relu ? "linear_relu" : "linear") + "(" + as_q(in0) +
              ", " + attr + ", " + out_q + ")",
          q = true;
        else if (md == Mode::Dynamic)
          y = std::string("quantized.") + (n.relu ? "linear_relu_dynamic" : "linear_dynamic") +
              "(" + as_f(in0) + ", " + attr + ", False)";
        else
          y = relu("torch.linear(" + as_f(in0) + ", " + attr + "_w, " + attr + "_b)");
        break;
      case Op::MaxPool:
        y = "torch.max_pool2d(" + v(in0) + ", [2, 2], [2, 2], [0, 0], [1, 1])",
        q = quantized[static_cast<size_t>(in0)];
        break;
      case Op::Flatten:
        y = v(in0) + ".contiguous().reshape([" + v(in0) + ".size(0), -1])",
        q = quantized[static_cast<size_t>(in0)];
        break;
      case Op::GlobalAvgPool:
        y = "torch.adaptive_avg_pool2d(" + v(in0) + ", [1, 1])",
        q = quantized[static_cast<size_t>(in0)];
        break;
      case Op::Add:
        if (md == Mode::Int8)
          y = std::string("quantized.") + (n.relu ? "add_relu" : "add") + "(" + as_q(in0) + ", " +
              as_q(n.in[1]) + ", " + out_q + ")",
          q = true;
        else
          y = relu(as_f(in0) + " + " + as_f(n.in[1]));
        break;
    }
    quantized[k + 1] = q;
    s << "    " << v(static_cast<int>(k + 1)) << " = " << y << "\n";
  }
  s << "    return " << as_f(static_cast<int>(g.nodes.size())) << "\n";
  m.define(s.str(), std::make_shared<QuantizedOpsResolver>());
  m.eval();
  return m;
}

struct Eval {
  int64_t n = 0, right = 0;
  torch::Tensor pred;  // every prediction, in order
  double accuracy() const { return n ? double(right) / n : 0.0; }
};

// Loads the fixed samples once (the sensitivity pass reruns the graph on them per layer).
std::vector<std::pair<torch::Tensor, torch::Tensor>> take_batches(
    const data::Dataset& ds, const config::ExperimentConfig& cfg, int64_t limit) {
  data::Loader l(ds, train::plain_loader_options(cfg, 500, /*shuffle=*/false, /*drop_last=*/false));
  l.start_epoch(0);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> out;
  data::Batch b;
  int64_t n = 0;
  while (n < limit && l.next(b)) {
    const int64_t take = std::min<int64_t>(b.y.size(0), limit - n);
    out.emplace_back(b.x.slice(0, 0, take).contiguous().clone(), b.y.slice(0, 0, take).clone());
    n += take;
  }
  return out;
}

Eval evaluate(const std::vector<std::pair<torch::Tensor, torch::Tensor>>& batches,
              const std::function<torch::Tensor(const torch::Tensor&)>& f) {
  Eval e;
  std::vector<torch::Tensor> preds;
  for (const auto& [x, y] : batches) {
    preds.push_back(f(x).argmax(1));
    e.right += preds.back().eq(y).sum().item<int64_t>();
    e.n += y.size(0);
  }
  e.pred = torch::cat(preds);
  return e;
}

}  // namespace

namespace {

using Batches = std::vector<std::pair<torch::Tensor, torch::Tensor>>;
using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

// Which layers run quantized: every conv/linear/add (static) or every linear (dynamic), less the
// excluded ones, which must exist.
std::vector<Mode> choose_modes(const Graph& g, const QuantizeOptions& opt,
                               const std::string& model) {
  const bool dynamic = opt.mode == "dynamic";
  std::set<std::string> names, excluded(opt.exclude.begin(), opt.exclude.end());
  for (const auto& n : g.nodes)
    if (n.weighted() || n.op == Op::Add) names.insert(n.name);
  for (const auto& e : excluded)
    if (!names.count(e)) {
      std::string all;
      for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
      throw ConfigError("--exclude", "no quantizable layer named '" + e + "' in this " + model,
                        "layers: " + all);
    }
  std::vector<Mode> mode(g.nodes.size(), Mode::Fp32);
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const auto& n = g.nodes[k];
    if (excluded.count(n.name)) continue;
    if (dynamic ? n.op == Op::Linear : (n.weighted() || n.op == Op::Add))
      mode[k] = dynamic ? Mode::Dynamic : Mode::Int8;
  }
  return mode;
}

// Observed ranges of the input and every conv/linear/add output over the calibration batches,
// cached under a key of the weights, the batches' bytes, the observer and the graph.
nlohmann::json observed_ranges(const Graph& g, const train::TrainedModel& tm,
                               const std::vector<torch::Tensor>& xs, const QuantizeOptions& opt,
                               const fs::path& out, std::string* cache_state) {
  const size_t N = g.nodes.size();
  Sha256 h;
  // kCalibrationVersion changes whenever an observer's algorithm does, so stale ranges are not reused.
  const std::string head = std::to_string(kCalibrationVersion) + "|" +
                           sha256_file((tm.checkpoint / "model.safetensors").string()) + "|" +
                           tm.cfg.model.name + "|" + opt.observer + "|" + std::to_string(N);
  h.update(head.data(), head.size());
  for (const auto& x : xs)
    h.update(x.data_ptr(), static_cast<size_t>(x.numel()) * x.element_size());
  const std::string key = h.hex().substr(0, 24);
  const bool use_cache = opt.cache_dir != "off";
  const fs::path cache =
      (opt.cache_dir.empty() ? out / "calib_cache" : fs::path(opt.cache_dir)) / (key + ".json");
  nlohmann::json ranges;
  if (use_cache && fs::exists(cache)) {
    try {
      std::ifstream in(cache);
      ranges = nlohmann::json::parse(in).at("ranges");
    } catch (const std::exception&) {
      ranges = nullptr;  // a damaged cache entry is recomputed and rewritten
    }
  }
  const bool hit = ranges.is_array() && ranges.size() == N + 1;
  *cache_state = !use_cache ? "off" : (hit ? "hit " : "stored ") + cache.string();
  if (hit) return ranges;
  std::vector<std::unique_ptr<RangeObserver>> obs(N + 1);
  for (size_t v = 0; v <= N; ++v)
    if (static_cast<int>(v) == g.source(static_cast<int>(v)))
      // The logits keep their full range whatever the observer: clipping them reorders the classes.
      obs[v] = v == N ? std::make_unique<MinMaxObserver>() : make_observer(opt.observer);
  const std::vector<Mode> fp32(N, Mode::Fp32);
  const std::vector<QParams> none(N + 1);
  for (const auto& x : xs) {
    std::vector<torch::Tensor> acts;
    run_graph(g, x, fp32, none, &acts);
    for (size_t v = 0; v <= N; ++v)
      if (obs[v]) obs[v]->observe(acts[v]);
  }
  ranges = nlohmann::json::array();
  for (size_t v = 0; v <= N; ++v) {
    const auto [lo, hi] = obs[static_cast<size_t>(g.source(static_cast<int>(v)))]->range();
    ranges.push_back({lo, hi});
  }
  if (use_cache) {
    fs::create_directories(cache.parent_path());
    write_file_atomic(
        cache.string(),
        nlohmann::json{{"key", key}, {"observer", opt.observer}, {"ranges", ranges}}.dump() + "\n");
  }
  return ranges;
}

// Static mode: activation qparams from training batches (calibration). Dynamic: none needed.
std::vector<QParams> calibrate(const Graph& g, const train::TrainedModel& tm,
                               const QuantizeOptions& opt, const fs::path& out, QuantizeReport& r) {
  const size_t N = g.nodes.size();
  std::vector<QParams> qp(N + 1);
  r.calibration_cache = "not needed (dynamic mode)";
  if (opt.mode == "dynamic") return qp;
  data::Loader calib(tm.splits.train, train::plain_loader_options(tm.cfg, 128, /*shuffle=*/true,
                                                                  /*drop_last=*/true));
  calib.start_epoch(0);
  std::vector<torch::Tensor> xs;
  data::Batch b;
  while (static_cast<int64_t>(xs.size()) < opt.calib_batches && calib.next(b))
    xs.push_back(b.x.contiguous().clone());
  r.calibration_batches = static_cast<int64_t>(xs.size());
  if (xs.empty()) throw DataError("training split", "has no batch to calibrate on");
  const auto ranges = observed_ranges(g, tm, xs, opt, out, &r.calibration_cache);
  for (size_t v = 0; v <= N; ++v) {
    qp[v] = affine_qparams(ranges[v][0].get<float>(), ranges[v][1].get<float>(), 0, 255);
    if (v == 0 || !g.nodes[v - 1].passthrough())
      r.activation_qparams.push_back(
          {v == 0 ? "input" : g.nodes[v - 1].name, qp[v].scale, qp[v].zero_point});
  }
  return qp;
}

// int8 weights, prepacked (every layer when the sensitivity pass will need them); sizes and the
// per-layer table.
void prepack_weights(Graph& g, const std::vector<Mode>& mode, bool all, QuantizeReport& r) {
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    auto& n = g.nodes[k];
    if (n.weighted()) {
      const int64_t fbytes = (n.w.numel() + n.b.numel()) * 4;
      r.fp32_weight_bytes += fbytes;
      if (mode[k] == Mode::Fp32 && !all) {
        r.int8_weight_bytes += fbytes;
      } else {
        const auto qw = quantize_weight(n.w);
        if (n.op == Op::Conv)
          n.packed =
              call("quantized::conv2d_prepack", "",
                   {qw, n.b, c10::List<int64_t>({n.stride, n.stride}),
                    c10::List<int64_t>({n.pad, n.pad}), c10::List<int64_t>({1, 1}), int64_t{1}});
        else
          n.packed = call("quantized::linear_prepack", "", {qw, n.b});
        r.int8_weight_bytes +=
            mode[k] == Mode::Fp32
                ? fbytes
                : n.w.numel() + n.w.size(0) * 8 /* scale + zero point */ + n.b.numel() * 4;
      }
    }
    if (n.weighted() || n.op == Op::Add)
      r.layers.push_back({n.name,
                          n.op == Op::Conv     ? "conv"
                          : n.op == Op::Linear ? "linear"
                                               : "add",
                          mode[k] == Mode::Int8      ? "int8"
                          : mode[k] == Mode::Dynamic ? "dynamic int8"
                                                     : "fp32"});
  }
}

// Test accuracy of the trained model (as it runs in training) against the quantized forward;
// returns the first test batch (at most 128 samples) for the speed and script checks.
torch::Tensor test_accuracy(const train::TrainedModel& tm, const Forward& q_forward,
                            QuantizeReport& r) {
  data::Loader test(tm.splits.test, train::plain_loader_options(tm.cfg, 500, /*shuffle=*/false,
                                                                /*drop_last=*/false));
  test.start_epoch(0);
  torch::Tensor first;
  data::Batch b;
  while (test.next(b)) {
    const auto x = b.x.contiguous();
    const auto pf = tm.model->forward(x).argmax(1), pq = q_forward(x).argmax(1);
    r.fp32_right += pf.eq(b.y).sum().item<int64_t>();
    r.int8_right += pq.eq(b.y).sum().item<int64_t>();
    r.agree += pf.eq(pq).sum().item<int64_t>();
    r.test_samples += b.y.size(0);
    if (!first.defined()) first = x.slice(0, 0, std::min<int64_t>(128, x.size(0))).clone();
  }
  return first;
}

// The deployable model: TorchScript, saved, reloaded as a user would, and checked against the
// graph on the first test batch.
void export_script(const Graph& g, const std::vector<Mode>& mode, const std::vector<QParams>& qp,
                   const train::TrainedModel& tm, const Forward& q_forward,
                   const torch::Tensor& first, const fs::path& out, QuantizeReport& r) {
  fs::create_directories(out);
  const fs::path pt = out / "model_int8.pt";
  {
    auto script = to_script(g, mode, qp, tm.cfg.model.name, first.dim());
    const fs::path tmp = out / "model_int8.pt.tmp";
    script.save(tmp.string());
    fs::rename(tmp, pt);
  }
  torch::jit::Module reloaded = torch::jit::load(pt.string());
  reloaded.eval();
  const auto want = q_forward(first), got = reloaded.forward({first}).toTensor();
  auto& s = r.script;
  s.path = pt.string();
  s.bytes = static_cast<int64_t>(fs::file_size(pt));
  s.max_abs_diff = (want - got).abs().max().item<double>();
  s.prediction_agreement =
      want.argmax(1).eq(got.argmax(1)).to(torch::kDouble).mean().item<double>();
  s.samples_per_s_batch128 = batch_throughput(
      [&](const torch::Tensor& x) { return reloaded.forward({x}).toTensor(); }, first);
  s.input_shape = first.sizes().slice(1).vec();
  s.input_mean = tm.cfg.data.mean;
  s.input_std = tm.cfg.data.std;
}

// Each layer quantized alone (everything else fp32), on the eval split; layers that lose more than
// the threshold are proposed for exclusion.
QuantizeReport::Sensitivity sensitivity(const Graph& g, const std::vector<QParams>& qp,
                                        const train::TrainedModel& tm, const QuantizeOptions& opt) {
  const size_t N = g.nodes.size();
  const bool dynamic = opt.mode == "dynamic";
  const Batches sb = take_batches(tm.splits.eval, tm.cfg, opt.sensitivity_samples);
  const std::vector<Mode> fp32(N, Mode::Fp32);
  const Eval base = evaluate(sb, [&](const torch::Tensor& x) { return run_graph(g, x, fp32, qp); });
  QuantizeReport::Sensitivity s{tm.splits.eval_name,       base.n, base.accuracy(),
                                opt.sensitivity_threshold, {},     {}};
  for (size_t k = 0; k < N; ++k) {
    const auto& nd = g.nodes[k];
    if (!(dynamic ? nd.op == Op::Linear : (nd.weighted() || nd.op == Op::Add))) continue;
    std::vector<Mode> one(N, Mode::Fp32);
    one[k] = dynamic ? Mode::Dynamic : Mode::Int8;
    const Eval e = evaluate(sb, [&](const torch::Tensor& x) { return run_graph(g, x, one, qp); });
    const double drop = 100.0 * (base.accuracy() - e.accuracy());
    s.layers.push_back({nd.name, e.accuracy(), drop, e.pred.ne(base.pred).sum().item<int64_t>()});
    if (drop > opt.sensitivity_threshold + 1e-9) s.proposed_exclude.push_back(nd.name);
  }
  std::stable_sort(s.layers.begin(), s.layers.end(),
                   [](const auto& a, const auto& c) { return a.drop_points > c.drop_points; });
  return s;
}

}  // namespace

QuantizeReport quantize_run(const std::string& where, const QuantizeOptions& opt) {
  if (opt.mode != "static" && opt.mode != "dynamic")
    throw ConfigError("--mode", "unknown mode '" + opt.mode + "'", "use static or dynamic");
  auto tm = train::load_trained_model(where, "quantize");
  const at::QEngine engine = pick_engine(opt.engine);
  at::globalContext().setQEngine(engine);
  torch::NoGradGuard ng;
  tm.model->set_training(false);
  const fs::path out = opt.out_dir.empty() ? tm.run_dir / "quantized" : fs::path(opt.out_dir);
  QuantizeReport r;
  r.run = tm.run_dir.string();
  r.checkpoint = tm.checkpoint.string();
  r.model = tm.cfg.model.name;
  r.mode = opt.mode;
  r.engine = c10::toString(engine);
  r.observer = opt.mode == "dynamic" ? "none (dynamic)" : opt.observer;
  r.excluded = opt.exclude;

  Graph g = build_graph(tm.cfg.model, *tm.model);  // BatchNorm folded
  const std::vector<Mode> mode = choose_modes(g, opt, tm.cfg.model.name);
  const std::vector<QParams> qp = calibrate(g, tm, opt, out, r);
  prepack_weights(g, mode, /*all=*/opt.sensitivity, r);
  const Forward q_forward = [&](const torch::Tensor& x) { return run_graph(g, x, mode, qp); };
  const torch::Tensor first = test_accuracy(tm, q_forward, r);
  // Speed at batch 128: the trained model as configured (channels-last, fp32) vs quantized.
  r.fp32_samples_per_s_batch128 =
      batch_throughput([&](const torch::Tensor& x) { return tm.model->forward(x); }, first);
  r.int8_samples_per_s_batch128 = batch_throughput(q_forward, first);
  export_script(g, mode, qp, tm, q_forward, first, out, r);
  if (opt.sensitivity) r.sensitivity = sensitivity(g, qp, tm, opt);
  write_file_atomic((out / "quantize.json").string(), r.to_json().dump(2) + "\n");
  return r;
}

nlohmann::json QuantizeReport::to_json() const {
  nlohmann::json layer_rows = nlohmann::json::array(), qparams = nlohmann::json::array();
  for (const auto& l : layers)
    layer_rows.push_back({{"name", l.name}, {"op", l.op}, {"mode", l.mode}});
  for (const auto& q : activation_qparams)
    qparams.push_back({{"at", q.at}, {"scale", q.scale}, {"zero_point", q.zero_point}});
  nlohmann::json j = {
      {"run", run},
      {"checkpoint", checkpoint},
      {"model", model},
      {"mode", mode},
      {"engine", engine},
      {"observer", observer},
      {"calibration_batches", calibration_batches},
      {"calibration_cache", calibration_cache},
      {"excluded", excluded},
      {"layers", layer_rows},
      {"test_samples", test_samples},
      {"fp32_accuracy", fp32_accuracy()},
      {"int8_accuracy", int8_accuracy()},
      {"accuracy_drop_points", accuracy_drop_points()},
      {"prediction_agreement", prediction_agreement()},
      {"fp32_weight_bytes", fp32_weight_bytes},
      {"int8_weight_bytes", int8_weight_bytes},
      {"size_ratio", size_ratio()},
      {"fp32_samples_per_s_batch128", fp32_samples_per_s_batch128},
      {"int8_samples_per_s_batch128", int8_samples_per_s_batch128},
      {"speedup_batch128", speedup_batch128()},
      {"script",
       {{"path", script.path},
        {"bytes", script.bytes},
        {"max_abs_diff", script.max_abs_diff},
        {"prediction_agreement", script.prediction_agreement},
        {"samples_per_s_batch128", script.samples_per_s_batch128},
        {"input",
         {{"shape", script.input_shape}, {"mean", script.input_mean}, {"std", script.input_std}}}}},
      {"activation_qparams", qparams}};
  if (sensitivity) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& s : sensitivity->layers)
      rows.push_back({{"layer", s.layer},
                      {"accuracy", s.accuracy},
                      {"drop_points", s.drop_points},
                      {"changed_predictions", s.changed_predictions}});
    j["sensitivity"] = {{"split", sensitivity->split},
                        {"samples", sensitivity->samples},
                        {"fp32_accuracy", sensitivity->fp32_accuracy},
                        {"threshold_points", sensitivity->threshold_points},
                        {"layers", rows},
                        {"proposed_exclude", sensitivity->proposed_exclude}};
  }
  return j;
}

std::string QuantizeReport::to_text() const {
  std::ostringstream o;
  const bool dyn = mode == "dynamic";
  o << model << " int8, " << mode << " (" << engine << " engine";
  if (!dyn) o << ", " << observer << " observer, " << calibration_batches << " calibration batches";
  o << ") from " << checkpoint << "\n";
  if (!dyn) o << "calibration cache: " << calibration_cache << "\n";
  std::string q, f;
  for (const auto& l : layers) {
    std::string& list = l.mode == "fp32" ? f : q;
    list += (list.empty() ? "" : " ") + l.name;
  }
  o << "quantized: " << (q.empty() ? "-" : q) << "\nkept fp32: " << (f.empty() ? "-" : f) << "\n";
  o << "test accuracy: fp32 " << format_fixed(100 * fp32_accuracy(), 2) << " %, int8 "
    << format_fixed(100 * int8_accuracy(), 2) << " % (drop "
    << format_fixed(accuracy_drop_points(), 2) << " points; predictions agree on "
    << format_fixed(100 * prediction_agreement(), 2) << " %)\n";
  o << "weights: " << fp32_weight_bytes << " -> " << int8_weight_bytes << " bytes ("
    << format_fixed(size_ratio(), 2) << "x smaller)\n";
  o << "batch 128: fp32 " << format_fixed(fp32_samples_per_s_batch128, 0) << " -> int8 "
    << format_fixed(int8_samples_per_s_batch128, 0) << " samples/s ("
    << format_fixed(speedup_batch128(), 2) << "x)\n";
  o << "model: " << script.path << " (TorchScript, " << script.bytes
    << " bytes; reloaded: max |diff| " << script.max_abs_diff << " on the first test batch, "
    << format_fixed(script.samples_per_s_batch128, 0)
    << " samples/s at batch 128; input normalised (x / 255 - " << script.input_mean << ") / "
    << script.input_std << ")\n";
  if (sensitivity) {
    const auto& s = *sensitivity;
    o << "sensitivity (one layer quantized at a time, " << s.samples << " " << s.split
      << " samples, fp32 " << format_fixed(100 * s.fp32_accuracy, 2) << " %):\n";
    for (const auto& l : s.layers)
      o << "  " << l.layer << "  " << format_fixed(l.drop_points, 2) << " points, "
        << l.changed_predictions << " predictions changed\n";
    std::string p;
    for (const auto& e : s.proposed_exclude) p += (p.empty() ? "" : ",") + e;
    o << "proposed: "
      << (p.empty() ? "exclude nothing (no layer loses more than " +
                          format_fixed(s.threshold_points, 2) + " points)"
                    : "--exclude " + p)
      << "\n";
  }
  return o.str();
}

}  // namespace mltrain::deploy
