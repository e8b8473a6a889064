// model.name: exported against eager PyTorch. tests/golden/make_export_golden.py (run by ctest
// into the build folder as the fixture `export_goldens`; MLTRAIN_EXPORT_GOLDEN names the folder)
// exports seven models in training mode and trains each 10 steps in eager PyTorch; here mltrain
// loads the .pt2 and must give the same step-1 output, loss and gradients, the same eval output
// as model.eval(), and after 10 steps of its SGD and AdamW the same parameters and BatchNorm
// buffers, on the same batches with the same seeds, one thread on both sides. Then the bad-input
// table: each archive the generator damaged, with the exit code and the words of its error.
#include <catch2/catch.hpp>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mltrain/core/error.hpp"
#include "mltrain/formats/pt2.hpp"
#include "mltrain/formats/safetensors.hpp"
#include "mltrain/formats/zip.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"

using namespace mltrain;
using Catch::Matchers::Contains;

namespace {

std::string golden_dir() {
  const char* d = std::getenv("MLTRAIN_EXPORT_GOLDEN");
  REQUIRE(d != nullptr);  // ctest sets it; by hand: make_export_golden.py DIR, then export it
  return d;
}

// kernels "aten": the graph's operators as exported, so dropout draws ATen's masks as eager does.
std::unique_ptr<model::Model> load(const std::string& file, const std::vector<int64_t>& shape = {},
                                   bool channels_last = false, const std::string& kernels = "aten",
                                   bool fused_batchnorm = true, bool conv1x1 = true) {
  config::ModelConfig c;
  c.name = "exported";
  c.script_kernels = kernels;
  c.fused_batchnorm = fused_batchnorm;
  c.conv1x1_as_linear = conv1x1;
  c.channels_last = channels_last;  // eager PyTorch runs the exported (contiguous) layout
  c.path = golden_dir() + "/" + file;
  return model::build_model(c, shape, 0, 0);
}

torch::Tensor loss_of(const torch::Tensor& out, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1}));
}

// The largest |a - b| relative to max(|b|), 0 for equal tensors (bitwise: exactly 0).
double rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() / scale;
}

struct Golden {
  std::map<std::string, torch::Tensor> t;
  nlohmann::json meta;
};

Golden golden(const std::string& name) {
  Golden g;
  g.t = formats::load_safetensors(golden_dir() + "/" + name + ".safetensors");
  std::ifstream in(golden_dir() + "/" + name + ".json");
  g.meta = nlohmann::json::parse(in);
  return g;
}

// Step k of both sides: the seed, forward, cross-entropy, backward, the optimizer's step.
void train(model::Model& m, optim::Optimizer& opt, const Golden& g, double lr, int steps,
           std::vector<double>& losses) {
  for (int k = 0; k < steps; ++k) {
    torch::manual_seed(1000 + k);
    auto loss = loss_of(m.forward(g.t.at(std::string("x") + std::to_string(k))),
                        g.t.at(std::string("y") + std::to_string(k)));
    loss.backward();
    opt.step(lr);
    opt.zero_grad();
    losses.push_back(loss.item<double>());
  }
}

