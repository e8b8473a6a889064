// `mltrain train` and the memory chapter: data.batch_size=auto under runtime.memory_budget (probe,
// cache, micro-batches in the metrics), and the bad input of the memory options (exit 2 naming the
// key and the fix).
#include "cli_support.hpp"

namespace {

std::string mlp(const fs::path& d) {
  return "train " + kSrc + "/configs/fashion_mnist_mlp.yaml run.dir=" + d.string() +
         " train.duration=12u train.eval_every=12u train.log_every=1u checkpoint.every=never"
         " data.workers=1";
}

}  // namespace

TEST_CASE("data.batch_size=auto: the probe picks a micro-batch under the budget, cached",
          "[cli][memory]") {
  auto d = tmpdir("memory_auto");
  const std::string env = "XDG_CACHE_HOME=" + (d / "cache").string() + " ";
  const std::string args = mlp(d) +
                           " data.batch_size=auto train.global_batch=1024 "
                           "runtime.memory_budget=24MiB";
  auto r = sh(env + kBin + " " + args + " run.name=a");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out,
             Catch::Contains("[memory] micro-batch") && Catch::Contains("of 1024 fits 24MiB"));
  // The probe counted what the run holds (weights, optimizer state, both loaders' slots): the
  // budget, enforced by the counting allocator, is never hit.
  CHECK_THAT(r.out, !Catch::Contains("out of memory"));
  int64_t micro = 0;
  for (const auto& l : lines_of(d / "a/v0/metrics.jsonl")) {
    auto j = nlohmann::json::parse(l);
    if (j["event"] == "train") {
      REQUIRE(j.contains("micro_batch"));
      micro = j["micro_batch"].get<int64_t>();
    }
  }
  CHECK(micro >= 1);
  CHECK(micro < 1024);
  CHECK(fs::exists(d / "cache/mltrain/micro_batch"));
  // The same config again: no probe, the cached micro-batch.
  auto again = sh(env + kBin + " " + args + " run.name=b");
  REQUIRE(again.code == 0);
  CHECK_THAT(again.out, Catch::Contains("(cached in"));
  CHECK_THAT(again.out, Catch::Contains("micro-batch " + std::to_string(micro) + " of 1024"));
}

TEST_CASE("memory options: bad input exits 2 naming the key and the fix", "[cli][memory]") {
  auto d = tmpdir("memory_bad");
  const std::string env = "XDG_CACHE_HOME=" + (d / "cache").string() + " ";
  struct Row {
    std::string overrides, key, fix;
  };
  const std::vector<Row> rows = {
      {"data.batch_size=auto train.global_batch=256 runtime.memory_budget=64KiB",
       "runtime.memory_budget", "raise runtime.memory_budget"},
      {"memory.checkpoint=blocks", "memory.checkpoint", "model.name=resnet or gpt"},
      {"amp.fp32_modules=[body.9,nope]", "amp.fp32_modules", "body.0"},
      {"data.batch_size=auto", "data.batch_size", "train.global_batch"},
      {"runtime.memory_budget=lots", "runtime.memory_budget", "2GiB"},
  };
  for (const auto& row : rows) {
    INFO(row.overrides);
    auto r = sh(env + kBin + " " + mlp(d) + " run.name=bad " + row.overrides);
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK_THAT(r.out, Catch::Contains(row.key) && Catch::Contains(row.fix));
  }
}

TEST_CASE("config check notes BatchNorm under accumulation or micro-batches, with the fix",
          "[cli][memory]") {
  const std::string cnn = "config check " + kSrc + "/configs/fashion_mnist_cnn.yaml";
  auto plain = run(cnn);
  REQUIRE(plain.code == 0);
  CHECK_THAT(plain.out, !Catch::Contains("note:"));
  for (const std::string ov : {"train.accumulate=4", "memory.micro_batch=32"}) {
    INFO(ov);
    auto r = run(cnn + " " + ov);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("note: model.batchnorm") && Catch::Contains("GroupNorm"));
  }
  auto no_bn = run(cnn + " train.accumulate=4 model.batchnorm=false");
  CHECK_THAT(no_bn.out, !Catch::Contains("note:"));
}
