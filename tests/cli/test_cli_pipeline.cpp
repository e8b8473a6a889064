// Pipeline parallelism (distributed.pipeline) over real processes: activations and gradients by
// Gloo send/recv, against one process with the same global batch.
#include "cli_support.hpp"

#include <cmath>
#include <cstring>
#include <map>

// The float32 tensors of a safetensors file: 8 bytes of header length, the JSON header (name ->
// dtype, shape, data_offsets), then the raw little-endian data.
static std::map<std::string, std::vector<float>> tensors_of(const fs::path& p) {
  const std::string bytes = slurp(p);
  REQUIRE(bytes.size() >= 8);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__" || v["dtype"] != "F32") continue;
    const size_t a = v["data_offsets"][0], b = v["data_offsets"][1];
    std::vector<float> t((b - a) / 4);
    std::memcpy(t.data(), bytes.data() + 8 + n + a, b - a);
    out[name] = std::move(t);
  }
  return out;
}

// The largest difference of any tensor relative to that tensor's largest magnitude.
static double weights_rel_diff(const fs::path& a, const fs::path& b) {
  const auto x = tensors_of(a), y = tensors_of(b);
  REQUIRE(x.size() == y.size());
  REQUIRE(!x.empty());
  double worst = 0;
  for (const auto& [name, t] : x) {
    const auto& u = y.at(name);
    REQUIRE(u.size() == t.size());
    double scale = 1e-30, diff = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      scale = std::max(scale, double(std::fabs(t[i])));
      diff = std::max(diff, double(std::fabs(t[i] - u[i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

static std::vector<nlohmann::json> train_records(const fs::path& run) {
  std::vector<nlohmann::json> out;
  for (const auto& line : lines_of(run / "metrics.jsonl"))
    if (line.find("\"event\":\"train\"") != std::string::npos)
      out.push_back(nlohmann::json::parse(line));
  return out;
}

static double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(a), 1e-30); }

TEST_CASE(
    "pipeline stages train like one process: GPipe over 2 stages and 1F1B over 2 stages x 2 "
    "replicas give its loss, gradient norm and weights within 1e-5; a pipeline checkpoint "
    "resumes in one process",
    "[cli][dist][pipeline]") {
  const auto d = tmpdir("pipeline");
  // SGD with momentum: the weights after 8 steps are the gradients' sum, so equal weights mean
  // equal gradients (Adam would amplify rounding in near-zero gradients to whole steps).
  const std::string common = kSrc +
                             "/configs/fashion_mnist_mlp.yaml model.dropout=0 optim.name=sgd "
                             "optim.lr=0.05 optim.momentum=0.9 data.limit_train=4096 "
                             "train.duration=8u train.log_every=1u train.eval_every=4u "
                             "checkpoint.every=4u runtime.threads=1 distributed.timeout_s=60 "
                             "run.dir=" +
                             d.string();
  auto single = run("train " + common + " data.batch_size=64 run.name=single");
  INFO(single.out);
  REQUIRE(single.code == 0);
  auto gpipe = run("launch --nproc-per-node 2 -- mltrain train " + common +
                   " data.batch_size=64 run.name=gpipe distributed.pipeline.stages=2 "
                   "distributed.pipeline.microbatches=4 distributed.pipeline.schedule=gpipe");
  INFO(gpipe.out);
  REQUIRE(gpipe.code == 0);
  CHECK(gpipe.out.find("[pipeline] 2 stages x 1 replicas, 4 micro-batches per batch, gpipe; 6 "
                       "units cut by measured forward+backward time: stage 0: units 0..") !=
        std::string::npos);
  CHECK(gpipe.out.find("% theoretical (S-1)/(M+S-1) for S=2 M=4") != std::string::npos);
  // Four ranks: two pipelines of two stages, each stage averaging its gradients over its two
  // replicas; each replica reads half of the global batch of 64.
  auto mixed = run("launch --nproc-per-node 4 -- mltrain train " + common +
                   " data.batch_size=32 run.name=mixed distributed.pipeline.stages=2 "
                   "distributed.pipeline.microbatches=4 distributed.pipeline.schedule=1f1b");
  INFO(mixed.out);
  REQUIRE(mixed.code == 0);
  CHECK(mixed.out.find("[pipeline] 2 stages x 2 replicas") != std::string::npos);

  const auto a = train_records(d / "single" / "v0"), g = train_records(d / "gpipe" / "v0"),
             m = train_records(d / "mixed" / "v0");
  REQUIRE(a.size() == 8);
  REQUIRE(g.size() == 8);
  REQUIRE(m.size() == 8);
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("step " << a[i]["step"]);
    CHECK(rel(a[i]["loss"], g[i]["loss"]) < 1e-5);  // rank 0 logs the pipeline's whole batch
    CHECK(rel(a[i]["grad_norm"], g[i]["grad_norm"]) < 1e-5);
    CHECK(rel(a[i]["grad_norm"], m[i]["grad_norm"]) < 1e-5);  // over both stages and replicas
  }
  const fs::path w = fs::path("checkpoints") / "step_8" / "model.safetensors";
  CHECK(weights_rel_diff(d / "single" / "v0" / w, d / "gpipe" / "v0" / w) < 1e-5);
  CHECK(weights_rel_diff(d / "single" / "v0" / w, d / "mixed" / "v0" / w) < 1e-5);

  // Killed after its step-4 checkpoint, a 2-stage run resumes in one process: the checkpoint
  // holds every stage's weights and optimizer state, so it ends where the single run did.
  ::setenv("MLTRAIN_TEST_KILL", "1:6", 1);
  auto killed = run("launch --nproc-per-node 2 -- mltrain train " + common +
                    " data.batch_size=64 run.name=moved distributed.pipeline.stages=2");
  ::unsetenv("MLTRAIN_TEST_KILL");
  INFO(killed.out);
  REQUIRE(killed.code != 0);
  auto moved = run("train " + common + " data.batch_size=64 run.name=moved");
  INFO(moved.out);
  REQUIRE(moved.code == 0);
  CHECK(moved.out.find("(step 4, epoch 0, batch 4)") != std::string::npos);
  CHECK(weights_rel_diff(d / "single" / "v0" / w, d / "moved" / "v0" / w) < 1e-5);
}

TEST_CASE(
    "pipeline stages: the GPT's tied embedding and output layer sit on the first and last stage, "
    "and model.share's bases and gate layers on every stage; their gradients are summed there, and "
    "2 stages x 2 "
    "replicas train like one process",
    "[cli][dist][pipeline]") {
  const auto d = tmpdir("pipeline_gpt");
  REQUIRE(run("data tokenize /usr/share/games/fortunes/literature -o " + (d / "tokens").string() +
              " --bytes --val-fraction 0.1")
              .code == 0);
  // Clipping at 0.5 is active at every step (norms 1.2-1.8), so the norm over the stages must
  // count the tied weight once.
  const std::string common = kSrc + "/configs/text_char_gpt.yaml run.dir=" + d.string() +
                             " data.root=" + (d / "tokens").string() +
                             " model.n_layer=2 model.n_head=2 model.n_embd=32 "
                             "model.block_size=32 optim.name=sgd optim.lr=0.1 optim.momentum=0.9 "
                             "optim.weight_decay=0 clip.max_norm=0.5 train.duration=8u "
                             "train.eval_every=4u train.log_every=1u checkpoint.every=4u "
                             "schedule.warmup=2u runtime.threads=1 distributed.timeout_s=60";
  for (const std::string share : {"none", "gated", "gated_input"}) {
    INFO("model.share " << share);
    const std::string one = "single_" + share, two = "pp_" + share;
    auto single =
        run("train " + common + " model.share=" + share + " data.batch_size=16 run.name=" + one);
    INFO(single.out);
    REQUIRE(single.code == 0);
    auto pp = run("launch --nproc-per-node 4 -- mltrain train " + common + " model.share=" + share +
                  " data.batch_size=8 run.name=" + two +
                  " distributed.pipeline.stages=2 distributed.pipeline.microbatches=2");
    INFO(pp.out);
    REQUIRE(pp.code == 0);
    CHECK(pp.out.find("[pipeline] 2 stages x 2 replicas") != std::string::npos);
    const auto a = train_records(d / one / "v0"), b = train_records(d / two / "v0");
    REQUIRE(a.size() == 8);
    REQUIRE(b.size() == 8);
    for (size_t i = 0; i < a.size(); ++i) {
      INFO("step " << a[i]["step"]);
      CHECK(rel(a[i]["grad_norm"], b[i]["grad_norm"]) < 1e-5);
    }
    const fs::path w = fs::path("checkpoints") / "step_8" / "model.safetensors";
    CHECK(weights_rel_diff(d / one / "v0" / w, d / two / "v0" / w) < 1e-5);
  }
}

TEST_CASE("pipeline stages: a ResNet cut at block boundaries trains under bf16 autocast",
          "[cli][dist][pipeline]") {
  const auto d = tmpdir("pipeline_resnet");
  auto r = run("launch --nproc-per-node 2 -- mltrain train " + kSrc +
               "/configs/fashion_mnist_mlp.yaml model.name=resnet model.widths=[8,16] "
               "model.depths=[1,1] model.dropout=0 amp.enabled=true amp.dtype=bf16 "
               "data.limit_train=1024 data.batch_size=32 train.duration=4u runtime.threads=1 "
               "distributed.pipeline.stages=2 distributed.pipeline.microbatches=2 run.dir=" +
               d.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  // stem, two blocks, head: four units over two stages.
  CHECK(r.out.find("4 units cut by measured forward+backward time") != std::string::npos);
  CHECK(r.out.find("test accuracy: ") != std::string::npos);
}

TEST_CASE("pipeline stages: worlds and options that cannot hold them are refused with exit 2",
          "[cli][dist][pipeline]") {
  const std::string cfg = kSrc + "/configs/fashion_mnist_mlp.yaml data.limit_train=512 ";
  auto alone = run("train " + cfg + "distributed.pipeline.stages=2");
  CHECK(alone.code == 2);
  CHECK(alone.out.find("distributed.pipeline.stages: 2 stages need 2 ranks (one per stage), and "
                       "this run has 1") != std::string::npos);
  CHECK(alone.out.find("mltrain launch --nproc-per-node 2") != std::string::npos);
  auto uneven = run("launch --nproc-per-node 3 -- mltrain train " + cfg +
                    "runtime.threads=1 distributed.pipeline.stages=2");
  CHECK(uneven.code == 2);
  CHECK(uneven.out.find("2 stages do not divide a world of 3 ranks") != std::string::npos);
  // flatten, linear, relu, linear: four units cannot fill five stages.
  auto deep = run("launch --nproc-per-node 5 -- mltrain train " + cfg +
                  "runtime.threads=1 model.hidden=[32] model.dropout=0 "
                  "distributed.pipeline.stages=5");
  CHECK(deep.code == 2);
  CHECK(deep.out.find("has 4 units (layers or blocks) to cut, fewer than 5 stages") !=
        std::string::npos);
  auto cnn =
      run("config check " + cfg + "model.name=cnn distributed.pipeline.stages=2");  // no blocks
  CHECK(cnn.code == 2);
  CHECK(cnn.out.find("model.name") != std::string::npos);
  CHECK(cnn.out.find("cannot be cut into pipeline stages") != std::string::npos);
  auto combo = run("config check " + cfg +
                   "ema.enabled=true memory.checkpoint=blocks optim.name=onebit_adam "
                   "distributed.pipeline.stages=2 distributed.pipeline.microbatches=1000");
  CHECK(combo.code == 2);
  for (const char* key :
       {"ema.enabled", "memory.checkpoint", "optim.name", "distributed.pipeline.microbatches"}) {
    INFO(key);
    CHECK(combo.out.find(key) != std::string::npos);
  }
  auto schedule = run("config check " + cfg + "distributed.pipeline.schedule=interleaved");
  CHECK(schedule.code == 2);
  CHECK(schedule.out.find("distributed.pipeline.schedule") != std::string::npos);
}

TEST_CASE(
    "pipeline micro-batches auto: the fewest whose theoretical bubble meets the target (9 for 2 "
    "stages at 10 %, capped at the batch), reported with the measured bubble",
    "[cli][dist][pipeline]") {
  const auto d = tmpdir("pipeline_auto");
  const std::string common = kSrc +
                             "/configs/fashion_mnist_mlp.yaml data.limit_train=2048 "
                             "train.duration=6u runtime.threads=1 distributed.timeout_s=60 "
                             "distributed.pipeline.stages=2 distributed.pipeline.microbatches=auto "
                             "run.dir=" +
                             d.string();
  auto r = run("launch --nproc-per-node 2 -- mltrain train " + common +
               " data.batch_size=64 run.name=auto10");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(
      r.out.find("micro-batches auto: 9 for 2 stages (theoretical bubble 10.0 %, target 10.0 %") !=
      std::string::npos);
  CHECK(r.out.find("2 stages x 1 replicas, 9 micro-batches per batch") != std::string::npos);
  CHECK(r.out.find("% measured (") != std::string::npos);
  // A 5 % target would need 19; a batch of 8 caps it at 8 (one sample each).
  r = run("launch --nproc-per-node 2 -- mltrain train " + common +
          " data.batch_size=8 distributed.pipeline.target_bubble=0.05 run.name=capped");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("micro-batches auto: 8 for 2 stages (theoretical bubble 11.1 %, target 5.0 %") !=
        std::string::npos);
}