// Everything the golden holds for one model, with `tol` the largest relative difference allowed
// (0: bitwise). Returns the largest difference seen, for the log.
double check_model(const std::string& name, double tol, double steps_tol) {
  at::set_num_threads(1);
  const Golden g = golden(name);
  double worst = 0;
  auto expect = [&](const torch::Tensor& got, const torch::Tensor& want, const std::string& what,
                    double bound) {
    const double d = rel_diff(got.detach(), want);
    worst = std::max(worst, d);
    INFO(name << " " << what << ": relative difference " << d);
    CHECK(d <= bound);
  };
  auto m = load(name + ".pt2");
  std::vector<std::string> params;
  for (const auto& [n, p] : m->named_parameters()) params.push_back(n);
  // The module's own parameter names, in its order (what load_state_dict expects).
  CHECK(params == g.meta.at("params").get<std::vector<std::string>>());
  std::map<std::string, torch::Tensor> start;
  for (const auto& list : {m->named_parameters(), m->named_buffers()})
    for (const auto& [n, t] : list) start[n] = t.detach().clone();
  // Step 1 in training mode.
  m->set_training(true);
  torch::manual_seed(1000);
  auto out = m->forward(g.t.at("x0"));
  auto loss = loss_of(out, g.t.at("y0"));
  loss.backward();
  expect(out, g.t.at("train_out"), "train-mode output", tol);
  expect(loss.reshape({1}), g.t.at("loss"), "loss", tol);
  for (const auto& [n, p] : m->named_parameters()) {
    REQUIRE(p.grad().defined());
    expect(p.grad(), g.t.at("grad/" + n), "gradient of " + n, tol);
    // The program PyTorch runs from the same archive (ep.module()): always bit for bit.
    INFO(name << " gradient of " << n << " vs ep.module()");
    if (g.t.count("program_grad/" + n)) CHECK(torch::equal(p.grad(), g.t.at("program_grad/" + n)));
  }
  auto restore = [&] {
    torch::NoGradGuard no_grad;
    for (const auto& list : {m->named_parameters(), m->named_buffers()})
      for (const auto& [n, t] : list) t.copy_(start.at(n)), t.mutable_grad() = torch::Tensor();
  };
  // Evaluation mode: model.eval()'s output, and no buffer moves.
  restore();
  m->set_training(false);
  {
    torch::NoGradGuard no_grad;
    expect(m->forward(g.t.at("x0")), g.t.at("eval_out"), "eval-mode output", tol);
  }
  for (const auto& [n, t] : m->named_buffers()) CHECK(torch::equal(t, start.at(n)));
  m->set_training(true);
  // 10 steps of each optimizer.
  const int steps = g.meta.at("steps").get<int>();
  for (const std::string opt_name : {"sgd", "adamw"}) {
    restore();
    config::OptimConfig oc;
    oc.name = opt_name;
    const auto& hp = g.meta.at(opt_name);
    oc.lr = hp.at("lr").get<double>();
    oc.momentum = hp.value("momentum", 0.0);
    oc.weight_decay = hp.value("weight_decay", 0.0);
    auto opt = optim::Optimizer::create(oc, m->named_parameters());
    std::vector<double> losses;
    train(*m, *opt, g, oc.lr, steps, losses);
    expect(torch::tensor(losses, torch::kDouble), g.t.at(opt_name + "_loss"), opt_name + " losses",
           steps_tol);
    for (const auto& list : {m->named_parameters(), m->named_buffers()})
      for (const auto& [n, t] : list)
        expect(t, g.t.at(opt_name + "/" + n), opt_name + " " + n, steps_tol);
  }
  at::set_num_threads(2);
  return worst;
}

}  // namespace

// Bitwise where mltrain calls the kernels eager PyTorch calls, in the same order: each node is
// the ATen operator Python dispatched, and autograd is the same engine.
TEST_CASE(
    "exported: a module with Conv, BatchNorm, Dropout and Linear trains bit for bit as eager "
    "PyTorch",
    "[exported]") {
  CHECK(check_model("small", 0.0, 0.0) == 0.0);
  CHECK(check_model("bn_silu", 0.0, 0.0) == 0.0);  // SiLU in place and not
}

TEST_CASE(
    "exported: shape arithmetic on dynamic dimensions (SymInt mul, floordiv, sub), bit for bit",
    "[exported]") {
  CHECK(check_model("symbolic", 0.0, 0.0) == 0.0);
}

TEST_CASE("exported: torchvision ResNet-18 and MobileNetV3-small, bit for bit", "[exported]") {
  CHECK(check_model("resnet18", 0.0, 0.0) == 0.0);
  CHECK(check_model("mobilenet_v3_small", 0.0, 0.0) == 0.0);
}

TEST_CASE("exported: timm's ConvNeXt-atto (LayerNorm on permuted activations, GELU), bit for bit",
          "[exported]") {
  CHECK(check_model("convnext_atto", 0.0, 0.0) == 0.0);
}

TEST_CASE(
    "exported: transformers' GPT-2 (its ModelOutput's logits leaf, tied lm_head) and ViT, bit for "
    "bit",
    "[exported]") {
  CHECK(check_model("gpt2", 0.0, 0.0) == 0.0);
  CHECK(check_model("vit", 0.0, 0.0) == 0.0);
}

// The exported Llama is not the eager module's computation: under export transformers builds
// the causal mask as a tensor, where eager calls SDPA with is_causal=True and no mask, and the
// masked backward sums in another order (3.6e-7 relative in PyTorch itself, ep.module() vs the
// module). mltrain matches the program bit for bit (program_grad) and the module within 1e-6 at
// step 1 and 1e-5 after 10 steps; outputs and losses of step 1 are bitwise. Whether the two
// backward orders round differently depends on the CPU's SDPA kernel: on an AMD EPYC with
// AVX-512 they did (3.6e-7); on an Intel Xeon VM (2026-12-07) they agree bit for bit.
TEST_CASE(
    "exported: transformers' Llama, bit for bit with its program, within 1e-6 of the eager module",
    "[exported]") {
  const double worst = check_model("llama", 1e-6, 1e-5);
  CHECK(worst <= 1e-6);
}

