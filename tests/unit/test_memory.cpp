// The memory chapter: activation checkpointing (bitwise), fp32 islands under autocast, the
// counting allocator, micro-batches and out-of-memory recovery, fp16 underflow, BatchNorm notes.
#include <catch2/catch.hpp>

#include <cmath>

#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/runtime/memory.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/optim/optimizer.hpp"
#include "mltrain/train/micro_batch.hpp"
#include "mltrain/train/techniques.hpp"
#include "mltrain/train/trainer.hpp"

using namespace mltrain;

namespace {

config::ModelConfig gpt_config(double dropout) {
  config::ModelConfig c;
  c.name = "gpt";
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 32;
  c.block_size = 16;
  c.dropout = dropout;
  return c;
}

config::ModelConfig resnet_config() {
  config::ModelConfig c;
  c.name = "resnet";
  c.widths = {8, 16};
  c.depths = {2, 2};
  c.dropout = 0.2;
  return c;
}

struct Grads {
  std::vector<torch::Tensor> grads, buffers;
  torch::Tensor out;
};

// Two accumulated forward/backward passes from the same RNG seed; gradients, buffers, output.
Grads run_twice(model::Model& m, const torch::Tensor& x, const torch::Tensor& y, bool bf16) {
  torch::manual_seed(7);
  m.set_training(true);
  Grads g;
  for (int i = 0; i < 2; ++i) {
    torch::Tensor logits;
    {
      compat::AutocastGuard amp(bf16, at::kBFloat16, /*cuda=*/false);
      logits = m.forward(x);
    }
    auto loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}).to(at::kFloat), y.reshape({-1}));
    loss.backward();
    g.out = logits.detach();
  }
  for (auto& [n, p] : m.named_parameters()) g.grads.push_back(p.grad().clone());
  for (auto& [n, b] : m.named_buffers()) g.buffers.push_back(b.clone());
  return g;
}

void check_bitwise(const Grads& a, const Grads& b) {
  REQUIRE(a.grads.size() == b.grads.size());
  CHECK(torch::equal(a.out, b.out));
  for (size_t i = 0; i < a.grads.size(); ++i) {
    INFO("parameter " << i);
    CHECK(torch::equal(a.grads[i], b.grads[i]));
  }
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    INFO("buffer " << i);
    CHECK(torch::equal(a.buffers[i], b.buffers[i]));
  }
}

}  // namespace

TEST_CASE("activation checkpointing: gradients bitwise equal, dropout and BatchNorm replayed",
          "[memory][checkpoint]") {
  const auto tokens = torch::randint(0, 64, {4, 16}, torch::kLong);
  const auto targets = torch::randint(0, 64, {4, 16}, torch::kLong);
  for (bool bf16 : {false, true}) {
    for (int64_t every : {1, 2, 3}) {
      INFO("gpt, bf16 " << bf16 << ", segments of " << every);
      auto plain = model::build_model(gpt_config(0.1), {16}, 64, 3);
      auto ckpt = model::build_model(gpt_config(0.1), {16}, 64, 3);
      ckpt->set_checkpointing(every);
      CHECK(ckpt->num_blocks() == 4);
      check_bitwise(run_twice(*plain, tokens, targets, bf16),
                    run_twice(*ckpt, tokens, targets, bf16));
    }
  }
  const auto images = torch::rand({8, 1, 16, 16});
  const auto labels = torch::randint(0, 10, {8}, torch::kLong);
  for (int64_t every : {1, 2}) {
    INFO("resnet with BatchNorm and dropout, segments of " << every);
    auto plain = model::build_model(resnet_config(), {1, 16, 16}, 10, 5);
    auto ckpt = model::build_model(resnet_config(), {1, 16, 16}, 10, 5);
    ckpt->set_checkpointing(every);
    CHECK(ckpt->num_blocks() == 4);
    const Grads a = run_twice(*plain, images, labels, false);
    const Grads b = run_twice(*ckpt, images, labels, false);
    CHECK_FALSE(a.buffers.empty());
    check_bitwise(a, b);
  }
  // Evaluation (no gradients) runs the blocks plainly.
  auto ckpt = model::build_model(gpt_config(0.0), {16}, 64, 3);
  ckpt->set_checkpointing(1);
  torch::NoGradGuard no_grad;
  CHECK(ckpt->forward(tokens).sizes() == torch::IntArrayRef({4, 16, 64}));
}

TEST_CASE("activation checkpointing: models without blocks are refused naming the key",
          "[memory][checkpoint]") {
  config::ModelConfig mc;
  mc.name = "mlp";
  auto mlp = model::build_model(mc, {8}, 4, 0);
  try {
    mlp->set_checkpointing(1);
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("memory.checkpoint") != std::string::npos);
  }
  mlp->set_checkpointing(0);  // off is always fine
}

