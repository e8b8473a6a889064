// Injected faults (MLTRAIN_FAULT, core/fault.hpp): a run killed at every step of the checkpoint
// protocol resumes from a complete checkpoint and ends bitwise equal to a run never killed; a full
// disk and a read-only run folder stop the run with a clear error, the previous checkpoint intact.
#include <sys/mount.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <map>

#include "cli_support.hpp"

namespace {

// 30 steps of the small CNN, a checkpoint every 10 and only the newest kept: the checkpoint at
// step 20 writes five files, renames its folder, swaps `latest` and prunes step_10.
std::vector<std::string> fault_run(const fs::path& d, const std::string& name) {
  auto a = small_run(d, name);
  for (const char* kv : {"train.duration=30u", "checkpoint.keep_last=1", "checkpoint.keep_best=0",
                         "train.log_every=1u", "train.tensorboard=false"})
    a.push_back(kv);
  return a;
}

// Nothing a killed writer left: no .partial folder, no temp file, no folder without its manifest.
void check_no_leftovers(const fs::path& run) {
  for (const auto& e : fs::recursive_directory_iterator(run)) {
    const std::string n = e.path().filename().string();
    INFO(e.path());
    CHECK(n.find(".partial") == std::string::npos);
    CHECK(n.find(".tmp.") == std::string::npos);
    if (e.is_directory() && n.rfind("step_", 0) == 0) CHECK(fs::exists(e.path() / "manifest.json"));
  }
}

// Every file a checkpoint's manifest lists has its size and SHA-256 (checked with sha256sum, not
// with mltrain's own code).
void check_manifest(const fs::path& ck) {
  const auto m = nlohmann::json::parse(slurp(ck / "manifest.json"));
  REQUIRE(m.at("files").size() >= 3);
  for (const auto& [name, e] : m.at("files").items()) {
    INFO(ck / name);
    REQUIRE(fs::exists(ck / name));
    CHECK(fs::file_size(ck / name) == e.at("bytes").get<uint64_t>());
    const auto sum = sh("sha256sum '" + (ck / name).string() + "'");
    CHECK(sum.out.substr(0, 64) == e.at("sha256").get<std::string>());
  }
}

struct Mount {  // a small tmpfs for the disk tests (CI runs as root)
  fs::path dir;
  explicit Mount(const fs::path& d, const std::string& size) : dir(d) {
    fs::create_directories(dir);
    REQUIRE(::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0);
  }
  ~Mount() { ::umount2(dir.c_str(), MNT_DETACH); }
};

}  // namespace

TEST_CASE("killed at every checkpoint-protocol point: resumes from a complete checkpoint, bitwise",
          "[cli][fault]") {
  auto d = tmpdir("faults");
  REQUIRE(run(join(fault_run(d, "reference"), 1)).code == 0);
  const fs::path ref = d / "reference/v0/checkpoints/step_30";
  REQUIRE(fs::exists(ref / "model.safetensors"));

  // point@n (n: the checkpoint at step 20 for per-file points) and the checkpoint the resumed
  // run must restore: step_10 until step_20's folder is renamed, step_20 after.
  // `leaves`: the kill leaves something for the next start to remove (a .partial folder, a temp
  // file, a half-pruned folder); after the folder rename, or after `latest`'s rename, nothing.
  struct Point {
    std::string fault;
    int64_t resumes_from;
    bool leaves;
  };
  std::vector<Point> points;
  for (const char* file :
       {"model.safetensors", "state.safetensors", "trainer.json", "manifest.json"})
    for (const char* stage : {"write", "fsync", "rename", "dirsync"})
      points.push_back({std::string(stage) + ":" + file + "@2", 10, true});
  points.push_back({"ckpt.folder_rename@2", 10, true});
  points.push_back({"ckpt.folder_renamed@2", 20, false});
  for (const char* stage : {"write", "fsync", "rename", "dirsync"})
    points.push_back({std::string(stage) + ":latest@2", 20, std::string(stage) != "dirsync"});
  points.push_back({"ckpt.prune@1", 20, true});  // step_10 half-removed, step_20 complete

  int survived = 0;
  for (const auto& p : points) {
    DYNAMIC_SECTION(p.fault) {
      const std::string name = "k" + std::to_string(&p - points.data());
      const auto args = fault_run(d, name);
      auto killed = sh("MLTRAIN_FAULT=" + p.fault + " " + kBin + join(args, 1));
      REQUIRE(killed.code == 128 + SIGKILL);
      CHECK_THAT(killed.out, Catch::Contains("[fault] killed at " + p.fault));
      const fs::path run_dir = d / name / "v0";
      CHECK(!fs::exists(run_dir / "checkpoints/step_30"));
      CHECK_THAT(run("runs " + run_dir.string()).out, Catch::Contains("interrupted at step"));

      auto resumed = run(join(args, 1));
      REQUIRE(resumed.code == 0);
      CHECK_THAT(resumed.out, Catch::Contains("restored " + (run_dir / "checkpoints").string() +
                                              "/step_" + std::to_string(p.resumes_from) + " "));
      CHECK((resumed.out.find("(left by a killed run)") != std::string::npos) == p.leaves);
      const fs::path got = run_dir / "checkpoints/step_30";
      CHECK(slurp(got / "model.safetensors") == slurp(ref / "model.safetensors"));
      CHECK(slurp(got / "state.safetensors") == slurp(ref / "state.safetensors"));
      check_metrics_once(run_dir / "metrics.jsonl", 30);
      check_no_leftovers(run_dir);
      ++survived;
    }
  }
  std::printf("fault points survived: %d of %zu\n", survived, points.size());
}