// model.script_kernels=mltrain (the default) rewrites the graph's dropout and "ReLU, 2 x 2
// max-pool" (either order, in place or not) to mltrain's kernels. The pool is exact: a graph
// without dropout trains to the same bits as on ATen's operators, channels-last (the layout the
// fused kernel takes) on both sides. Dropout draws mltrain's own mask (the same under the same
// seed), so a graph with dropout is compared in evaluation, where dropout is off.
TEST_CASE("exported: mltrain's kernels as graph rewrites give ATen's values and gradients",
          "[exported]") {
  const Golden g = golden("pool_relu");
  auto fused = load("pool_relu.pt2", {}, true, "mltrain");
  auto aten = load("pool_relu.pt2", {}, true, "aten");
  CHECK_THAT(fused->describe(), Contains("mltrain kernels: 2 relu+max_pool2d)"));
  CHECK_THAT(fused->describe(), Contains("channels_last"));
  CHECK_THAT(aten->describe(), !Contains("mltrain kernels"));
  for (auto* m : {fused.get(), aten.get()}) m->set_training(true);
  auto f_opt = optim::Optimizer::create(config::OptimConfig{}, fused->named_parameters());
  auto a_opt = optim::Optimizer::create(config::OptimConfig{}, aten->named_parameters());
  for (int k = 0; k < 3; ++k) {
    const auto& x = g.t.at("x" + std::to_string(k));
    const auto& y = g.t.at("y" + std::to_string(k));
    const auto fo = fused->forward(x), ao = aten->forward(x);
    loss_of(fo, y).backward();
    loss_of(ao, y).backward();
    INFO("step " << k + 1);
    CHECK(torch::equal(fo, ao));
    if (k == 0) CHECK(rel_diff(fo.detach(), g.t.at("train_out")) <= 1e-5);  // eager, NCHW
    auto ap = aten->named_parameters();
    for (const auto& [n, p] : fused->named_parameters()) {
      INFO(n);
      const auto& q = std::find_if(ap.begin(), ap.end(), [&](auto& e) { return e.first == n; });
      REQUIRE(q != ap.end());
      CHECK(torch::equal(p.grad(), q->second.grad()));
    }
    f_opt->step(1e-2);
    a_opt->step(1e-2);
    f_opt->zero_grad();
    a_opt->zero_grad();
  }
  auto ab = aten->named_buffers();
  for (const auto& [n, t] : fused->named_buffers()) {
    INFO(n);
    CHECK(torch::equal(
        t, std::find_if(ab.begin(), ab.end(), [&](auto& e) { return e.first == n; })->second));
  }

  // The small module: dropout and "ReLU, pool" rewritten; evaluation equal to ATen's, gradients
  // included; in training the same seed draws the same mask and another seed another one.
  const Golden s = golden("small");
  auto sf = load("small.pt2", {}, true, "mltrain");
  auto sa = load("small.pt2", {}, true, "aten");
  CHECK_THAT(sf->describe(), Contains("mltrain kernels: 1 dropout, 1 relu+max_pool2d)"));
  sf->set_training(false);
  sa->set_training(false);
  const auto x = s.t.at("x0");
  const auto fo = sf->forward(x), ao = sa->forward(x);
  CHECK(torch::equal(fo, ao));
  fo.sum().backward();
  ao.sum().backward();
  auto sap = sa->named_parameters();
  for (size_t i = 0; i < sap.size(); ++i)
    CHECK(torch::equal(sf->named_parameters()[i].second.grad(), sap[i].second.grad()));
  sf->set_training(true);
  torch::NoGradGuard no_grad;
  torch::manual_seed(21);
  const auto a = sf->forward(x);
  const auto b = sf->forward(x);
  torch::manual_seed(21);
  CHECK(torch::equal(sf->forward(x), a));
  CHECK_FALSE(torch::equal(a, b));
  // MobileNetV3's classifier drops out in place (Dropout(inplace=True): aten.dropout_) on a value
  // nothing else reads: rewritten too. ResNet-18's 3 x 3 pool is not a 2 x 2 one.
  CHECK_THAT(load("mobilenet_v3_small.pt2", {}, false, "mltrain", false, false)->describe(),
             Contains("mltrain kernels: 1 dropout)"));
  CHECK_THAT(load("resnet18.pt2", {}, false, "mltrain", false, false)->describe(),
             Contains("mltrain kernels: none)"));
}