TEST_CASE("fp32 islands: listed modules run in fp32 under bf16 autocast, the rest in bf16",
          "[memory][amp]") {
  auto m = model::build_model(gpt_config(0.0), {16}, 64, 3);
  const auto tokens = torch::randint(0, 64, {2, 16}, torch::kLong);
  auto dtypes = [&] {
    m->record_dtypes(true);
    compat::AutocastGuard amp(true, at::kBFloat16, false);
    m->forward(tokens);
    auto d = m->recorded_dtypes();
    m->record_dtypes(false);
    return d;
  };
  auto before = dtypes();
  CHECK(before.at("lm_head") == "BFloat16");
  CHECK(before.at("h.0.attn") == "BFloat16");
  CHECK(before.at("h.1.mlp") == "BFloat16");
  const auto chosen = m->set_fp32_modules({"h.0.attn", "ln_f", "lm_head"});
  CHECK(chosen == std::vector<std::string>{"h.0.attn", "lm_head", "ln_f"});
  auto after = dtypes();
  CHECK(after.at("lm_head") == "Float");
  CHECK(after.at("ln_f") == "Float");
  CHECK(after.at("h.0.attn") == "Float");
  CHECK(after.at("h.1.attn") == "BFloat16");  // not listed: still autocast
  CHECK(after.at("h.1.mlp") == "BFloat16");
  // Globs; a pattern matching nothing lists the names.
  CHECK(m->set_fp32_modules({"h.*.ln_*"}).size() == 8);
  try {
    m->set_fp32_modules({"h.*.layernorm"});
    FAIL("no error");
  } catch (const ConfigError& e) {
    const std::string w = e.what();
    CHECK(w.find("amp.fp32_modules") != std::string::npos);
    CHECK(w.find("h.0.ln_1") != std::string::npos);
  }
  // The CNN, ResNet and MLP name their layers too.
  config::ModelConfig mc;
  mc.name = "cnn";
  auto cnn = model::build_model(mc, {1, 28, 28}, 10, 0);
  CHECK(cnn->set_fp32_modules({"fc2"}) == std::vector<std::string>{"fc2"});
  cnn->record_dtypes(true);
  {
    compat::AutocastGuard amp(true, at::kBFloat16, false);
    cnn->forward(torch::rand({2, 1, 28, 28}));
  }
  CHECK(cnn->recorded_dtypes().at("fc2") == "Float");
  CHECK(cnn->recorded_dtypes().at("fc1") == "BFloat16");
  auto resnet = model::build_model(resnet_config(), {1, 16, 16}, 10, 0);
  CHECK(resnet->set_fp32_modules({"stages.*.bn*"}).size() == 8);
}

TEST_CASE("counting allocator: live and peak bytes, and a limit that throws OutOfMemoryError",
          "[memory]") {
  memory::track_cpu();
  const torch::Device cpu(torch::kCPU);
  memory::reset_peak(cpu);
  const int64_t base = memory::stats(cpu).live;
  {
    auto a = torch::empty({1 << 20}, torch::kFloat);  // 4 MiB
    CHECK(memory::stats(cpu).live - base >= (4 << 20));
  }
  CHECK(memory::stats(cpu).live - base < (1 << 20));
  CHECK(memory::stats(cpu).peak - base >= (4 << 20));
  memory::set_cpu_limit(memory::stats(cpu).live + (2 << 20));
  bool oom = false;
  try {
    auto big = torch::empty({1 << 20}, torch::kFloat);
  } catch (const std::exception& e) {
    oom = memory::is_out_of_memory(e);
  }
  memory::set_cpu_limit(0);
  CHECK(oom);
  auto fine = torch::empty({1 << 20}, torch::kFloat);
  CHECK(fine.numel() == (1 << 20));
}

TEST_CASE("fp16 underflow share counts subnormal-range elements of a sample", "[memory][amp]") {
  auto p = torch::zeros({1000}).requires_grad_();
  // 100 elements that underflow at scale 1 (|g| < 2^-14), 890 that do not, 10 exact zeros.
  auto g = torch::full({1000}, 1e-3);
  g.slice(0, 0, 100).fill_(1e-6);
  g.slice(0, 990, 1000).zero_();
  p.mutable_grad() = g;
  const model::NamedTensors params = {{"p", p}};
  CHECK(train::underflow_share(params, 1.0, false) == Approx(0.1));
  // A scale of 2^10 lifts 1e-6 to 1.02e-3: nothing underflows.
  CHECK(train::underflow_share(params, 1024.0, false) == 0.0);
  // Already-scaled gradients are read as they are; a sample of every 10th element agrees.
  CHECK(train::underflow_share(params, 1.0, true, 100) == Approx(0.1));
}

TEST_CASE("BatchNorm under accumulation or micro-batches is noted with its fix", "[memory]") {
  config::ExperimentConfig c;
  c.model.name = "cnn";
  c.model.batchnorm = true;
  c.data.batch_size = 128;
  CHECK(train::memory_warnings(c, 1, 128).empty());
  CHECK(train::memory_warnings(c, 4, 128).size() == 1);
  const auto w = train::memory_warnings(c, 1, 32);
  REQUIRE(w.size() == 1);
  CHECK(w[0].find("32 samples") != std::string::npos);
  CHECK(w[0].find("GroupNorm") != std::string::npos);
  c.model.batchnorm = false;
  CHECK(train::memory_warnings(c, 4, 32).empty());
  c.model.name = "gpt";
  c.model.batchnorm = true;  // the GPT has LayerNorm only
  CHECK(train::memory_warnings(c, 4, 32).empty());
}
