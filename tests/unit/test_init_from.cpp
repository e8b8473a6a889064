// Weights from elsewhere: the registry gpt reproduces a Python GPT's logits from its safetensors,
// the registry cnn a PyTorch CNN's logits from a torch.save(state_dict) file (goldens from
// tests/golden/make_model_golden.py); strict and lenient key matching, prefix maps, files that are
// not state_dicts; frozen parameter groups.
#include <catch2/catch.hpp>

#include "temp_dir.hpp"

#include <fstream>

#include <nlohmann/json.hpp>

#include "mltrain/core/error.hpp"
#include "mltrain/formats/safetensors.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"
#include "mltrain/train/pipeline.hpp"

using namespace mltrain;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

#ifndef MLTRAIN_SOURCE_DIR
#define MLTRAIN_SOURCE_DIR "."
#endif

namespace {

const std::string kGolden = std::string(MLTRAIN_SOURCE_DIR) + "/tests/golden/";

nlohmann::json read_json(const std::string& name) {
  std::ifstream in(kGolden + name);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

torch::Tensor floats(const nlohmann::json& j) {
  return torch::tensor(j.get<std::vector<float>>(), torch::kFloat32);
}

config::ModelConfig tiny_cnn() {
  config::ModelConfig m;
  m.name = "cnn";
  m.channels = {4, 8};
  m.fc = 16;
  return m;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("registry gpt gives a Python GPT's logits from its safetensors (1e-5)", "[init_from]") {
  const auto golden = read_json("gpt_tiny.json");
  for (const char* name : {"gpt_tiny", "gpt_tiny_nobias"}) {
    INFO(name);
    const auto& g = golden[name];
    config::ModelConfig c;
    c.name = "gpt";
    c.n_layer = g["config"]["n_layer"];
    c.n_head = g["config"]["n_head"];
    c.n_embd = g["config"]["n_embd"];
    c.block_size = g["config"]["block_size"];
    c.bias = g["config"]["bias"];
    c.dropout = 0;
    c.init_from = kGolden + name + ".safetensors";
    auto m = model::build_model(c, {c.block_size}, g["config"]["vocab"], 0);
    const auto report = train::init_from(*m, c);
    CHECK(report.loaded == static_cast<int64_t>(m->named_parameters().size()));
    m->set_training(false);
    std::vector<int64_t> ids;
    for (const auto& row : g["input"])
      for (const auto& t : row) ids.push_back(t.get<int64_t>());
    const auto x = torch::tensor(ids, torch::kLong).reshape({2, c.block_size});
    const auto logits = m->forward(x).flatten();
    const auto want = floats(g["logits"]);
    REQUIRE(logits.numel() == want.numel());
    CHECK((logits - want).abs().max().item<double>() < 1e-5);
  }
}

TEST_CASE("a PyTorch torch.save(state_dict) initialises the registry cnn: same logits",
          "[init_from]") {
  const auto g = read_json("cnn_tiny.json");
  auto c = tiny_cnn();
  c.init_from = kGolden + "cnn_state_dict.pt";
  auto m = model::build_model(c, {1, 28, 28}, 10, 0);
  const auto report = train::init_from(*m, c);
  CHECK(report.missing.empty());
  CHECK(report.unexpected.empty());
  m->set_training(false);
  torch::NoGradGuard no_grad;
  const auto logits = m->forward(floats(g["input"]).reshape({3, 1, 28, 28})).flatten();
  CHECK((logits - floats(g["logits"])).abs().max().item<double>() < 1e-5);
}

TEST_CASE("init_from: strict names the misfits, lenient loads what fits, prefixes map",
          "[init_from]") {
  auto c = tiny_cnn();
  c.init_from = kGolden + "cnn_state_dict.pt";
  auto three = model::build_model(c, {1, 28, 28}, 3, 0);  // a 3-class head: fc2 differs
  const std::string strict = error_of([&] { train::init_from(*three, c); });
  CHECK_THAT(strict,
             Contains("fc2.weight") && Contains("shape differs") && Contains("init_strict=false"));
  c.init_strict = false;
  const auto before = three->named_parameters();
  const auto fc2_before = std::find_if(before.begin(), before.end(), [](const auto& p) {
                            return p.first == "fc2.weight";
                          })->second.clone();
  const auto r = train::init_from(*three, c);
  REQUIRE(r.mismatched.size() == 2);
  CHECK_THAT(r.mismatched[0], Contains("fc2."));
  for (const auto& [n, p] : three->named_parameters())
    if (n == "fc2.weight") CHECK(torch::equal(p, fc2_before));  // left as initialised

  // Keys saved from a DataParallel-wrapped model carry "module.": strict fails until mapped.
  auto d = mltrain::testing::fresh_temp_dir("init_prefix");
  auto plain = model::build_model(tiny_cnn(), {1, 28, 28}, 10, 1);
  model::NamedTensors prefixed;
  for (auto& [n, p] : plain->named_parameters()) prefixed.emplace_back("module." + n, p);
  for (auto& [n, b] : plain->named_buffers()) prefixed.emplace_back("module." + n, b);
  formats::save_safetensors((d / "dp.safetensors").string(), prefixed);
  auto m = model::build_model(tiny_cnn(), {1, 28, 28}, 10, 2);
  auto mc = tiny_cnn();
  mc.init_from = (d / "dp.safetensors").string();
  CHECK_THAT(error_of([&] { train::init_from(*m, mc); }),
             Contains("not in the model: module.") && Contains("missing from the file: conv1"));
  mc.init_prefix_map = {"module.="};
  CHECK(train::init_from(*m, mc).loaded == static_cast<int64_t>(prefixed.size()));
  CHECK(torch::equal(m->named_parameters()[0].second, plain->named_parameters()[0].second));
}

TEST_CASE("init_from: files that are not weights are errors naming the file", "[init_from]") {
  auto d = mltrain::testing::fresh_temp_dir("init_bad");
  std::ofstream(d / "junk.pt") << "not a pickle at all";
  fs::create_directories(d / "folder");
  auto m = model::build_model(tiny_cnn(), {1, 28, 28}, 10, 0);
  auto c = tiny_cnn();
  c.init_from = (d / "junk.pt").string();
  CHECK_THROWS_AS(train::init_from(*m, c), CheckpointError);
  CHECK_THAT(error_of([&] { train::init_from(*m, c); }),
             Contains("junk.pt") && Contains("state_dict"));
  c.init_from = kGolden + "cnn_whole_module.pt";  // torch.save(model): classes, not a state_dict
  CHECK_THAT(error_of([&] { train::init_from(*m, c); }),
             Contains("cnn_whole_module.pt") && Contains("not part of a state_dict"));
  std::ifstream whole(kGolden + "cnn_state_dict.pt", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(whole)), {});
  std::ofstream(d / "truncated.pt", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  c.init_from = (d / "truncated.pt").string();
  CHECK_THROWS_AS(train::init_from(*m, c), CheckpointError);
  c.init_from = (d / "folder").string();
  CHECK_THROWS_AS(train::init_from(*m, c), CheckpointError);
  c.init_from = (d / "absent.safetensors").string();
  CHECK_THROWS_AS(train::init_from(*m, c), ConfigError);
}

TEST_CASE("frozen parameter groups: no gradient, no optimizer state", "[init_from][optim]") {
  auto m = model::build_model(tiny_cnn(), {1, 28, 28}, 10, 0);
  config::OptimConfig oc;
  oc.name = "adam";
  config::ParamGroupConfig head, body;
  head.pattern = "fc2.*";
  body.pattern = std::string("*");
  body.freeze = true;
  oc.param_groups = {head, body};
  auto opt = optim::Optimizer::create(oc, m->named_parameters());
  for (const auto& [n, p] : m->named_parameters())
    CHECK(p.requires_grad() == (n.rfind("fc2.", 0) == 0));
  const auto before = m->named_parameters()[0].second.clone();  // conv1.weight
  m->set_training(true);
  auto loss = m->forward(torch::randn({4, 1, 28, 28})).logsumexp(1).mean();
  loss.backward();
  opt->step(0.1);
  CHECK(torch::equal(m->named_parameters()[0].second, before));
  for (const auto& [n, t] : opt->state())
    if (n != "__step__") CHECK(n.find("fc2.") != std::string::npos);
  CHECK_FALSE(opt->state().empty());
}