// model.fused_batchnorm (on by default with script_kernels mltrain): torchvision's "BN, ReLU",
// "BN, add_, ReLU" and "BN, hardswish" become one operator each. Not bit for bit: the fused sums
// run in double, in another order than ATen's. The bound is ATen's own: against eager PyTorch
// (NCHW, ATen's operators), the rewritten graph must be at least as close as the same graph on
// ATen's operators in the same channels-last layout, within 2x (or 1e-5 / 1e-4). ResNet-18 at
// batch 4 is ill-conditioned (its last BatchNorms see 4 values a channel): ATen's channels-last
// kernels are 2e-5 from eager in its step-1 output and 1e-4-4e-4 in its gradients, and after 10
// SGD steps 85 % in a running variance, so the comparison is one step. MobileNetV3's training
// output passes through mltrain's dropout (not eager's masks): its training step is compared
// with the same graph on ATen's BatchNorm (the same mask) instead.
TEST_CASE("exported: BatchNorm rewrites are as close to eager PyTorch as ATen's operators",
          "[exported]") {
  at::set_num_threads(1);
  auto no_further = [](const torch::Tensor& fused, const torch::Tensor& plain,
                       const torch::Tensor& eager, double floor) {
    const double ef = rel_diff(fused.detach(), eager), ep = rel_diff(plain.detach(), eager);
    INFO("fused " << ef << ", ATen's channels-last " << ep << " from eager");
    CHECK(ef <= std::max(floor, 2 * ep));
  };
  for (const auto& [name, rewritten] :
       {std::pair<std::string, std::string>{"resnet18",
                                            "9 batch_norm+relu, 8 batch_norm+add+relu)"},
        {"mobilenet_v3_small", "1 dropout, 5 batch_norm+relu, 18 batch_norm+hardswish)"},
        {"bn_silu", "2 batch_norm+silu)"}}) {
    INFO(name);
    const Golden g = golden(name);
    auto fused = load(name + ".pt2", {}, true, "mltrain", true, false);
    auto plain = load(name + ".pt2", {}, true, "mltrain", false, false);
    CHECK_THAT(fused->describe(), Contains("mltrain kernels: " + rewritten));
    CHECK_THAT(plain->describe(), !Contains("batch_norm+"));
    // Evaluation from the starting weights (the fused forward on the running statistics).
    for (auto* m : {fused.get(), plain.get()}) m->set_training(false);
    {
      torch::NoGradGuard no_grad;
      no_further(fused->forward(g.t.at("x0")), plain->forward(g.t.at("x0")), g.t.at("eval_out"),
                 1e-5);
    }
    // Step 1 in training: output, every gradient, and the buffers it moved.
    for (auto* m : {fused.get(), plain.get()}) m->set_training(true);
    const bool dropout = name == "mobilenet_v3_small";
    const auto& x = g.t.at("x0");
    torch::manual_seed(1000);
    const auto fo = fused->forward(x);
    torch::manual_seed(1000);
    const auto po = plain->forward(x);
    loss_of(fo, g.t.at("y0")).backward();
    loss_of(po, g.t.at("y0")).backward();
    if (dropout)
      CHECK(rel_diff(fo.detach(), po.detach()) < 1e-5);
    else
      no_further(fo, po, g.t.at("train_out"), 1e-5);
    const auto pp = plain->named_parameters();
    size_t i = 0;
    for (const auto& [n, p] : fused->named_parameters()) {
      INFO(n);
      const auto& want = pp.at(i++).second.grad();
      if (!dropout) {
        no_further(p.grad(), want, g.t.at("grad/" + n), 1e-4);
      } else {
        // A BatchNorm bias ahead of another normalisation has a gradient of rounding noise.
        INFO("relative " << rel_diff(p.grad(), want));
        CHECK((rel_diff(p.grad(), want) < 1e-4 ||
               (p.grad() - want).abs().max().item<double>() < 1e-6));
      }
    }
    const auto pb = plain->named_buffers();
    i = 0;
    for (const auto& [n, t] : fused->named_buffers()) {
      INFO(n);
      const auto& want = pb.at(i++).second;
      // A running mean behind a 1 x 1 convolution of normalised (zero-mean) activations is
      // rounding noise (1e-9): the bound is on the scale of 1.
      if (t.is_floating_point())
        CHECK((t - want).abs().max().item<double>() <=
              1e-5 * std::max(1.0, want.abs().max().item<double>()));
      else
        CHECK(torch::equal(t, want));  // num_batches_tracked: counted by the graph's own node
    }
  }
  at::set_num_threads(2);
}