TEST_CASE("disk full mid-run: clear error, exit 1, previous checkpoint intact, resumes after",
          "[cli][fault][disk]") {
  auto d = tmpdir("diskfull");
  Mount m(d / "mnt", "8m");
  const auto args = fault_run(m.dir, "full");
  const pid_t pid = spawn(args, d / "full.log");
  const fs::path ck = m.dir / "full/v0/checkpoints";
  // Once step_10 is complete, fill the file system to the last byte.
  REQUIRE(wait_for([&] { return fs::exists(ck / "step_10/manifest.json"); }, 120));
  {
    std::ofstream filler(m.dir / "filler", std::ios::binary);
    const std::string block(1 << 16, 'x');
    while (filler.write(block.data(), block.size())) {
    }
  }
  {  // and the tail: single bytes until nothing more fits
    std::ofstream tail(m.dir / "filler_tail", std::ios::binary);
    for (int i = 0; i < (1 << 16) && tail.put('x') && tail.flush(); ++i) {
    }
  }
  const int code = wait_exit(pid);
  const std::string log = slurp(d / "full.log");
  INFO(log);
  CHECK(code == 1);
  CHECK_THAT(log, Catch::Contains("No space left on device"));
  CHECK_THAT(log, Catch::Contains("fix: free disk space"));
  CHECK(log.find("terminate called") == std::string::npos);
  // The newest complete checkpoint verifies, whatever step the disk filled at.
  std::vector<fs::path> complete;
  for (const auto& e : fs::directory_iterator(ck))
    if (e.is_directory() && fs::exists(e.path() / "manifest.json")) complete.push_back(e.path());
  REQUIRE(!complete.empty());
  for (const auto& c : complete) check_manifest(c);
  // Space freed, the same command resumes and finishes, bitwise as a run never interrupted.
  fs::remove(m.dir / "filler");
  fs::remove(m.dir / "filler_tail");
  auto resumed = run(join(args, 1));
  INFO(resumed.out);
  REQUIRE(resumed.code == 0);
  REQUIRE(run(join(fault_run(d, "reference"), 1)).code == 0);
  CHECK(slurp(ck / "step_30/model.safetensors") ==
        slurp(d / "reference/v0/checkpoints/step_30/model.safetensors"));
  check_metrics_once(m.dir / "full/v0/metrics.jsonl", 30);
}

TEST_CASE("read-only run folder: clear error, exit 1, checkpoints untouched",
          "[cli][fault][disk]") {
  auto d = tmpdir("readonly");
  Mount m(d / "mnt", "64m");
  auto args = fault_run(m.dir, "ro");
  args.push_back("train.duration=20u");
  REQUIRE(run(join(args, 1)).code == 0);
  std::ofstream(m.dir / "ro/v0/status.json") << "{\"state\": \"running\"}";  // as if killed
  const fs::path ck = m.dir / "ro/v0/checkpoints/step_20";
  const std::string model = slurp(ck / "model.safetensors");
  REQUIRE(::mount(nullptr, m.dir.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0);
  args.back() = "train.duration=30u";  // resume it: the first write fails
  auto r = run(join(args, 1));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("Read-only file system"));
  CHECK_THAT(r.out, Catch::Contains(m.dir.string()));
  CHECK(r.out.find("terminate called") == std::string::npos);
  CHECK(slurp(ck / "model.safetensors") == model);
  REQUIRE(::mount(nullptr, m.dir.c_str(), nullptr, MS_REMOUNT, nullptr) == 0);
  auto again = run(join(args, 1));
  CHECK(again.code == 0);
  CHECK(fs::exists(m.dir / "ro/v0/checkpoints/step_30/manifest.json"));
}

TEST_CASE("a crash (SIGSEGV) prints a report with a backtrace and still exits 139",
          "[cli][fault][crash]") {
  auto d = tmpdir("crash_report");
  auto args = small_run(d, "crash");
  args.push_back("train.duration=40ep");  // long enough to be running when the signal lands
  const pid_t pid = spawn(args, d / "crash.log");
  // Mid-training: once the first step's metrics are on disk.
  REQUIRE(wait_for(
      [&] { return slurp(d / "crash/v0/metrics.jsonl").find("\"train\"") != std::string::npos; },
      120));
  ::syscall(SYS_tgkill, pid, pid, SIGSEGV);  // to the main thread (its tid is the pid)
  const int code = wait_exit(pid);
  const std::string log = slurp(d / "crash.log");
  INFO(log);
  CHECK(code == 128 + SIGSEGV);  // the default action still ends it: shells and Slurm see 139
  CHECK_THAT(log, Catch::Contains("mltrain: fatal signal 11 (SIGSEGV"));
  CHECK_THAT(log, Catch::Contains("please report it"));
  CHECK_THAT(log, Catch::Contains("backtrace:"));
  CHECK_THAT(log, Catch::Contains("mltrain(main+"));  // frames named (the executable exports them)
}
