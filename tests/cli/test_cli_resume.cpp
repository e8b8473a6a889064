// Resume, exhaustively: each of three runs is killed with SIGKILL at seeded random moments (a
// random step, then a random delay inside it, so some kills land mid-checkpoint) and restarted with
// the same command until it finishes; its final weights, optimizer state and every metrics record
// must be bitwise equal to the same run never interrupted.
//   MLTRAIN_RESUME_SEED=N picks other moments (the seed and every kill are printed).
#include <spawn.h>

#include <map>
#include <random>

#include "cli_support.hpp"

namespace {

struct Harness {
  std::mt19937_64 rng;
  int kills = 0;
};

uint64_t seed_of_env() {
  const char* s = std::getenv("MLTRAIN_RESUME_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20261202;
}

// The highest train step recorded so far (0 when none).
int64_t last_step(const fs::path& metrics) {
  int64_t step = 0;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("\"step\":");
    if (line.find("\"event\":\"train\"") != std::string::npos && at != std::string::npos)
      step = std::max<int64_t>(step, std::atoll(line.c_str() + at + 7));
  }
  return step;
}

// Records without what depends on the clock or the machine, as text (each value as printed).
std::vector<std::string> records(const fs::path& metrics) {
  std::vector<std::string> out;
  for (const auto& line : lines_of(metrics)) {
    auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "summary") continue;
    for (const char* k :
         {"samples_per_s", "data_wait", "time_s", "rss_mib", "elapsed_s", "augment_us_per_sample"})
      j.erase(k);
    out.push_back(j.dump());
  }
  return out;
}

// Kills the run at `kills` seeded random moments, restarting it each time, then lets it finish.
void kill_and_resume(Harness& h, const std::vector<std::string>& args, const fs::path& run_dir,
                     const fs::path& log, int64_t total_steps, int kills) {
  const fs::path metrics = run_dir / "metrics.jsonl";
  for (int k = 0; k < kills; ++k) {
    const int64_t from = last_step(metrics);
    const int64_t span = std::max<int64_t>(1, (total_steps - from) / 3);
    const int64_t at = std::min<int64_t>(total_steps - 1, from + 1 + int64_t(h.rng() % span));
    const int delay_us = int(h.rng() % 30000);
    std::printf("  kill %d: at step %lld + %d us (step %lld recorded before this start)\n", k + 1,
                static_cast<long long>(at), delay_us, static_cast<long long>(from));
    const pid_t pid = spawn_group(args, log);
    // The moment is chosen, not waited out: the kill follows a recorded step, then a random delay.
    const bool reached = wait_for([&] { return last_step(metrics) >= at; }, 300);
    if (!reached) {
      ::kill(-pid, SIGKILL);
      wait_exit(pid);
      FAIL("step " << at << " never recorded; log:\n" << slurp(log));
    }
    ::usleep(static_cast<useconds_t>(delay_us));
    ::kill(-pid, SIGKILL);
    const int code = wait_exit(pid);
    if (code == 0) break;  // it finished inside the delay: nothing more to interrupt
    REQUIRE(code == 128 + SIGKILL);
    ++h.kills;
  }
  const pid_t pid = spawn_group(args, log);
  REQUIRE(wait_exit(pid) == 0);
}

void check_equal(const fs::path& ref, const fs::path& got, int64_t final_step) {
  const std::string ck = "checkpoints/step_" + std::to_string(final_step);
  for (const char* f : {"model.safetensors", "state.safetensors"}) {
    INFO(f);
    const std::string a = slurp(ref / ck / f);
    REQUIRE(a.size() > 1000);
    CHECK(a == slurp(got / ck / f));
  }
  const auto ra = records(ref / "metrics.jsonl"), rb = records(got / "metrics.jsonl");
  CHECK(ra.size() == rb.size());
  for (size_t i = 0; i < std::min(ra.size(), rb.size()); ++i) {
    INFO("record " << i);
    CHECK(ra[i] == rb[i]);  // each step once, in order, every value to the last digit
  }
}

}  // namespace

TEST_CASE("resume harness: >= 20 random SIGKILLs over three runs, all bitwise equal to unkilled",
          "[cli][resume][harness]") {
  const uint64_t seed = seed_of_env();
  std::printf("resume harness seed %llu (MLTRAIN_RESUME_SEED)\n",
              static_cast<unsigned long long>(seed));
  Harness h{std::mt19937_64(seed)};
  auto d = tmpdir("resume_harness");

  struct Case {
    std::string name;
    std::vector<std::string> args;
    int64_t steps;
    int kills;
  };
  const std::string ds = "data.limit_train=3000";
  std::vector<Case> cases;
  {  // CNN: augmentation, EMA, gradient accumulation, AutoClip (adaptive clipping)
    auto a = small_run(d, "cnn");
    for (const char* kv :
         {"train.duration=60u", "checkpoint.every=7u", "train.log_every=1u", "train.eval_every=20u",
          "train.tensorboard=false", "train.accumulate=2", "ema.enabled=true", "ema.decay=0.9",
          "clip.mode=adaptive", "clip.warmup=5", "data.augment.flip.p=0.5",
          "data.augment.crop.p=0.5", "data.augment.erase.p=0.3", "data.workers=2"})
      a.push_back(kv);
    cases.push_back({"cnn", a, 60, 8});
  }
  // The MLP on 3000 samples, batch 32, a record per step; `extra` makes each run its own.
  auto mlp = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> a = {kBin,
                                  "train",
                                  kSrc + "/configs/fashion_mnist_mlp.yaml",
                                  "run.dir=" + d.string(),
                                  "run.name=" + name,
                                  ds,
                                  "data.batch_size=32",
                                  "train.log_every=1u",
                                  "train.tensorboard=false"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  // MLP: a validation split and a scheduled label smoothing
  cases.push_back(
      {"mlp",
       mlp("mlp", {"data.val_fraction=0.1", "train.duration=150u", "train.eval_every=25u",
                   "checkpoint.every=11u", "label_smoothing.value=0.2",
                   "label_smoothing.schedule.name=cosine", "runtime.threads=2"}),
       150, 7});
  // 2 ranks over Gloo, launched by `mltrain train` itself (a free port each start); the whole
  // process group is killed
  cases.push_back({"ddp",
                   mlp("ddp", {"train.duration=90u", "train.eval_every=30u", "checkpoint.every=8u",
                               "distributed.nproc_per_node=2", "runtime.threads=1"}),
                   90, 7});

  for (auto& c : cases) {
    INFO(c.name);
    std::printf("%s: %d kills planned\n", c.name.c_str(), c.kills);
    auto ref = c.args;
    for (auto& a : ref)
      if (a == "run.name=" + c.name) a = "run.name=" + c.name + "_ref";
    const pid_t pid = spawn_group(ref, d / (c.name + "_ref.log"));
    REQUIRE(wait_exit(pid) == 0);
    kill_and_resume(h, c.args, d / c.name / "v0", d / (c.name + ".log"), c.steps, c.kills);
    check_equal(d / (c.name + "_ref") / "v0", d / c.name / "v0", c.steps);
    CHECK_FALSE(fs::exists(d / c.name / "v1"));  // every restart resumed the same run
  }
  std::printf("resume harness: %d kills survived, seed %llu\n", h.kills,
              static_cast<unsigned long long>(seed));
  CHECK(h.kills >= 20);
}