// model.conv1x1_as_linear (on by default with script_kernels mltrain): MobileNetV3's 1 x 1
// convolutions on 1 x 1 activations (the squeeze-and-excitation blocks' two, and at 32 x 32
// input the last blocks' expansions and projections: 24) run as linear. The same products
// summed in another order (a GEMM's, not oneDNN's convolution's): the training step and
// evaluation within float rounding of the graph on ATen's conv2d, dropout's mask the same on
// both sides, and evaluation within 1e-5 of eager PyTorch's. ResNet-18 has no such convolution.
TEST_CASE("exported: 1 x 1 convolutions on 1 x 1 inputs as linear, within float rounding",
          "[exported]") {
  at::set_num_threads(1);
  const Golden g = golden("mobilenet_v3_small");
  auto as_linear = load("mobilenet_v3_small.pt2", {}, true, "mltrain", false, true);
  auto conv = load("mobilenet_v3_small.pt2", {}, true, "mltrain", false, false);
  CHECK_THAT(as_linear->describe(),
             Contains("mltrain kernels: 1 dropout, 24 conv2d 1x1 as linear)"));
  CHECK_THAT(conv->describe(), !Contains("conv2d 1x1"));
  CHECK_THAT(load("resnet18.pt2", {}, true, "mltrain", false, true)->describe(),
             Contains("mltrain kernels: none)"));
  // Evaluation from the starting weights first (a training forward moves the running stats).
  for (auto* m : {as_linear.get(), conv.get()}) m->set_training(false);
  {
    torch::NoGradGuard no_grad;
    const auto le = as_linear->forward(g.t.at("x0"));
    CHECK(rel_diff(le, conv->forward(g.t.at("x0"))) < 1e-5);
    CHECK(rel_diff(le, g.t.at("eval_out")) < 1e-5);  // and eager PyTorch's model.eval()
  }
  for (auto* m : {as_linear.get(), conv.get()}) m->set_training(true);
  torch::manual_seed(1000);
  const auto lo = as_linear->forward(g.t.at("x0"));
  torch::manual_seed(1000);
  const auto co = conv->forward(g.t.at("x0"));
  CHECK(rel_diff(lo.detach(), co.detach()) < 1e-5);
  loss_of(lo, g.t.at("y0")).backward();
  loss_of(co, g.t.at("y0")).backward();
  const auto cp = conv->named_parameters();
  size_t i = 0;
  for (const auto& [n, p] : as_linear->named_parameters()) {
    const auto& want = cp.at(i++).second.grad();
    INFO(n << ": relative " << rel_diff(p.grad(), want));
    CHECK(p.grad().sizes() == want.sizes());
    CHECK((rel_diff(p.grad(), want) < 1e-4 || (p.grad() - want).abs().max().item<double>() < 1e-6));
  }
  at::set_num_threads(2);
}

// model.channels_last (the config's default) runs the convolutions NHWC: the same values up to
// the kernels' summation order. Evaluation for the small module: its dropout acts on a 4-D
// activation, and bernoulli_ fills a channels-last tensor in memory order, another mask than
// eager's (as PyTorch's own channels-last training draws). MobileNetV3's dropout acts on the
// flattened features, so its training step compares too.
TEST_CASE("exported: channels-last weights and inputs, within float rounding of eager PyTorch",
          "[exported]") {
  at::set_num_threads(1);
  for (const std::string name : {"small", "mobilenet_v3_small"}) {
    INFO(name);
    const Golden g = golden(name);
    auto m = load(name + ".pt2", {}, /*channels_last=*/true);
    CHECK_THAT(m->describe(), Contains("channels_last"));
    for (const auto& [n, p] : m->named_parameters())
      if (p.dim() == 4) CHECK(p.is_contiguous(at::MemoryFormat::ChannelsLast));
    m->set_training(false);
    {
      torch::NoGradGuard no_grad;
      CHECK(rel_diff(m->forward(g.t.at("x0")), g.t.at("eval_out")) < 1e-5);
    }
    if (name == "small") continue;
    m->set_training(true);
    torch::manual_seed(1000);
    auto out = m->forward(g.t.at("x0"));
    CHECK(rel_diff(out.detach(), g.t.at("train_out")) < 1e-5);
    loss_of(out, g.t.at("y0")).backward();
    // A BatchNorm bias ahead of another normalisation has a gradient of rounding noise (1e-9):
    // there the bound is absolute.
    for (const auto& [n, p] : m->named_parameters()) {
      const auto& want = g.t.at("grad/" + n);
      INFO(n << ": relative " << rel_diff(p.grad(), want));
      CHECK(
          (rel_diff(p.grad(), want) < 1e-4 || (p.grad() - want).abs().max().item<double>() < 1e-6));
    }
  }
  at::set_num_threads(2);
}

