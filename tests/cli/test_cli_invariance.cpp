// distributed.invariance: bitwise — the final model.safetensors and state.safetensors of a run are
// the same bytes in every world that divides the virtual shards, uninterrupted or killed and
// resumed on other worlds; the default mode is not (the control that shows the check can fail).
#include "cli_support.hpp"

#include <random>

namespace {

Result train_on(int world, const std::string& args) {
  if (world == 1) return run("train " + args);
  return run("launch --nproc-per-node " + std::to_string(world) + " -- mltrain train " + args);
}

struct Model {
  std::string name, args;
  int64_t steps;
};

// Three models of the issue: the MLP (dropout 0.1), the CNN with BatchNorm, dropout and per-sample
// augmentation, and a char-GPT with dropout 0.1, each with a global batch split into 12 shards.
std::vector<Model> models(const fs::path& d) {
  if (!fs::exists(d / "tok" / "meta.json"))
    REQUIRE(run("data tokenize /usr/share/games/fortunes/literature -o " + (d / "tok").string() +
                " --bytes --val-fraction 0.1")
                .code == 0);
  const std::string common =
      " distributed.invariance=bitwise data.batch_size=auto "
      "train.final_eval=sample train.final_eval_samples=200 "
      "distributed.timeout_s=60 run.dir=" +
      d.string();
  return {
      {"mlp",
       kSrc +
           "/configs/fashion_mnist_mlp.yaml data.limit_train=2400 train.duration=2ep "
           "train.global_batch=120 checkpoint.every=4u model.dropout=0.1" +
           common,
       40},
      {"cnn",
       kSrc +
           "/configs/fashion_mnist_cnn.yaml data.limit_train=960 train.duration=2ep "
           "train.global_batch=96 checkpoint.every=4u data.augment.crop.p=0.5 "
           "data.augment.flip.p=0.5 data.augment.erase.p=0.3" +
           common,
       20},
      {"gpt",
       kSrc + "/configs/text_char_gpt.yaml data.root=" + (d / "tok").string() +
           " model.n_layer=2 model.n_embd=32 model.n_head=2 model.block_size=32 "
           "model.dropout=0.1 train.duration=16u train.eval_every=8u train.global_batch=24 "
           "data.eval_batch_size=64 checkpoint.every=4u schedule.warmup=2u "
           "train.final_eval_samples=64" +
           common,
       16},
  };
}

}  // namespace

TEST_CASE(
    "invariance bitwise: MLP, CNN with BatchNorm and augmentation, char-GPT with dropout end in "
    "the same bytes on 1, 2, 3 and 4 Gloo ranks; the default mode does not",
    "[cli][dist][invariance]") {
  const auto d = tmpdir("invariance_worlds");
  for (const auto& m : models(d)) {
    std::pair<std::string, std::string> reference;
    for (const int world : {1, 2, 3, 4}) {
      const std::string name = m.name + "_w" + std::to_string(world);
      const auto r = train_on(world, m.args + " run.name=" + name);
      INFO(m.name << " world " << world << "\n" << r.out);
      REQUIRE(r.code == 0);
      const auto got = final_digests(d / name);
      CHECK(fs::exists(d / name / "v0" / "checkpoints" / ("step_" + std::to_string(m.steps))));
      if (world == 1)
        reference = got;
      else
        CHECK(got == reference);
      if (m.name == "mlp")  // evaluations read the whole test split, not whole global batches
        for (const auto& line : lines_of(d / name / "v0" / "metrics.jsonl"))
          if (const auto rec = nlohmann::json::parse(line); rec.value("event", "") == "eval")
            CHECK(rec.at("samples").get<int64_t>() == 10000);
    }
  }
  // The control: the same MLP and global batch without the mode moves with the world.
  std::string args = models(d)[0].args;
  args.replace(args.find("distributed.invariance=bitwise"), 30, "distributed.invariance=none");
  REQUIRE(train_on(1, args + " run.name=none_w1").code == 0);
  REQUIRE(train_on(2, args + " run.name=none_w2").code == 0);
  CHECK(final_digests(d / "none_w1").first != final_digests(d / "none_w2").first);
}

TEST_CASE(
    "invariance bitwise: SIGKILL at a seeded step, resumed on another world (2->1, 2->3, "
    "4->2->3), ends in the bytes of the uninterrupted world-1 run",
    "[cli][dist][invariance]") {
  const auto d = tmpdir("invariance_resume");
  std::mt19937 seeded(20261205);
  for (const auto& m : models(d)) {
    REQUIRE(train_on(1, m.args + " run.name=" + m.name + "_ref").code == 0);
    const auto reference = final_digests(d / (m.name + "_ref"));
    const std::vector<std::vector<int>> chains = {{2, 1}, {2, 3}, {4, 2, 3}};
    for (const auto& chain : chains) {
      std::string name = m.name + "_";
      for (int w : chain) name += std::to_string(w);
      for (size_t i = 0; i < chain.size(); ++i) {
        const bool last = i + 1 == chain.size();
        // Each attempt but the last is killed at a step past its resume point, seeded.
        const int64_t at =
            int64_t(i + 1) * m.steps / int64_t(chain.size()) + 1 + int64_t(seeded() % 3);
        Result r;
        if (last) {
          r = train_on(chain[i], m.args + " run.name=" + name);
        } else {  // the highest rank SIGKILLs itself at that step on the first attempt
          ScopedEnv kill(
              {{"MLTRAIN_TEST_KILL", std::to_string(chain[i] - 1) + ":" + std::to_string(at)}});
          r = train_on(chain[i], m.args + " run.name=" + name);
        }
        INFO(m.name << " chain " << name << " attempt " << i << " killed at " << at << "\n"
                    << r.out);
        if (!last) {
          REQUIRE(r.code != 0);
          continue;
        }
        REQUIRE(r.code == 0);
        CHECK(r.out.find("world " + std::to_string(chain[i - 1]) + " -> " +
                         std::to_string(chain[i]) + " ranks") != std::string::npos);
        CHECK(final_digests(d / name) == reference);
      }
    }
  }
}

