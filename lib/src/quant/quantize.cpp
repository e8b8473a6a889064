#include "mltrain/quant/quantize.hpp"

#include <ATen/core/dispatch/Dispatcher.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <filesystem>
#include <sstream>

#include "mltrain/config/format.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/quant/observers.hpp"
#include "mltrain/train/fuse.hpp"
#include "mltrain/train/trained_model.hpp"

namespace fs = std::filesystem;
namespace F = torch::nn::functional;

namespace mltrain::quant {
using config::format_fixed;
namespace {

// Boxed call of a quantized:: operator (its packed-weight types live in headers Debian does not ship).
c10::IValue call(const char* op, const char* overload, torch::jit::Stack stack) {
  const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(op, overload);
  handle.callBoxed(&stack);
  return stack.at(0);
}

struct Layer {
  torch::Tensor w, b;       // folded fp32
  c10::IValue packed;       // int8 weights, prepacked for the engine
  QParams out;              // output activation qparams
  int64_t weight_bytes = 0; // int8 weights + fp32 scales + bias
};

at::QEngine pick_engine(const std::string& want) {
  const auto& have = at::globalContext().supportedQEngines();
  auto has = [&](at::QEngine e) { return std::find(have.begin(), have.end(), e) != have.end(); };
  std::string names;
  for (auto e : have) names += std::string(names.empty() ? "" : ", ") + c10::toString(e);
  if (want == "onednn" || (want == "auto" && has(at::QEngine::ONEDNN))) {
    if (!has(at::QEngine::ONEDNN)) throw RuntimeError("quantize", "this LibTorch has no onednn quantized engine (has: " + names + ")", "use --engine qnnpack or auto");
    return at::QEngine::ONEDNN;
  }
  if (want == "qnnpack" || (want == "auto" && has(at::QEngine::QNNPACK))) {
    if (!has(at::QEngine::QNNPACK)) throw RuntimeError("quantize", "this LibTorch has no qnnpack quantized engine (has: " + names + ")", "use --engine onednn or auto");
    return at::QEngine::QNNPACK;
  }
  throw RuntimeError("quantize", "this LibTorch has no quantized CPU engine (has: " + (names.empty() ? "none" : names) + ")",
                     "use a LibTorch built with oneDNN, QNNPACK or FBGEMM quantized kernels");
}

torch::Tensor quantize_weight(const torch::Tensor& w) {
  const auto qp = per_channel_symmetric(w, -128, 127, 0);
  std::vector<double> scales;
  for (const auto& q : qp) scales.push_back(q.scale);
  return torch::quantize_per_channel(w.contiguous(), torch::tensor(scales, torch::kDouble),
                                     torch::zeros({static_cast<int64_t>(qp.size())}, torch::kLong), 0, torch::kQInt8);
}

}  // namespace

nlohmann::json quantize_run(const std::string& where, const QuantizeOptions& opt) {
  auto tm = train::load_trained_model(where, "quantize");
  const auto& cfg = tm.cfg;
  if (cfg.model.name != "cnn")
    throw ConfigError("model.name", "mltrain quantize handles the registry cnn so far, not '" + cfg.model.name + "'",
                      "quantize a cnn run; mlp/resnet/torchscript are not built yet");
  const at::QEngine engine = pick_engine(opt.engine);
  at::globalContext().setQEngine(engine);
  torch::NoGradGuard ng;
  const fs::path out = opt.out_dir.empty() ? tm.run_dir / "quantized" : fs::path(opt.out_dir);

  // 1. BatchNorm folded (the algebra of `mltrain fuse`), fp32, NCHW.
  std::map<std::string, torch::Tensor> P, B;
  for (auto& [n, t] : tm.model->named_parameters()) P[n] = t.contiguous();
  for (auto& [n, t] : tm.model->named_buffers()) B[n] = t;
  std::vector<Layer> L(4);
  const char* names[] = {"conv1", "conv2", "fc1", "fc2"};
  for (int i = 0; i < 4; ++i) {
    const std::string n = names[i];
    const std::string bn = i == 0 ? "bn1" : i == 1 ? "bn2" : "";
    if (!bn.empty() && cfg.model.batchnorm) {
      std::tie(L[i].w, L[i].b) = train::fold_batchnorm(P.at(n + ".weight"), torch::Tensor(), P.at(bn + ".weight"),
                                                       P.at(bn + ".bias"), B.at(bn + ".running_mean"), B.at(bn + ".running_var"), 1e-5);
    } else {
      L[i].w = P.at(n + ".weight").contiguous();
      L[i].b = P.at(n + ".bias");
    }
  }
  const int64_t pad = L[0].w.size(2) / 2;
  auto fp32_forward = [&](const torch::Tensor& x, std::vector<torch::Tensor>* acts) {
    auto a1 = torch::relu(torch::conv2d(x, L[0].w, L[0].b, 1, pad));
    auto a2 = torch::relu(torch::conv2d(torch::max_pool2d(a1, 2), L[1].w, L[1].b, 1, pad));
    auto a3 = torch::relu(torch::linear(torch::max_pool2d(a2, 2).flatten(1), L[2].w, L[2].b));
    auto a4 = torch::linear(a3, L[3].w, L[3].b);
    if (acts) *acts = {x, a1, a2, a3, a4};
    return a4;
  };

  // 2. Calibration: observers on the input and each layer's output, over training batches.
  data::Loader calib(tm.splits.train, train::plain_loader_options(cfg, 128, /*shuffle=*/true, /*drop_last=*/true));
  calib.start_epoch(0);
  std::vector<std::unique_ptr<RangeObserver>> obs;
  // The logits keep their full range whatever the observer: clipping them reorders the classes.
  for (int i = 0; i < 5; ++i) obs.push_back(i == 4 ? std::make_unique<MinMaxObserver>() : make_observer(opt.observer));
  data::Batch b;
  int64_t seen = 0;
  while (seen < opt.calib_batches && calib.next(b)) {
    std::vector<torch::Tensor> acts;
    fp32_forward(b.x.contiguous(), &acts);
    for (int i = 0; i < 5; ++i) obs[static_cast<size_t>(i)]->observe(acts[static_cast<size_t>(i)]);
    ++seen;
  }
  if (seen == 0) throw DataError("training split", "has no batch to calibrate on");
  auto qp = [&](int i) {
    const auto [lo_, hi_] = obs[static_cast<size_t>(i)]->range();
    return affine_qparams(lo_, hi_, 0, 255);
  };
  const QParams in = qp(0);

  // 3. int8 weights, prepacked.
  int64_t fp32_bytes = 0, int8_bytes = 0;
  for (int i = 0; i < 4; ++i) {
    auto& l = L[static_cast<size_t>(i)];
    l.out = qp(i + 1);
    const auto qw = quantize_weight(l.w);
    if (i < 2)
      l.packed = call("quantized::conv2d_prepack", "",
                      {qw, l.b, c10::List<int64_t>({1, 1}), c10::List<int64_t>({pad, pad}), c10::List<int64_t>({1, 1}), int64_t{1}});
    else
      l.packed = call("quantized::linear_prepack", "", {qw, l.b});
    fp32_bytes += (l.w.numel() + l.b.numel()) * 4;
    l.weight_bytes = l.w.numel() + l.w.size(0) * 8 /* scale + zero point */ + l.b.numel() * 4;
    int8_bytes += l.weight_bytes;
  }
  auto int8_forward = [&](const torch::Tensor& x) {
    auto q = torch::quantize_per_tensor(x.contiguous(), in.scale, in.zero_point, torch::kQUInt8);
    q = call("quantized::conv2d_relu", "new", {q, L[0].packed, double(L[0].out.scale), L[0].out.zero_point}).toTensor();
    q = torch::max_pool2d(q, {2, 2}, {2, 2}, {0, 0}, {1, 1});
    q = call("quantized::conv2d_relu", "new", {q, L[1].packed, double(L[1].out.scale), L[1].out.zero_point}).toTensor();
    q = torch::max_pool2d(q, {2, 2}, {2, 2}, {0, 0}, {1, 1}).contiguous().reshape({x.size(0), -1});
    q = call("quantized::linear_relu", "", {q, L[2].packed, double(L[2].out.scale), L[2].out.zero_point}).toTensor();
    q = call("quantized::linear", "", {q, L[3].packed, double(L[3].out.scale), L[3].out.zero_point}).toTensor();
    return q.dequantize();
  };

  // 4. Test accuracy: the trained model (as it runs in training) against int8.
  data::Loader test(tm.splits.test, train::plain_loader_options(cfg, 500, /*shuffle=*/false, /*drop_last=*/false));
  test.start_epoch(0);
  int64_t n = 0, right_fp = 0, right_q = 0, agree = 0;
  torch::Tensor first;
  while (test.next(b)) {
    const auto x = b.x.contiguous();
    const auto pf = tm.model->forward(x).argmax(1), pq = int8_forward(x).argmax(1);
    right_fp += pf.eq(b.y).sum().item<int64_t>();
    right_q += pq.eq(b.y).sum().item<int64_t>();
    agree += pf.eq(pq).sum().item<int64_t>();
    n += b.y.size(0);
    if (!first.defined()) first = x.slice(0, 0, std::min<int64_t>(128, x.size(0))).clone();
  }
  // 5. Speed at batch 128: the trained model as configured (channels-last, fp32) vs int8.
  const double fp_sps = train::batch_throughput([&](const torch::Tensor& x) { return tm.model->forward(x); }, first);
  const double q_sps = train::batch_throughput(int8_forward, first);

  nlohmann::json r = {{"run", tm.run_dir.string()},
                      {"checkpoint", tm.checkpoint.string()},
                      {"engine", c10::toString(engine)},
                      {"observer", opt.observer},
                      {"calibration_batches", seen},
                      {"test_samples", n},
                      {"fp32_accuracy", double(right_fp) / n},
                      {"int8_accuracy", double(right_q) / n},
                      {"accuracy_drop_points", 100.0 * (right_fp - right_q) / n},
                      {"prediction_agreement", double(agree) / n},
                      {"fp32_weight_bytes", fp32_bytes},
                      {"int8_weight_bytes", int8_bytes},
                      {"size_ratio", double(fp32_bytes) / int8_bytes},
                      {"fp32_samples_per_s_batch128", fp_sps},
                      {"int8_samples_per_s_batch128", q_sps},
                      {"speedup_batch128", q_sps / fp_sps},
                      {"activation_qparams", nlohmann::json::array()}};
  for (int i = 0; i < 5; ++i) {
    const auto q = i == 0 ? in : L[static_cast<size_t>(i - 1)].out;
    r["activation_qparams"].push_back({{"at", i == 0 ? "input" : names[i - 1]}, {"scale", q.scale}, {"zero_point", q.zero_point}});
  }
  fs::create_directories(out);
  write_file_atomic((out / "quantize.json").string(), r.dump(2) + "\n");
  return r;
}

std::string quantize_text(const nlohmann::json& r) {
  std::ostringstream o;
  o << "int8 (" << r.value("engine", "") << " engine, " << r.value("observer", "") << " observer, "
    << r.value("calibration_batches", 0) << " calibration batches) from " << r.value("checkpoint", "") << "\n";
  o << "test accuracy: fp32 " << format_fixed(100 * r.value("fp32_accuracy", 0.0), 2) << " %, int8 "
    << format_fixed(100 * r.value("int8_accuracy", 0.0), 2) << " % (drop " << format_fixed(r.value("accuracy_drop_points", 0.0), 2)
    << " points; predictions agree on " << format_fixed(100 * r.value("prediction_agreement", 0.0), 2) << " %)\n";
  o << "weights: " << r.value("fp32_weight_bytes", 0) << " -> " << r.value("int8_weight_bytes", 0) << " bytes ("
    << format_fixed(r.value("size_ratio", 0.0), 2) << "x smaller)\n";
  o << "batch 128: fp32 " << format_fixed(r.value("fp32_samples_per_s_batch128", 0.0), 0) << " -> int8 "
    << format_fixed(r.value("int8_samples_per_s_batch128", 0.0), 0) << " samples/s (" << format_fixed(r.value("speedup_batch128", 0.0), 2)
    << "x)\n";
  return o.str();
}

}  // namespace mltrain::quant