TEST_CASE("exported: a deflated re-zip and a zip64 copy of the archive read the same program",
          "[exported]") {
  auto a = load("small.pt2");
  for (const std::string other : {"deflated.pt2", "zip64.pt2"}) {
    INFO(other);
    auto b = load(other);
    auto pa = a->named_parameters(), pb = b->named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) CHECK(torch::equal(pa[i].second, pb[i].second));
  }
  formats::ZipReader z64(golden_dir() + "/zip64.pt2"), plain(golden_dir() + "/small.pt2");
  REQUIRE(z64.entries().size() == plain.entries().size());
  for (const auto& e : plain.entries()) CHECK(z64.read(e.name) == plain.read(e.name));
}

TEST_CASE("exported: bad archives and inputs are errors naming the file and the fix",
          "[exported]") {
  struct Row {
    std::string file;
    int exit;
    std::vector<std::string> words;
  };
  const std::vector<Row> rows = {
      {"bad_not_zip.pt2",
       kExitBadInput,
       {"not a readable zip archive", "end-of-central-directory"}},
      {"bad_truncated.pt2", kExitBadInput, {"not a readable zip archive"}},
      {"bad_schema9.pt2", kExitBadInput, {"schema version 9.0", "major version 8"}},
      {"bad_custom_op.pt2", kExitBadInput, {"mylib::fancy_relu", "not registered", "'relu'"}},
      {"bad_missing_weight.pt2", kExitBadInput, {"weight_0", "missing from the archive"}},
      {"bad_aoti.pt2", kExitBadInput, {"AOTInductor package", "torch.export.save"}},
  };
  for (const auto& r : rows) {
    INFO(r.file);
    try {
      load(r.file);
      FAIL("accepted " + r.file);
    } catch (const Error& e) {
      CHECK(e.exit_code() == r.exit);
      CHECK_THAT(e.what(), Contains(r.file));
      for (const auto& w : r.words) CHECK_THAT(e.what(), Contains(w));
    }
  }
  SECTION("a graph exported in eval mode is refused for training, allowed for evaluation") {
    auto m = load("bad_eval_mode.pt2");
    try {
      m->set_training(true);
      FAIL("trained an eval-mode graph");
    } catch (const ConfigError& e) {
      CHECK_THAT(e.what(), Contains("exported in evaluation mode"));
      CHECK_THAT(e.what(), Contains("model.train()"));
    }
    m->set_training(false);
    CHECK(m->forward(torch::randn({2, 3, 8, 8})).sizes() == std::vector<int64_t>{2, 10});
  }
  SECTION("samples or batches that do not fit the exported input name both shapes") {
    try {
      load("small.pt2", {3, 28, 28});
      FAIL("took 28 x 28 samples");
    } catch (const DataError& e) {
      CHECK_THAT(e.what(), Contains("[3, 28, 28]"));
      CHECK_THAT(e.what(), Contains(", 3, 8, 8]: dimension 2 is 28, exported as 8"));
    }
    auto m = load("small.pt2", {3, 8, 8});
    CHECK_THROWS_WITH(m->forward(torch::randn({2, 1, 8, 8})),
                      Contains("dimension 1 is 1, exported as 3"));
    CHECK_THROWS_WITH(m->forward(torch::randn({2, 3, 8, 8}, torch::kDouble)),
                      Contains("dtype Double"));
    auto fixed = load("static_batch.pt2");
    CHECK_THROWS_WITH(fixed->forward(torch::randn({8, 3, 8, 8})),
                      Contains("dimension 0 is 8, exported as 4") && Contains("Dim('batch')"));
    CHECK(fixed->forward(torch::randn({4, 3, 8, 8})).size(0) == 4);
  }
}