TEST_CASE(
    "invariance bitwise: worlds, settings and checkpoints it cannot honour exit 2 naming the key "
    "and the fix",
    "[cli][dist][invariance]") {
  const auto d = tmpdir("invariance_bad");
  const std::string base = tiny_mlp(d, "bad", 1200,
                                    "train.duration=4u train.global_batch=120 "
                                    "data.batch_size=auto checkpoint.every=2u");
  const std::string bitwise = base + " distributed.invariance=bitwise";
  // A world that does not divide the virtual shards: the valid ones are named.
  auto r = run("launch --nproc-per-node 5 -- mltrain " + bitwise + " run.name=five");
  INFO(r.out);
  CHECK(r.code == 2);  // every rank refuses before joining; the launcher passes the code on
  CHECK(r.out.find("a world of 5 ranks does not divide the 12 virtual shards") !=
        std::string::npos);
  CHECK(r.out.find("1, 2, 3, 4, 6, 12") != std::string::npos);
  r = run(bitwise + " distributed.virtual_shards=7 run.name=seven");
  CHECK(r.code == 2);
  CHECK(r.out.find("train.global_batch") != std::string::npos);
  CHECK(r.out.find("not a positive multiple of distributed.virtual_shards 7") != std::string::npos);
  // Settings whose result would still depend on the world, each refused at config time.
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"optim.name=onebit_adam", "optim.name"},
      {"amp.enabled=true amp.dtype=fp16", "amp.dtype"},
      {"distributed.compress=bf16", "distributed.compress"},
      {"distributed.pipeline.stages=2", "distributed.pipeline.stages"},
      {"data.batch_size=60", "data.batch_size"},
      {"memory.micro_batch=10", "memory.micro_batch"},
      {"train.lr_scaling=linear", "train.lr_scaling"},
      {"schedule.name=plateau", "schedule.name"},
      {"data.augment.mixup.p=0.5", "data.augment.mixup"},
      {"runtime.device=cuda", "runtime.device"},
  };
  for (const auto& [setting, key] : refused) {
    r = run("config check " + kSrc + "/configs/fashion_mnist_mlp.yaml " +
            "distributed.invariance=bitwise train.global_batch=120 data.batch_size=auto " +
            setting);
    INFO(setting << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find(key) != std::string::npos);
    CHECK(r.out.find("under distributed.invariance=bitwise") != std::string::npos);
  }
  // A checkpoint written without the mode, resumed with it, and the reverse.
  REQUIRE(run(base + " run.name=plain train.duration=2u").code == 0);
  const fs::path plain = d / "plain" / "v0" / "checkpoints" / "step_2";
  r = run(bitwise + " run.name=plain checkpoint.resume=" + plain.string());
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("distributed.invariance: is bitwise, and the checkpoint") != std::string::npos);
  CHECK(r.out.find("was written with none") != std::string::npos);
  REQUIRE(run(bitwise + " run.name=exact train.duration=2u").code == 0);
  const std::string exact =
      " checkpoint.resume=" + (d / "exact" / "v0" / "checkpoints" / "step_2").string();
  r = run(base + " run.name=exact" + exact);
  CHECK(r.code == 2);
  CHECK(r.out.find("was written with bitwise") != std::string::npos);
  r = run(bitwise + " run.name=exact distributed.virtual_shards=6" + exact);
  CHECK(r.code == 2);
  CHECK(r.out.find("was written with 12 virtual shards") != std::string::npos);
  // Resumed as written, it continues to the end.
  r = run(bitwise + " run.name=exact" + exact);
  CHECK(r.code == 0);
  CHECK(r.out.find("(step 2, epoch 0, batch 2)") != std::string::npos);
}

TEST_CASE(
    "invariance bitwise under mltrain tune: trials run the mode; pipeline stages with it fail the "
    "first trial with the config error and stop the study",
    "[cli][invariance][tune]") {
  const auto d = tmpdir("invariance_tune");
  auto study = [&](const std::string& name, const std::string& extra) {
    const fs::path yaml = d / (name + ".yaml");
    std::ofstream(yaml) << "study: {name: " << name << ", dir: " << d.string()
                        << ", seed: 0, n_trials: 2}\n"
                           "sampler: {name: random}\n"
                           "objective: {metric: accuracy, direction: maximize}\n"
                           "trial:\n  train: "
                        << kSrc
                        << "/configs/fashion_mnist_mlp.yaml\n"
                           "  overrides: [train.duration=1ep, data.limit_train=1200, "
                           "data.val_fraction=0.1, distributed.invariance=bitwise, "
                           "train.global_batch=120, data.batch_size=auto"
                        << extra
                        << "]\n"
                           "space:\n  optim.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: "
                           "true}\n";
    return run("tune " + yaml.string());
  };
  auto ok = study("plain", "");
  INFO(ok.out);
  REQUIRE(ok.code == 0);
  CHECK(ok.out.find("2 trials: 2 complete") != std::string::npos);
  auto bad = study("piped", ", distributed.pipeline.stages=2");
  INFO(bad.out);
  CHECK(bad.code == 2);
  CHECK(bad.out.find("rejected its configuration") != std::string::npos);
  CHECK(slurp(d / "piped" / "trials" / "t0000.log").find("distributed.pipeline.stages") !=
        std::string::npos);
}
