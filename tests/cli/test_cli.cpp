// Runs the real `mltrain` binary: exit codes and messages for bad input, print-config round trip,
// SIGKILL mid-epoch then resume (bitwise equal weights), SIGTERM checkpointing, damaged checkpoints.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <zlib.h>

extern char** environ;
namespace fs = std::filesystem;

static const std::string kBin = MLTRAIN_BIN;
static const std::string kSrc = MLTRAIN_SOURCE_DIR;
static const std::string kFmnist = "/usr/share/datasets/fashion-mnist";

struct Result {
  int code;
  std::string out;
};

static Result sh(const std::string& command) {
  const std::string cmd = "{ " + command + " ; } 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

static Result run(const std::string& args) { return sh(kBin + " " + args); }

static fs::path tmpdir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("mltrain_test_cli_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

static std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

static pid_t spawn(const std::vector<std::string>& args, const fs::path& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, kBin.c_str(), &fa, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

static int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static bool wait_for(const std::function<bool()>& cond, double seconds) {
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// A small, quick, fully deterministic CNN run on real Fashion-MNIST data.
static std::vector<std::string> small_run(const fs::path& dir, const std::string& name) {
  return {kBin, "train", kSrc + "/configs/fashion_mnist_cnn.yaml", "run.dir=" + dir.string(), "run.name=" + name,
          "data.limit_train=3000", "data.batch_size=64", "data.eval_batch_size=500", "train.duration=2ep",
          "train.eval_every=1ep", "checkpoint.every=10u", "checkpoint.keep_last=3", "runtime.threads=2",
          "model.channels=[8, 16]", "model.fc=32", "data.workers=1"};
}
static std::string join(const std::vector<std::string>& v, size_t from) {
  std::string s;
  for (size_t i = from; i < v.size(); ++i) s += " '" + v[i] + "'";
  return s;
}

TEST_CASE("--version, --help and usage errors", "[cli]") {
  auto v = run("--version");
  CHECK(v.code == 0);
  CHECK_THAT(v.out, Catch::Contains("mltrain 0.1.0"));
  CHECK_THAT(v.out, Catch::Contains("LibTorch 1.13"));
  CHECK_THAT(v.out, Catch::Contains("kernel_route=onednn"));
  auto h = run("--help");
  CHECK(h.code == 0);
  for (const char* sub : {"train", "config", "data", "Exit codes"}) CHECK_THAT(h.out, Catch::Contains(sub));
  CHECK(run("").code == 2);
  CHECK(run("frobnicate").code == 2);
  CHECK(run("train").code == 2);  // the config is required
  CHECK(run("train x.yaml --no-such-flag").code == 2);
  auto s = run("config schema");
  CHECK(s.code == 0);
  CHECK_THAT(s.out, Catch::Contains("optim.lr"));
  CHECK_THAT(s.out, Catch::Contains("checkpoint.resume"));
}

TEST_CASE("print-config output fed back gives the same bytes", "[cli]") {
  auto d = tmpdir("printcfg");
  auto first = run("train " + kSrc + "/configs/fashion_mnist_cnn.yaml optim.lr=0.002 --run-name flagged --print-config");
  REQUIRE(first.code == 0);
  CHECK_THAT(first.out, Catch::Contains("name: \"flagged\""));  // the flag beats the file
  CHECK_THAT(first.out, Catch::Contains("lr: 0.002"));
  std::ofstream(d / "resolved.yaml") << first.out;
  auto second = run("train " + (d / "resolved.yaml").string() + " --print-config");
  REQUIRE(second.code == 0);
  CHECK(second.out == first.out);
}

TEST_CASE("malformed config corpus: documented exit code and a message naming file and key", "[cli][corpus]") {
  std::ifstream table(kSrc + "/tests/corpus/expected.tsv");
  std::string line;
  int rows = 0;
  auto d = tmpdir("corpus");
  while (std::getline(table, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string file, code, message;
    std::getline(ls, file, '\t');
    std::getline(ls, code, '\t');
    std::getline(ls, message);
    INFO(file);
    auto r = run("train " + kSrc + "/tests/corpus/configs/" + file + " run.dir=" + d.string());
    CHECK(r.code == std::stoi(code));
    CHECK_THAT(r.out, Catch::Contains(message));
    CHECK_THAT(r.out, Catch::Contains("fix:"));
    CHECK_THAT(r.out, !Catch::Contains("terminate called"));
    ++rows;
  }
  CHECK(rows >= 12);
  CHECK(fs::is_empty(d));  // no run folder is created for bad input
}

TEST_CASE("malformed data corpus: exit 3 naming the file and the reason", "[cli][corpus]") {
  auto d = tmpdir("datacorpus");
  const std::string real_gz = slurp(kFmnist + "/t10k-images-idx3-ubyte.gz");
  const std::string labels = kFmnist + "/t10k-labels-idx1-ubyte.gz";
  auto put = [&](const std::string& name, const std::string& bytes) {
    auto p = d / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  };
  std::string raw_idx;  // a small uncompressed IDX with a label out of range
  {
    raw_idx = std::string("\0\0\x08\x01\0\0\0\x03", 8) + std::string("\x01\x02\x0c", 3);
  }
  struct Row { std::string images, labels, expect; bool labels_at_fault = false; };
  const std::vector<Row> rows = {
      {put("truncated.gz", real_gz.substr(0, real_gz.size() / 3)), labels, "gzip"},
      {put("magic.idx", "\x01\x02\x03\x04 not idx at all"), labels, "wrong magic"},
      {kFmnist + "/train-images-idx3-ubyte.gz", labels, "shape mismatch: 10000 labels for 60000 images", true},
      {kFmnist + "/t10k-images-idx3-ubyte.gz", put("badlabels.idx", raw_idx), "label out of range at index 2: 12", true},
      {put("short.npy", std::string("\x93NUMPY\x01\x00\x76\x00", 10) + "{'descr': '|u1', 'fortran_order': False, 'shape': (10000, 28, 28), }" +
                            std::string(118 - 69, ' ') + "\n" + std::string(100, '\0')), labels, "truncated: header says 10000x28x28 u8"},
      {d.string() + "/missing.idx", labels, "file not found"},
  };
  for (const auto& r : rows) {
    INFO(r.images << " -> " << r.expect);
    auto res = run("train " + kSrc + "/configs/fashion_mnist_mlp.yaml run.dir=" + d.string() + "/runs data.dataset=files data.train_images=" +
                   r.images + " data.train_labels=" + r.labels + " data.test_images=" + kFmnist + "/t10k-images-idx3-ubyte.gz" +
                   " data.test_labels=" + labels);
    CHECK(res.code == 3);
    CHECK_THAT(res.out, Catch::Contains(r.expect));
    const std::string& culprit = r.labels_at_fault ? r.labels : r.images;
    CHECK_THAT(res.out, Catch::Contains("error: " + culprit + ": "));
  }
}

TEST_CASE("SIGKILL mid-epoch, resume: final weights bitwise equal to an uninterrupted run", "[cli][resume]") {
  auto d = tmpdir("killresume");
  auto ref = small_run(d, "reference");
  REQUIRE(run(join(ref, 1)).code == 0);

  auto args = small_run(d, "killed");
  pid_t pid = spawn(args, d / "killed1.log");
  // Wait until a mid-epoch checkpoint (step 20 of 46 per epoch) exists and training has gone on past it.
  const fs::path latest = d / "killed/v0/checkpoints/latest";
  REQUIRE(wait_for([&] { return fs::exists(latest) && slurp(latest).find("step_20") != std::string::npos; }, 120));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  kill(pid, SIGKILL);
  CHECK(wait_exit(pid) == 128 + SIGKILL);
  CHECK(!fs::exists(d / "killed/v0/checkpoints/step_92"));

  auto resumed = run(join(args, 1));
  REQUIRE(resumed.code == 0);
  CHECK_THAT(resumed.out, Catch::Contains("resuming in"));
  CHECK_THAT(resumed.out, Catch::Contains("restored"));
  const auto a = slurp(d / "reference/v0/checkpoints/step_92/model.safetensors");
  const auto b = slurp(d / "killed/v0/checkpoints/step_92/model.safetensors");
  REQUIRE(a.size() > 1000);
  CHECK(a == b);
  CHECK(slurp(d / "reference/v0/checkpoints/step_92/state.safetensors") ==
        slurp(d / "killed/v0/checkpoints/step_92/state.safetensors"));
  // A finished run is not resumed again: the next invocation starts v1.
  auto again = run(join(args, 1) + " train.duration=1u");
  CHECK(again.code == 0);
  CHECK(fs::exists(d / "killed/v1"));
}

TEST_CASE("SIGTERM: checkpoint at the next step, exit 143, then resume and finish", "[cli][resume]") {
  auto d = tmpdir("sigterm");
  auto args = small_run(d, "term");
  args.push_back("checkpoint.every=never");
  pid_t pid = spawn(args, d / "term.log");
  REQUIRE(wait_for([&] { return slurp(d / "term.log").find("[train]") != std::string::npos; }, 60));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(pid, SIGTERM);
  CHECK(wait_exit(pid) == 128 + SIGTERM);
  const auto status = slurp(d / "term/v0/status.json");
  CHECK_THAT(status, Catch::Contains("interrupted"));
  CHECK(fs::exists(d / "term/v0/checkpoints/latest"));
  CHECK_THAT(slurp(d / "term.log"), Catch::Contains("signal 15 received"));
  auto resumed = run(join(args, 1));
  CHECK(resumed.code == 0);
  CHECK_THAT(slurp(d / "term/v0/status.json"), Catch::Contains("finished"));
}

TEST_CASE("damaged checkpoints: fall back with a warning; an explicit damaged one exits 3", "[cli][resume]") {
  auto d = tmpdir("damaged");
  auto args = small_run(d, "dmg");
  args.push_back("train.duration=30u");
  REQUIRE(run(join(args, 1)).code == 0);
  // Mark the run unfinished and corrupt its newest checkpoint, as a crash mid-write on a bad disk would.
  std::ofstream(d / "dmg/v0/status.json") << "{\"state\": \"running\"}";
  fs::resize_file(d / "dmg/v0/checkpoints/step_30/model.safetensors", 100);
  args.back() = "train.duration=40u";
  auto r = run(join(args, 1));
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("step_30: model.safetensors has the wrong size"));
  CHECK_THAT(r.out, Catch::Contains("restored"));
  CHECK_THAT(r.out, Catch::Contains("step_20"));
  // Naming a damaged folder explicitly is an input error.
  fs::resize_file(d / "dmg/v0/checkpoints/step_40/state.safetensors", 10);
  auto bad = run(join(args, 1) + " checkpoint.resume=" + (d / "dmg/v0/checkpoints/step_40").string());
  CHECK(bad.code == 3);
  CHECK_THAT(bad.out, Catch::Contains("damaged checkpoint: state.safetensors has the wrong size"));
  // A checkpoint of another model is rejected with a clear message, not an internal assert.
  auto mismatch = run(join(args, 1) + " model.fc=64 checkpoint.resume=" + (d / "dmg/v0/checkpoints/step_20").string());
  CHECK(mismatch.code == 3);
  CHECK_THAT(mismatch.out, Catch::Contains("fc1.weight' has shape [32, 784], the model expects [64, 784]"));
}

TEST_CASE("run folder contents; safetensors readable with numpy alone", "[cli]") {
  auto d = tmpdir("runfolder");
  auto args = small_run(d, "rf");
  args.push_back("train.duration=20u");
  args.push_back("train.log_every=5u");
  auto r = run(join(args, 1));
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("test accuracy: "));
  const fs::path v0 = d / "rf/v0";
  for (const char* f : {"config.yaml", "env.json", "metrics.jsonl", "metrics.csv", "status.json", "checkpoints/latest"})
    CHECK(fs::exists(v0 / f));
  CHECK_THAT(slurp(v0 / "env.json"), Catch::Contains("\"kernel_route\": \"onednn\""));
  const auto csv = slurp(v0 / "metrics.csv");
  CHECK(csv.rfind("event,step,epoch,loss,accuracy,samples_per_s,data_wait,lr,grad_norm,time_s\n", 0) == 0);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 1 + 4 + 1);  // header, 4 train rows, 1 eval
  // The saved config re-runs as is.
  CHECK(run("train " + (v0 / "config.yaml").string() + " --print-config").code == 0);
  const std::string py =
      "/usr/bin/python3 -c \"import json,struct,numpy as np,sys; b=open(sys.argv[1],'rb').read(); n=struct.unpack('<Q',b[:8])[0]; "
      "h=json.loads(b[8:8+n]); e=h['conv1.weight']; s,t=e['data_offsets']; "
      "a=np.frombuffer(b[8+n+s:8+n+t],dtype=np.float32).reshape(e['shape']); print('shape',a.shape,'finite',np.isfinite(a).all())\" ";
  FILE* p = popen((py + (v0 / "checkpoints/step_20/model.safetensors").string() + " 2>&1").c_str(), "r");
  char buf[512] = {};
  fread(buf, 1, sizeof buf - 1, p);
  CHECK(pclose(p) == 0);
  CHECK_THAT(std::string(buf), Catch::Contains("shape (8, 1, 5, 5) finite True"));
}

TEST_CASE("data convert / inspect, and training from the shard", "[cli][shard]") {
  auto d = tmpdir("shard");
  auto c = run("data convert --images " + kFmnist + "/t10k-images-idx3-ubyte.gz --labels " + kFmnist +
               "/t10k-labels-idx1-ubyte.gz -o " + (d / "test.shard").string());
  REQUIRE(c.code == 0);
  auto i = run("data inspect " + (d / "test.shard").string());
  CHECK(i.code == 0);
  CHECK_THAT(i.out, Catch::Contains("10000 samples, dtype u8, sample shape [1,28,28]"));
  CHECK_THAT(i.out, Catch::Contains("labels: 0:1000 1:1000"));
  auto t = run("train " + kSrc + "/configs/fashion_mnist_mlp.yaml run.dir=" + d.string() + " data.dataset=files data.train_images=" +
               (d / "test.shard").string() + " data.test_images=" + (d / "test.shard").string() + " train.duration=20u");
  CHECK(t.code == 0);
  auto bad = run("data inspect " + (d / "nope.shard").string());
  CHECK(bad.code == 3);
}

TEST_CASE("schedule: CSV of every step and an SVG, without training", "[cli][schedule]") {
  auto d = tmpdir("schedule");
  auto r = run("schedule " + kSrc + "/configs/fashion_mnist_cnn.yaml schedule.warmup=100u train.duration=1000u --csv " +
               (d / "lr.csv").string() + " --svg " + (d / "lr.svg").string());
  REQUIRE(r.code == 0);
  const auto csv = slurp(d / "lr.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 1001);
  CHECK(csv.rfind("step,lr\n0,0\n1,1e-05\n", 0) == 0);  // linear warm-up from 0 to 0.001 over 100 steps
  CHECK_THAT(slurp(d / "lr.svg"), Catch::Contains("<polyline"));
  CHECK(run("schedule " + kSrc + "/configs/fashion_mnist_cnn.yaml schedule.name=wobbly").code == 2);
}

TEST_CASE("landscape: slices of a trained run; bad paths exit 3", "[cli][landscape]") {
  auto d = tmpdir("landscape");
  auto args = small_run(d, "ls");
  args.push_back("train.duration=20u");
  REQUIRE(run(join(args, 1)).code == 0);
  auto r = run("landscape " + (d / "ls/v0").string() + " --points 5 --grid 3 --batches 1 --batch-size 64");
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("sharpness"));
  const auto csv = slurp(d / "ls/v0/landscape/landscape_1d.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 6);
  CHECK_THAT(csv, Catch::Contains("\n0,"));  // the trained point itself
  const auto grid = slurp(d / "ls/v0/landscape/landscape_2d.csv");
  CHECK(std::count(grid.begin(), grid.end(), '\n') == 10);
  CHECK_THAT(slurp(d / "ls/v0/landscape/landscape_2d.svg"), Catch::Contains("<rect"));
  CHECK(run("landscape " + (d / "nothing").string()).code == 3);
  fs::resize_file(d / "ls/v0/checkpoints/step_20/model.safetensors", 10);
  auto bad = run("landscape " + (d / "ls/v0/checkpoints/step_20").string());
  CHECK(bad.code == 3);
  CHECK_THAT(bad.out, Catch::Contains("damaged checkpoint"));
}

// ---------------------------------------------------------------- checklist and profile (#6)

// The report printed by --json, after any log lines.
static nlohmann::json json_of(const std::string& out) {
  const size_t at = out.compare(0, 2, "{\n") == 0 ? 0 : out.find("\n{\n");
  REQUIRE(at != std::string::npos);
  return nlohmann::json::parse(out.substr(at == 0 ? 0 : at + 1));
}

static std::string gunzip(const fs::path& p) {
  gzFile f = gzopen(p.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::string out;
  char buf[65536];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  return out;
}

TEST_CASE("checklist: every item has a status, SKIPs say why, FAIL exits 4", "[cli][checklist]") {
  const auto d = tmpdir("checklist");
  auto r = run("checklist " + kSrc + "/configs/fashion_mnist_cnn.yaml run.dir=" + d.string() + " --json");
  INFO(r.out);
  REQUIRE(r.code == 0);  // this machine: no FAIL
  auto j = json_of(r.out);
  std::set<std::string> ids;
  for (const auto& it : j["items"]) {
    INFO(it.dump());
    const std::string st = it["status"];
    CHECK((st == "PASS" || st == "WARN" || st == "FAIL" || st == "SKIP"));
    CHECK(!it["why"].get<std::string>().empty());
    if (st == "SKIP") CHECK(!it["fix"].get<std::string>().empty());  // the reason
    else CHECK(!it["measured"].get<std::string>().empty());
    ids.insert(it["id"].get<std::string>());
  }
  for (const char* id : {"data.read_bandwidth", "data.loader_rate", "data.augmentation_cost", "data.pinned_copy",
                         "compute.gemm_route", "compute.cudnn_benchmark", "compute.autocast_coverage", "compute.fusion",
                         "system.swappiness", "system.transparent_hugepages", "system.cpu_governor", "system.threads",
                         "system.allocator", "system.numa", "system.open_files", "system.disk_space", "gpu.versions",
                         "gpu.nccl_allreduce"})
    CHECK(ids.count(id) == 1);
  for (const auto& it : j["items"]) {
    if (it["id"] == "compute.fusion") CHECK(it["value"]["conv_bn_pairs"] == 2);  // conv1/bn1, conv2/bn2
    if (it["id"] == "compute.autocast_coverage") CHECK(it["measured"].get<std::string>().find("aten::conv2d") != std::string::npos);
  }

  // Over-subscribed threads and a checkpoint budget no disk holds: FAIL, exit 4, named in the text.
  r = run("checklist " + kSrc + "/configs/fashion_mnist_cnn.yaml run.dir=" + d.string() +
          " runtime.threads=64 checkpoint.keep_last=10000000");
  CHECK(r.code == 4);
  CHECK(r.out.find("FAIL system.threads") != std::string::npos);
  CHECK(r.out.find("FAIL system.disk_space") != std::string::npos);
  // Without a config the pipeline items are skipped with the reason.
  r = run("checklist --level quick");
  CHECK(r.code == 0);
  CHECK(r.out.find("SKIP data.loader_rate: skipped: no config given") != std::string::npos);
  CHECK(run("checklist --level fastest").code == 2);
}

TEST_CASE("profile: the plain CNN is compute-bound, with operators, a trace and the overhead", "[cli][profile]") {
  const auto d = tmpdir("profile_cnn");
  auto r = run("profile " + kSrc + "/configs/fashion_mnist_cnn.yaml --wait 2 --warmup 3 --active 12 --out " + d.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(slurp(d / "profile.json"));
  CHECK(j["diagnosis"]["verdict"] == "compute-bound");
  CHECK(j["measure"]["phase_share"]["data"].get<double>() < 0.15);
  CHECK(j["profiler_overhead"]["ratio"].get<double>() > 0);
  REQUIRE(j["operators"].size() >= 5);
  bool conv = false;
  for (const auto& op : j["operators"]) conv |= op["name"].get<std::string>().find("conv") != std::string::npos;
  CHECK(conv);
  double share = 0;
  for (const auto& [k, v] : j["measure"]["phase_share"].items()) share += v.get<double>();
  CHECK(share == Approx(1.0).margin(0.05));  // the phases account for the step
  const auto trace = nlohmann::json::parse(gunzip(d / "trace.json.gz"));  // a valid Chrome trace
  CHECK(trace["traceEvents"].size() > 100);
  CHECK(slurp(d / "phases.svg").find("<svg") == 0);
  CHECK(r.out.find("diagnosis: compute-bound") != std::string::npos);
}

TEST_CASE("profile: a starved loader is data-bound with evidence; --sweep measures each value", "[cli][profile]") {
  const auto d = tmpdir("profile_starved");
  // Starved by construction, so the verdict holds on a loaded machine too: a 16-unit MLP on one
  // thread against one worker augmenting 512-sample batches (~20x the compute per batch).
  auto r = run("profile " + kSrc + "/configs/starved_loader.yaml model.hidden=[16] data.batch_size=512 "
               "runtime.threads=1 --no-ops --wait 2 --warmup 3 --active 20 --sweep data.workers=0,1 --out " + d.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(slurp(d / "profile.json"));
  CHECK(j["diagnosis"]["verdict"] == "data-bound");
  CHECK(j["measure"]["phase_share"]["data"].get<double>() >= 0.15);
  CHECK(j["diagnosis"]["evidence"].size() >= 2);
  REQUIRE(j["sweep"]["rows"].size() == 2);
  CHECK((j["sweep"]["best"] == "0" || j["sweep"]["best"] == "1"));
  CHECK(r.out.find("sweep data.workers:") != std::string::npos);
  CHECK(run("profile " + kSrc + "/configs/starved_loader.yaml --sweep data.workers --no-ops").code == 2);
}

// ---------------------------------------------------------------- runs table and HTML report (#8)

// A minimal PNG decoder (8-bit RGB/RGBA, non-interlaced: what Chromium writes) for the screenshot.
struct Image {
  int w = 0, h = 0;
  std::vector<uint8_t> rgb;  // w*h*3
};
static uint32_t be32(const std::string& s, size_t i) {
  return (uint32_t(uint8_t(s[i])) << 24) | (uint32_t(uint8_t(s[i + 1])) << 16) | (uint32_t(uint8_t(s[i + 2])) << 8) |
         uint32_t(uint8_t(s[i + 3]));
}
static Image decode_png(const std::string& png) {
  REQUIRE(png.size() > 8);
  REQUIRE(png.compare(1, 3, "PNG") == 0);
  Image img;
  int ctype = 0;
  std::string idat;
  for (size_t i = 8; i + 8 <= png.size();) {
    const uint32_t len = be32(png, i);
    const std::string type = png.substr(i + 4, 4);
    if (type == "IHDR") {
      img.w = int(be32(png, i + 8)), img.h = int(be32(png, i + 12));
      REQUIRE(uint8_t(png[i + 16]) == 8);  // bit depth
      ctype = uint8_t(png[i + 17]);
      REQUIRE(uint8_t(png[i + 20]) == 0);  // not interlaced
    } else if (type == "IDAT") {
      idat += png.substr(i + 8, len);
    }
    i += 12 + len;
  }
  REQUIRE((ctype == 2 || ctype == 6));
  const int bpp = ctype == 6 ? 4 : 3;
  const size_t stride = size_t(img.w) * bpp;
  std::vector<uint8_t> raw((stride + 1) * img.h);
  uLongf n = raw.size();
  REQUIRE(uncompress(raw.data(), &n, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) == Z_OK);
  std::vector<uint8_t> prev(stride, 0), cur(stride);
  img.rgb.resize(size_t(img.w) * img.h * 3);
  for (int y = 0; y < img.h; ++y) {
    const uint8_t f = raw[y * (stride + 1)];
    const uint8_t* src = &raw[y * (stride + 1) + 1];
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= size_t(bpp) ? cur[x - bpp] : 0, b = prev[x], c = x >= size_t(bpp) ? prev[x - bpp] : 0;
      int pred = 0;
      if (f == 1) pred = a;
      else if (f == 2) pred = b;
      else if (f == 3) pred = (a + b) / 2;
      else if (f == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        pred = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
      }
      cur[x] = uint8_t(src[x] + pred);
    }
    for (int x = 0; x < img.w; ++x)
      for (int k = 0; k < 3; ++k) img.rgb[(size_t(y) * img.w + x) * 3 + k] = cur[size_t(x) * bpp + k];
    prev = cur;
  }
  return img;
}

TEST_CASE("runs table and an HTML report of two real runs, rendered by headless Chromium", "[cli][report]") {
  const auto d = tmpdir("report");
  const std::string common = " model.name=mlp model.hidden=[64] data.limit_train=4096 train.duration=2ep "
                             "train.log_every=8u checkpoint.every=1ep run.dir=" + d.string();
  REQUIRE(run("train " + kSrc + "/configs/fashion_mnist_mlp.yaml" + common + " run.name=lr_high optim.lr=0.003").code == 0);
  REQUIRE(run("train " + kSrc + "/configs/fashion_mnist_mlp.yaml" + common + " run.name=lr_low optim.lr=0.0003").code == 0);

  auto r = run("runs " + d.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("lr_high/v0") != std::string::npos);
  CHECK(r.out.find("lr_low/v0") != std::string::npos);
  CHECK(r.out.find("finished") != std::string::npos);
  // A run whose process died leaves "running" with a dead pid: shown as stale, not running.
  {
    std::ofstream(d / "lr_low" / "v0" / "status.json") << R"({"state": "running", "step": 5, "pid": 999999})";
  }
  r = run("runs " + d.string());
  CHECK(r.out.find("stale") != std::string::npos);
  CHECK(run("runs " + d.string() + "/nope").code == 3);

  const auto html = d / "report.html";
  r = run("report " + (d / "lr_high" / "v0").string() + " " + (d / "lr_low" / "v0").string() + " -o " + html.string());
  REQUIRE(r.code == 0);
  const std::string page = slurp(html);
  CHECK(page.find("<svg") != std::string::npos);
  CHECK(page.find("optim.lr") != std::string::npos);  // the config difference
  for (const char* ext : {"<script", "<link", "src=", "url(", "@import"})  // self-contained: nothing fetched
    CHECK(page.find(ext) == std::string::npos);
  CHECK(page.find("step_") != std::string::npos);    // checkpoints listed

  // Render it offline and look at the pixels: charts drawn in the two series colours.
  const auto png = d / "shot.png";
  const std::string chrome = "chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1600 "
                             "--screenshot=" + png.string() + " file://" + html.string() + " >/dev/null 2>&1";
  REQUIRE(std::system("command -v chromium >/dev/null") == 0);  // scripts/install-deps.sh installs it
  REQUIRE(std::system(chrome.c_str()) == 0);
  const Image img = decode_png(slurp(png));
  REQUIRE(img.w == 1280);
  int64_t nonwhite = 0, blue = 0, red = 0;
  for (size_t i = 0; i + 2 < img.rgb.size(); i += 3) {
    const int R = img.rgb[i], G = img.rgb[i + 1], B = img.rgb[i + 2];
    nonwhite += (R < 240 || G < 240 || B < 240);
    blue += std::abs(R - 0x1f) < 25 && std::abs(G - 0x77) < 25 && std::abs(B - 0xb4) < 25;  // series 1 (#1f77b4)
    red += std::abs(R - 0xd6) < 25 && std::abs(G - 0x27) < 25 && std::abs(B - 0x28) < 25;   // series 2 (#d62728)
  }
  INFO("non-white " << nonwhite << ", blue " << blue << ", red " << red);
  CHECK(nonwhite > int64_t(img.w) * img.h / 50);  // not a blank page
  CHECK(blue > 500);                               // run 1's curves
  CHECK(red > 500);                                // run 2's curves
}

TEST_CASE("report of a tuning study: history, importance and parallel coordinates, rendered by Chromium", "[cli][report][tune]") {
  const auto d = tmpdir("report_study");
  auto t = run("tune " + kSrc + "/configs/tune/branin.yaml study.n_trials=30 study.dir=" + d.string() + " -q");
  INFO(t.out);
  REQUIRE(t.code == 0);
  CHECK(t.out.find("study branin (tpe sampler, none pruner): 30 trials: 30 complete") != std::string::npos);
  const auto html = d / "study.html";
  auto r = run("report " + (d / "branin").string() + " -o " + html.string());
  REQUIRE(r.code == 0);
  CHECK(r.out.find("0 runs, 1 study") != std::string::npos);
  const std::string page = slurp(html);
  CHECK(page.find("Tuning study branin") != std::string::npos);
  CHECK(page.find("optimisation history: branin") != std::string::npos);
  CHECK(page.find("parameter importance") != std::string::npos);
  CHECK(page.find("parallel coordinates: branin") != std::string::npos);
  for (const char* ext : {"<script", "<link", "src=", "url(", "@import"}) CHECK(page.find(ext) == std::string::npos);
  const auto png = d / "shot.png";
  REQUIRE(std::system(("chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1400 --screenshot=" +
                       png.string() + " file://" + html.string() + " >/dev/null 2>&1").c_str()) == 0);
  const Image img = decode_png(slurp(png));
  int64_t nonwhite = 0, blue = 0, red = 0;
  for (size_t i = 0; i + 2 < img.rgb.size(); i += 3) {
    const int R = img.rgb[i], G = img.rgb[i + 1], B = img.rgb[i + 2];
    nonwhite += (R < 240 || G < 240 || B < 240);
    blue += std::abs(R - 0x1f) < 25 && std::abs(G - 0x77) < 25 && std::abs(B - 0xb4) < 25;  // trial values, importance bars
    red += std::abs(R - 0xd6) < 25 && std::abs(G - 0x27) < 25 && std::abs(B - 0x28) < 25;   // best-so-far line
  }
  INFO("non-white " << nonwhite << ", blue " << blue << ", red " << red);
  CHECK(nonwhite > int64_t(img.w) * img.h / 50);
  CHECK(blue > 2000);  // the bars alone are solid blue
  CHECK(red > 300);
  CHECK(run("report " + (d / "nothing").string()).code == 3);
}

// ---------------------------------------------------------------- distributed (#4)

static std::vector<std::string> lines_of(const fs::path& p) {
  std::vector<std::string> v;
  std::ifstream in(p);
  std::string l;
  while (std::getline(in, l)) v.push_back(l);
  return v;
}

TEST_CASE("launch: 2 Gloo ranks keep parameters bitwise equal every step and match one process", "[cli][dist]") {
  const auto d = tmpdir("ddp");
  // The same global batch (128): one process with 128, or two ranks with 64 each.
  const std::string common = kSrc + "/configs/fashion_mnist_mlp.yaml data.limit_train=8192 train.duration=2ep model.dropout=0 "
                             "checkpoint.every=1ep run.dir=" + d.string();
  auto one = run("train " + common + " run.name=single data.batch_size=128");
  REQUIRE(one.code == 0);
  ::setenv("MLTRAIN_TEST_PARAM_DIGEST", (d / "digest").c_str(), 1);
  auto two = run("launch --nproc-per-node 2 -- mltrain train " + common + " run.name=ddp data.batch_size=64");
  ::unsetenv("MLTRAIN_TEST_PARAM_DIGEST");
  INFO(two.out);
  REQUIRE(two.code == 0);
  CHECK(two.out.find("[rank 0] ") != std::string::npos);
  CHECK(two.out.find("joined Gloo") != std::string::npos);
  const auto r0 = lines_of(d / "digest.0"), r1 = lines_of(d / "digest.1");
  REQUIRE(r0.size() == 128);  // 2 epochs x 8192 / 128
  CHECK(r0 == r1);            // every step, every parameter byte
  std::set<std::string> distinct(r0.begin(), r0.end());
  CHECK(distinct.size() == r0.size());  // and they did train
  auto acc = [&](const std::string& out) {
    const auto at = out.find("test accuracy: ");
    REQUIRE(at != std::string::npos);
    return std::stod(out.substr(at + 15));
  };
  INFO("single " << acc(one.out) << " ddp " << acc(two.out));
  CHECK(std::abs(acc(one.out) - acc(two.out)) <= 0.005);
  CHECK_FALSE(fs::exists(d / "ddp" / "v1"));  // one run folder, written by rank 0 only
}

TEST_CASE("a dead peer: the surviving rank fails fast, names the missing rank and dumps its last collectives", "[cli][dist]") {
  const auto d = tmpdir("ddp_dead");
  // Two ranks started by hand (as an external launcher would); rank 1 SIGKILLs itself at step 10.
  const std::string train = kBin + " train " + kSrc + "/configs/fashion_mnist_mlp.yaml data.limit_train=4096 data.batch_size=64 "
                            "train.duration=2ep distributed.timeout_s=20 run.dir=" + d.string() + " run.name=dead";
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MLTRAIN_RUN_ID=dead$$ MLTRAIN_TEST_KILL=1:10 ";
  const auto t0 = std::chrono::steady_clock::now();
  const std::string cmd = "cd " + d.string() + " && { (" + env + "RANK=0 LOCAL_RANK=0 " + train + " > r0.log 2>&1; echo $? > r0.rc) & (" + env +
                          "RANK=1 LOCAL_RANK=1 " + train + " > r1.log 2>&1; echo $? > r1.rc); wait; }";
  REQUIRE(std::system(("bash -c '" + cmd + "'").c_str()) == 0);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string log0 = slurp(d / "r0.log");
  INFO(log0);
  CHECK(std::stoi(slurp(d / "r1.rc")) == 137);  // 128 + SIGKILL
  CHECK(std::stoi(slurp(d / "r0.rc")) != 0);
  CHECK(log0.find("missing: rank 1 (pid ") != std::string::npos);
  CHECK(log0.find("last collectives on this rank") != std::string::npos);
  CHECK(log0.find("allreduce(gradient bucket)") != std::string::npos);
  CHECK(secs < 20);  // within the collective timeout
}

TEST_CASE("fp16 gradient compression: half the bytes, parameters still bitwise equal across ranks; bf16 refused on Gloo", "[cli][dist]") {
  const auto d = tmpdir("ddp_fp16");
  const std::string train = "launch --nproc-per-node 2 -- mltrain train " + kSrc + "/configs/fashion_mnist_mlp.yaml data.limit_train=4096 "
                            "data.batch_size=64 train.duration=1ep run.dir=" + d.string() + " --jsonl";
  auto bytes = [&](const std::string& out) {
    const auto at = out.find("{\"allreduce_bytes\":");
    REQUIRE(at != std::string::npos);
    return nlohmann::json::parse(out.substr(at, out.find('\n', at) - at));
  };
  auto fp32 = run(train + " run.name=fp32");
  REQUIRE(fp32.code == 0);
  ::setenv("MLTRAIN_TEST_PARAM_DIGEST", (d / "digest").c_str(), 1);
  auto fp16 = run(train + " run.name=fp16 distributed.compress=fp16");
  ::unsetenv("MLTRAIN_TEST_PARAM_DIGEST");
  INFO(fp16.out);
  REQUIRE(fp16.code == 0);
  const auto r0 = lines_of(d / "digest.0");
  REQUIRE(r0.size() == 32);
  CHECK(r0 == lines_of(d / "digest.1"));
  const auto a = bytes(fp32.out), b = bytes(fp16.out);
  const double grad = 535818.0 * 4 * 32;  // fp32 gradient bytes over the 32 steps; the rest is the initial broadcast and metrics
  CHECK((b["allreduce_bytes"].get<double>() - (a["allreduce_bytes"].get<double>() - grad)) == Approx(grad / 2).epsilon(0.001));
  CHECK(std::abs(b["test_accuracy"].get<double>() - a["test_accuracy"].get<double>()) < 0.01);
  auto bf16 = run(train + " run.name=bf16 distributed.compress=bf16");
  CHECK(bf16.code == 2);
  CHECK(bf16.out.find("distributed.compress: bf16 needs the NCCL backend") != std::string::npos);
}

TEST_CASE("a hung peer: the collective times out instead of hanging, and the launcher stops the group", "[cli][dist]") {
  const auto d = tmpdir("ddp_hang");
  // Rank 1 stops making progress at step 10 (alive, silent: a stuck read, a deadlock).
  ::setenv("MLTRAIN_TEST_STALL", "1:10", 1);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run("launch --nproc-per-node 2 --max-restarts 0 --grace 3 -- mltrain train " + kSrc +
               "/configs/fashion_mnist_mlp.yaml data.limit_train=4096 data.batch_size=64 train.duration=2ep distributed.timeout_s=6 "
               "run.dir=" + d.string() + " run.name=hang");
  ::unsetenv("MLTRAIN_TEST_STALL");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.out.find("failed (timeout 6 s; every rank on this host is alive (a peer on another host, or a hang))") != std::string::npos);
  CHECK(r.out.find("last collectives on this rank") != std::string::npos);
  CHECK(r.out.find("error: launch: rank 0 exited with status 1") != std::string::npos);
  CHECK(secs < 6 + 3 + 15);  // the timeout, the grace period, start-up: never the hour the peer sleeps
}

TEST_CASE("1-bit Adam on 2 ranks: equal parameters after the freeze, ~31x fewer bytes, learns", "[cli][dist][onebit]") {
  const auto d = tmpdir("onebit");
  ::setenv("MLTRAIN_TEST_PARAM_DIGEST", (d / "digest").c_str(), 1);
  auto r = run("launch --nproc-per-node 2 -- mltrain train " + kSrc + "/configs/fashion_mnist_mlp.yaml data.limit_train=8192 "
               "data.batch_size=64 train.duration=2ep optim.name=onebit_adam optim.freeze_step=32 run.dir=" + d.string() + " run.name=ob --jsonl");
  ::unsetenv("MLTRAIN_TEST_PARAM_DIGEST");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto r0 = lines_of(d / "digest.0"), r1 = lines_of(d / "digest.1");
  REQUIRE(r0.size() == 128);
  CHECK(r0 == r1);  // the averaged 1-bit momenta are the same bytes on both ranks
  const auto at = r.out.find("{\"allreduce_bytes\":");
  REQUIRE(at != std::string::npos);
  const auto j = nlohmann::json::parse(r.out.substr(at, r.out.find('\n', at) - at));
  const double full = 535818.0 * 4;  // the MLP's gradient, what plain data parallelism sends per step
  // minus the initial parameter broadcast and the 32 warm-up steps' gradient all-reduces
  const double per_step_after = (j["allreduce_bytes"].get<double>() - 33 * full) / (128 - 32);
  INFO("bytes per step after the freeze: " << per_step_after);
  CHECK(per_step_after < full / 30);
  CHECK(j["test_accuracy"].get<double>() > 0.75);
}

TEST_CASE("launch: a SIGKILLed worker restarts the group from its checkpoint, or fails naming the rank", "[cli][dist]") {
  const auto d = tmpdir("ddp_kill");
  const std::string train = " -- mltrain train " + kSrc + "/configs/fashion_mnist_mlp.yaml data.limit_train=4096 data.batch_size=64 "
                            "train.duration=2ep checkpoint.every=8u distributed.timeout_s=30 run.dir=" + d.string();
  ::setenv("MLTRAIN_TEST_KILL", "1:20", 1);  // rank 1 SIGKILLs itself at step 20 on the first attempt
  auto ok = run("launch --nproc-per-node 2 --max-restarts 1" + train + " run.name=restart");
  INFO(ok.out);
  CHECK(ok.code == 0);
  CHECK(ok.out.find("rank 1 killed by signal 9") != std::string::npos);
  CHECK(ok.out.find("restarting the group") != std::string::npos);
  CHECK(ok.out.find("resuming in") != std::string::npos);
  CHECK(ok.out.find("test accuracy: ") != std::string::npos);
  const auto t0 = std::chrono::steady_clock::now();
  auto bad = run("launch --nproc-per-node 2 --max-restarts 0" + train + " run.name=norestart");
  ::unsetenv("MLTRAIN_TEST_KILL");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(bad.out);
  CHECK(bad.code != 0);
  CHECK(bad.out.find("error: launch: rank 1 killed by signal 9") != std::string::npos);
  CHECK(secs < 60);  // stopped well within the collective timeout, not hung
}

TEST_CASE("launch across two nodes (a launcher per node): one node's weights; a worker killed on node 1 restarts both nodes", "[cli][dist]") {
  const auto d = tmpdir("launch_nodes");
  const std::string train = " -- mltrain train " + kSrc + "/configs/fashion_mnist_mlp.yaml data.limit_train=4096 data.batch_size=64 "
                            "model.dropout=0 runtime.threads=1 distributed.timeout_s=30 run.dir=" + d.string();
  ::setenv("MLTRAIN_TEST_PARAM_DIGEST", (d / "one").c_str(), 1);
  REQUIRE(run("launch --nproc-per-node 2" + train + " train.duration=1ep run.name=one").code == 0);
  const auto want = lines_of(d / "one.0");
  REQUIRE(want.size() == 32);
  // Two launchers on this host as nodes 0 and 1, one worker each.
  auto nodes = [&](const std::string& launch_args, const std::string& extra) {
    const std::string l = kBin + " launch --nnodes 2 --nproc-per-node 1 --master-addr 127.0.0.1 " + launch_args + " ";
    // Node 1 in the background; node 0's output is the result, and node 1 is waited for (no stragglers).
    return sh("cd " + d.string() + " && { " + l + "--node-rank 1" + train + extra + " > node1.log 2>&1 & " + l + "--node-rank 0" + train +
              extra + "; rc=$?; wait; exit $rc; }");
  };
  ::setenv("MLTRAIN_TEST_PARAM_DIGEST", (d / "two").c_str(), 1);
  auto two = nodes("--master-port 29677", " train.duration=1ep run.name=two");
  ::unsetenv("MLTRAIN_TEST_PARAM_DIGEST");
  INFO(two.out);
  REQUIRE(two.code == 0);
  CHECK(two.out.find("[launch] attempt 0: node 0/2, 1 workers, rendezvous 127.0.0.1:29677") != std::string::npos);
  CHECK(two.out.find("(local 0/1, node 0/2, torchrun) joined Gloo over TCPStore") != std::string::npos);
  CHECK(lines_of(d / "two.0") == want);
  CHECK(lines_of(d / "two.1") == want);
  // Rank 1 (node 1) SIGKILLed at step 20: node 0's worker loses its peer; both launchers restart,
  // meet again on port + 1 and resume from the checkpoint.
  ::setenv("MLTRAIN_TEST_KILL", "1:20", 1);
  auto restart = nodes("--master-port 29687 --max-restarts 1", " train.duration=2ep checkpoint.every=8u run.name=restart");
  ::unsetenv("MLTRAIN_TEST_KILL");
  INFO(restart.out << "\nnode 1:\n" << slurp(d / "node1.log"));
  CHECK(restart.code == 0);
  CHECK(restart.out.find("missing: rank 1 (pid ") != std::string::npos);
  CHECK(restart.out.find("[launch] attempt 1: node 0/2, 1 workers, rendezvous 127.0.0.1:29688") != std::string::npos);
  CHECK(restart.out.find("resuming in") != std::string::npos);
  CHECK(restart.out.find("after 64 steps") != std::string::npos);
  CHECK(run("launch --nnodes 2 --nproc-per-node 1" + train).code == 2);  // several nodes need an agreed port
}

TEST_CASE("distributed.backend=nccl without a CUDA LibTorch: exit 2 naming the key, before any rank waits", "[cli][dist]") {
  const auto d = tmpdir("nccl_cpu");
  auto r = sh("cd " + d.string() + " && RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_PORT=29691 timeout 60 " + kBin + " train " +
              kSrc + "/configs/fashion_mnist_mlp.yaml distributed.backend=nccl run.dir=" + d.string());
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("error: distributed.backend: nccl is not available in this build") != std::string::npos);
  CHECK(r.out.find("fix: use distributed.backend=gloo") != std::string::npos);
}

TEST_CASE("external torchrun runs the same binary: one node, two nodes, rank 0's own TCPStore, a restart; every layout ends with "
          "mltrain launch's weights",
          "[cli][dist][torchrun]") {
  const auto d = tmpdir("torchrun");
  const std::string cfg = kSrc + "/configs/fashion_mnist_mlp.yaml data.limit_train=4096 data.batch_size=64 train.duration=1ep "
                          "model.dropout=0 runtime.threads=1 run.dir=" + d.string();
  const std::string train = kBin + " train " + cfg;
  auto digest = [&](const std::string& tag) { ::setenv("MLTRAIN_TEST_PARAM_DIGEST", (d / tag).c_str(), 1); };
  // Debian's torchrun (torch 1.13 on Python 3.11) crashes on its default --redirects/--tee: -r 1 -t 1.
  const std::string torchrun = "cd " + d.string() + " && torchrun -r 1 -t 1 ";
  const std::string in_dir = "cd " + d.string() + " && ";

  digest("launch");
  auto ref = run("launch --nproc-per-node 2 -- mltrain train " + cfg + " run.name=launch");
  REQUIRE(ref.code == 0);
  const auto want = lines_of(d / "launch.0");
  REQUIRE(want.size() == 32);
  CHECK(lines_of(d / "launch.1") == want);

  // 1. One node, two workers: every rank a client of torchrun's own store.
  digest("one");
  auto one = sh(torchrun + "--nproc_per_node 2 --master_port 29671 --no_python " + train + " run.name=one");
  INFO(one.out);
  REQUIRE(one.code == 0);
  CHECK(one.out.find("rank 0/2 (local 0/2, node 0/1, torchrun) joined Gloo over torchrun's TCPStore") != std::string::npos);
  CHECK(lines_of(d / "one.0") == want);
  CHECK(lines_of(d / "one.1") == want);

  // 2. Two "nodes" on this host (two agents, --nnodes 2): the multi-node path, one worker each.
  digest("two");
  const std::string agent = "torchrun -r 1 -t 1 --nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port 29672 ";
  auto two = sh(in_dir + "{ " + agent + "--node_rank 1 --no_python " + train + " run.name=two > node1.log 2>&1 & " + agent +
                "--node_rank 0 --no_python " + train + " run.name=two; rc=$?; wait; exit $rc; }");
  INFO(two.out << slurp(d / "node1.log"));
  REQUIRE(two.code == 0);
  CHECK(two.out.find("rank 0/2 (local 0/1, node 0/2, torchrun) joined Gloo over torchrun's TCPStore") != std::string::npos);
  CHECK(lines_of(d / "two.0") == want);

  // 3. No agent (hand-set variables, two nodes): rank 0 serves the TCPStore and warns about it.
  digest("tcp");
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=29673 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 LOCAL_RANK=0 ";
  auto tcp = sh(in_dir + "{ " + env + "RANK=1 GROUP_RANK=1 " + train + " run.name=tcp > tcp1.log 2>&1 & " + env + "RANK=0 GROUP_RANK=0 " +
                train + " run.name=tcp; rc=$?; wait; exit $rc; }");
  INFO(tcp.out);
  REQUIRE(tcp.code == 0);
  CHECK(tcp.out.find("TCPStore on 127.0.0.1:29673: the port is unauthenticated and open on all interfaces") != std::string::npos);
  CHECK(tcp.out.find("(local 0/1, node 0/2, torchrun) joined Gloo over TCPStore") != std::string::npos);
  CHECK(lines_of(d / "tcp.0") == want);
  ::unsetenv("MLTRAIN_TEST_PARAM_DIGEST");

  // 4. torchrun's restarts: rank 1 SIGKILLed at step 20; the new attempt resumes from the checkpoint.
  ::setenv("MLTRAIN_TEST_KILL", "1:20", 1);
  const std::string longer = train + " train.duration=2ep checkpoint.every=8u distributed.timeout_s=30";
  auto restart = sh(torchrun + "--nproc_per_node 2 --master_port 29674 --max_restarts 1 --no_python " + longer + " run.name=restart");
  INFO(restart.out);
  CHECK(restart.code == 0);
  CHECK(restart.out.find("resuming in") != std::string::npos);
  CHECK(restart.out.find("after 64 steps") != std::string::npos);
  // Without restarts torchrun fails, and its summary carries the survivor's own message (TORCHELASTIC_ERROR_FILE).
  auto fail = sh(torchrun + "--nproc_per_node 2 --master_port 29675 --max_restarts 0 --no_python " + longer + " run.name=fail");
  ::unsetenv("MLTRAIN_TEST_KILL");
  INFO(fail.out);
  CHECK(fail.code != 0);
  CHECK(fail.out.find("traceback : mltrain: distributed: rank 0: ") != std::string::npos);
  CHECK(fail.out.find("missing: rank 1 (pid ") != std::string::npos);
}

// A real single-node Slurm (scripts/slurm/cluster.sh), started for these tests and stopped after.
struct SlurmCluster {
  SlurmCluster() {
    const std::string out = sh("bash " + kSrc + "/scripts/slurm/cluster.sh start").out;
    const auto at = out.find("export SLURM_CONF=");
    INFO(out);
    REQUIRE(at != std::string::npos);
    conf = out.substr(at + 18, out.find('\n', at) - at - 18);
    ::setenv("SLURM_CONF", conf.c_str(), 1);
  }
  ~SlurmCluster() {
    std::system(("bash " + kSrc + "/scripts/slurm/cluster.sh stop >/dev/null 2>&1").c_str());
    ::unsetenv("SLURM_CONF");
  }
  std::string conf;
};

TEST_CASE("Slurm: a 2-task srun job trains over Gloo; a USR1-signalled batch job checkpoints, requeues and ends with the uninterrupted weights",
          "[cli][slurm]") {
  SlurmCluster cluster;
  const auto d = tmpdir("slurm");
  // 1. srun -N 1 -n 2: the world comes from SLURM_PROCID/NTASKS/LOCALID and the expanded node list.
  const std::string cfg = kSrc + "/configs/fashion_mnist_mlp.yaml";
  auto srun = [&](const std::string& layout, const std::string& name) {
    ::setenv("MLTRAIN_TEST_PARAM_DIGEST", (d / name).c_str(), 1);
    const auto out = sh("cd " + d.string() + " && srun " + layout + " --kill-on-bad-exit=1 " + kBin + " train " + cfg +
                        " data.limit_train=4096 data.batch_size=64 train.duration=1ep runtime.threads=1 run.dir=" + d.string() +
                        " run.name=" + name + " 2>&1; echo exit=$?").out;
    ::unsetenv("MLTRAIN_TEST_PARAM_DIGEST");
    return out;
  };
  const std::string srun_out = srun("-N 1 -n 2", "srun");
  INFO(srun_out);
  CHECK(srun_out.find("exit=0") != std::string::npos);
  CHECK(srun_out.find("(local 0/2, node 0/1, slurm) joined Gloo over FileStore") != std::string::npos);
  CHECK(srun_out.find("test accuracy: ") != std::string::npos);
  CHECK(fs::exists(d / "srun" / "v0" / "checkpoints"));
  CHECK_FALSE(fs::exists(d / "srun" / "v1"));
  // Two nodes (node[1-2], one task each): the TCPStore that rank 0 serves, and the same weights.
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);  // the test cluster's node names do not resolve
  const std::string two_nodes = srun("-N 2 -n 2", "srun2");
  ::unsetenv("MASTER_ADDR");
  INFO(two_nodes);
  CHECK(two_nodes.find("exit=0") != std::string::npos);
  CHECK(two_nodes.find("(local 0/1, node 0/2, slurm) joined Gloo over TCPStore") != std::string::npos);
  const auto one = lines_of(d / "srun.0");
  REQUIRE(one.size() == 32);
  CHECK(lines_of(d / "srun.1") == one);
  CHECK(lines_of(d / "srun2.0") == one);
  CHECK(lines_of(d / "srun2.1") == one);

  auto wait_job = [](const std::string& job) {
    std::string state;
    for (int i = 0; i < 900; ++i) {  // requeue: cred_expire 10 s + scheduler, then the rest of the run
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const auto info = sh("scontrol show job " + job).out;
      const auto js = info.find("JobState=");
      state = js == std::string::npos ? "" : info.substr(js + 9, info.find(' ', js) - js - 9);
      if (state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" || state == "TIMEOUT") break;
    }
    return state;
  };
  auto job_log = [&](const std::string& name) {
    std::string log;
    for (const auto& e : fs::directory_iterator(d / name))
      if (e.path().filename().string().rfind("slurm-", 0) == 0) log += slurp(e.path());
    return log;
  };
  auto submitted = [](const std::string& out) {
    const auto at = out.find("submitted job ");
    REQUIRE(at != std::string::npos);
    return std::to_string(std::stol(out.substr(at + 14)));
  };
  // A two-node batch job from `mltrain slurm --nodes 2`: its script names the first node's host as
  // MASTER_ADDR; the same weights again.
  ::setenv("MLTRAIN_TEST_PARAM_DIGEST", (d / "batch2").c_str(), 1);
  auto w2 = run("slurm " + cfg + " --nodes 2 --ntasks-per-node 1 --time 00:05:00 --submit data.limit_train=4096 data.batch_size=64 "
                "train.duration=1ep runtime.threads=1 run.dir=" + d.string() + " run.name=batch2");
  ::unsetenv("MLTRAIN_TEST_PARAM_DIGEST");
  INFO(w2.out);
  REQUIRE(w2.code == 0);
  CHECK(slurp(d / "batch2" / "slurm.sbatch").find("export MASTER_ADDR=${MASTER_ADDR:-$(hostname)}") != std::string::npos);
  const std::string job2 = submitted(w2.out);
  const std::string state2 = wait_job(job2);
  INFO(job_log("batch2"));
  REQUIRE(state2 == "COMPLETED");
  CHECK(job_log("batch2").find("(local 0/1, node 0/2, slurm) joined Gloo over TCPStore") != std::string::npos);
  CHECK(lines_of(d / "batch2.0") == one);

  // 2. The batch job: signalled mid-run, it must come back and finish exactly as an uninterrupted run.
  const std::string common = " data.limit_train=8192 train.duration=30ep train.eval_every=5ep checkpoint.every=5ep data.workers=1 run.dir=" + d.string();
  REQUIRE(run("train " + cfg + common + " run.name=reference").code == 0);
  auto w = run("slurm " + cfg + " --time 00:10:00 --submit" + common + " run.name=batch");
  INFO(w.out);
  REQUIRE(w.code == 0);
  const auto script = slurp(d / "batch" / "slurm.sbatch");
  CHECK(script.find("#SBATCH --signal=USR1@90") != std::string::npos);
  CHECK(script.find("#SBATCH --requeue") != std::string::npos);
  CHECK(script.find("#SBATCH --open-mode=append") != std::string::npos);
  const std::string job = submitted(w.out);
  // Wait until it has trained a little, then send USR1 to its tasks (what --signal=USR1@90 does).
  const auto metrics = d / "batch" / "v0" / "metrics.jsonl";
  bool signalled = false;
  for (int i = 0; i < 600 && !signalled; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (fs::exists(metrics) && slurp(metrics).find("\"step\":100") != std::string::npos) {
      REQUIRE(std::system(("scancel --signal=USR1 " + job).c_str()) == 0);
      signalled = true;
    }
  }
  REQUIRE(signalled);
  const std::string state = wait_job(job);
  const std::string log = job_log("batch");
  INFO("job " << job << " state " << state << "\n" << log);
  REQUIRE(state == "COMPLETED");
  CHECK(log.find("requeueing job " + job) != std::string::npos);
  CHECK(log.find("restart count 1") != std::string::npos);
  CHECK(log.find("resuming in") != std::string::npos);
  auto final_of = [&](const std::string& name) {
    const auto dir = d / name / "v0" / "checkpoints";
    std::string latest;
    std::ifstream(dir / "latest") >> latest;
    return slurp(dir / latest / "model.safetensors");
  };
  const auto a = final_of("reference"), b = final_of("batch");
  REQUIRE(!a.empty());
  CHECK(a == b);  // the same final weights, byte for byte
}

// ---------------------------------------------------------------- fuse (#7)

TEST_CASE("fuse: CNN and TorchScript runs fold BN within tolerance; damaged or mismatched input exits 3", "[cli][fuse]") {
  const auto d = tmpdir("fuse");
  const std::string common = " data.limit_train=2048 train.duration=1ep checkpoint.every=1ep run.dir=" + d.string();
  REQUIRE(run("train " + kSrc + "/configs/fashion_mnist_cnn.yaml" + common + " run.name=cnn").code == 0);
  auto r = run("fuse " + (d / "cnn" / "v0").string() + " --batches 4");
  INFO(r.out);
  REQUIRE(r.code == 0);
  auto j = nlohmann::json::parse(slurp(d / "cnn" / "v0" / "fused" / "fuse.json"));
  CHECK(j["folded_batchnorms"] == 2);
  CHECK(j["within_tolerance"] == true);
  CHECK(j["max_abs_diff"].get<double>() < 1e-4);
  CHECK(j["torchscript_max_abs_diff"].get<double>() < 1e-4);
  CHECK(j["speedup_batch128"].get<double>() > 0);
  CHECK(fs::exists(d / "cnn" / "v0" / "fused" / "model.pt"));
  CHECK(slurp(d / "cnn" / "v0" / "fused" / "config.yaml").find("batchnorm: false") != std::string::npos);

  // A TorchScript model goes through LibTorch's FoldConvBatchNorm.
  REQUIRE(run("train " + kSrc + "/configs/fashion_mnist_cnn.yaml" + common +
              " run.name=ts model.name=torchscript model.path=" + kSrc + "/tests/golden/tiny_script.pt").code == 0);
  r = run("fuse " + (d / "ts" / "v0").string() + " --batches 2 -o " + (d / "ts_fused").string());
  REQUIRE(r.code == 0);
  j = nlohmann::json::parse(slurp(d / "ts_fused" / "fuse.json"));
  CHECK(j["folded_batchnorms"] == 1);
  CHECK(j["within_tolerance"] == true);

  // Mismatched: the config beside the checkpoint describes another model.
  {
    std::string cfg = slurp(d / "cnn" / "v0" / "config.yaml");
    const auto at = cfg.find("fc: 256");
    REQUIRE(at != std::string::npos);
    cfg.replace(at, 7, "fc: 128");
    std::ofstream(d / "cnn" / "v0" / "config.yaml") << cfg;
  }
  r = run("fuse " + (d / "cnn" / "v0").string());
  CHECK(r.code == 3);
  CHECK(r.out.find("does not match the run's model at 'fc1.weight'") != std::string::npos);
  // Damaged: a flipped byte in the only checkpoint's weights.
  const auto ck = d / "ts" / "v0" / "checkpoints" / "step_16" / "model.safetensors";
  REQUIRE(fs::exists(ck));
  {
    std::fstream f(ck, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  r = run("fuse " + (d / "ts" / "v0").string());
  CHECK(r.code == 3);
  CHECK(r.out.find("no intact checkpoint") != std::string::npos);
}

TEST_CASE("quantize: int8 CNN on LibTorch's quantized kernels keeps accuracy and is ~4x smaller", "[cli][quantize]") {
  const auto d = tmpdir("quantize");
  const std::string common = " data.limit_train=4096 train.duration=1ep checkpoint.every=1ep run.dir=" + d.string();
  REQUIRE(run("train " + kSrc + "/configs/fashion_mnist_cnn.yaml" + common + " run.name=cnn").code == 0);
  const auto cnn = (d / "cnn" / "v0").string();
  const auto report = [&] { return nlohmann::json::parse(slurp(d / "cnn" / "v0" / "quantized" / "quantize.json")); };
  double full_ratio = 0;
  for (const char* obs : {"minmax", "moving_average_minmax", "percentile", "entropy"}) {
    auto r = run("quantize " + cnn + " --calib-batches 4 --observer " + obs);
    INFO(obs << "\n" << r.out);
    REQUIRE(r.code == 0);
    const auto j = report();
    CHECK(j["observer"] == obs);
    CHECK(j["accuracy_drop_points"].get<double>() <= 1.0);
    CHECK(j["prediction_agreement"].get<double>() > 0.97);
    CHECK(j["size_ratio"].get<double>() >= 3.5);
    full_ratio = j["size_ratio"].get<double>();
    CHECK(j["int8_samples_per_s_batch128"].get<double>() > 0);
    CHECK(j["calibration_cache"].get<std::string>().rfind("stored ", 0) == 0);
    for (const auto& l : j["layers"]) CHECK(l["mode"] == "int8");
    // The deployable TorchScript file, reloaded: the graph's own numbers.
    CHECK(j["script"]["max_abs_diff"].get<double>() < 1e-5);
    CHECK(j["script"]["prediction_agreement"].get<double>() == 1.0);
  }
  {
    // ... and in PyTorch itself, with no mltrain code: the same test accuracy.
    const auto j = report();
    CHECK(j["script"]["bytes"].get<int64_t>() < fs::file_size(fs::path(j["checkpoint"].get<std::string>()) / "model.safetensors") / 3);
    auto py = sh("/usr/bin/python3 " + kSrc + "/tests/golden/check_int8_script.py " + (d / "cnn" / "v0" / "quantized" / "quantize.json").string() +
                 " " + kFmnist);
    INFO(py.out);
    REQUIRE(py.code == 0);
    const auto p = nlohmann::json::parse(py.out.substr(py.out.rfind('{')));
    CHECK(p["n"] == 10000);
    CHECK(std::abs(p["accuracy"].get<double>() - j["int8_accuracy"].get<double>()) <= 0.002);
  }
  // Calibration cache: the same weights, data, observer and graph reuse the ranges, to the bit.
  const auto before = report()["activation_qparams"];
  auto again = run("quantize " + cnn + " --calib-batches 4 --observer entropy");
  REQUIRE(again.code == 0);
  CHECK(report()["calibration_cache"].get<std::string>().rfind("hit ", 0) == 0);
  CHECK(report()["activation_qparams"] == before);
  // More calibration batches are other data: a miss.
  REQUIRE(run("quantize " + cnn + " --calib-batches 5 --observer entropy").code == 0);
  CHECK(report()["calibration_cache"].get<std::string>().rfind("stored ", 0) == 0);
  // Exclude list and the sensitivity pass.
  auto ex = run("quantize " + cnn + " --calib-batches 4 --exclude conv1,fc2 --sensitivity --sensitivity-samples 500");
  INFO(ex.out);
  REQUIRE(ex.code == 0);
  const auto j = report();
  std::map<std::string, std::string> mode;
  for (const auto& l : j["layers"]) mode[l["name"]] = l["mode"];
  CHECK(mode == std::map<std::string, std::string>{{"conv1", "fp32"}, {"conv2", "int8"}, {"fc1", "int8"}, {"fc2", "fp32"}});
  CHECK(j["size_ratio"].get<double>() < full_ratio);  // conv1 and fc2 stay fp32
  CHECK(j["accuracy_drop_points"].get<double>() <= 1.0);
  REQUIRE(j["sensitivity"]["layers"].size() == 4);
  CHECK(j["sensitivity"]["samples"] == 500);
  CHECK(ex.out.find("sensitivity (one layer quantized at a time") != std::string::npos);
  CHECK(ex.out.find("proposed: ") != std::string::npos);
  auto bad = run("quantize " + cnn + " --exclude conv3");
  CHECK(bad.code == 2);
  CHECK(bad.out.find("no quantizable layer named 'conv3'") != std::string::npos);
  CHECK(bad.out.find("layers: conv1, conv2, fc1, fc2") != std::string::npos);
  // The MLP: static and dynamic (int8 linear weights, activations quantized per batch).
  REQUIRE(run("train " + kSrc + "/configs/fashion_mnist_mlp.yaml" + common + " run.name=mlp").code == 0);
  for (const char* m : {"static", "dynamic"}) {
    auto r = run("quantize " + (d / "mlp" / "v0").string() + " --calib-batches 4 --mode " + m);
    INFO(m << "\n" << r.out);
    REQUIRE(r.code == 0);
    const auto q = nlohmann::json::parse(slurp(d / "mlp" / "v0" / "quantized" / "quantize.json"));
    CHECK(q["mode"] == m);
    CHECK(q["layers"].size() == 3);
    CHECK(q["accuracy_drop_points"].get<double>() <= 1.0);
    CHECK(q["size_ratio"].get<double>() >= 3.5);
    CHECK(q["script"]["max_abs_diff"].get<double>() < 1e-5);
  }
  CHECK(run("quantize " + cnn + " --mode weird").code == 2);
  CHECK(run("quantize " + (d / "nope").string()).code == 3);
}

TEST_CASE("quantize: the small ResNet's residual adds run as quantized::add_relu", "[cli][quantize]") {
  const auto d = tmpdir("quantize_resnet");
  REQUIRE(run("train " + kSrc + "/configs/fashion_mnist_resnet_recipe.yaml data.limit_train=2048 train.duration=1ep "
              "checkpoint.every=1ep train.eval_every=1ep amp.enabled=false run.name=r run.dir=" + d.string()).code == 0);
  auto r = run("quantize " + (d / "r" / "v0").string() + " --calib-batches 2");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(slurp(d / "r" / "v0" / "quantized" / "quantize.json"));
  int adds = 0, convs = 0;
  for (const auto& l : j["layers"]) {
    adds += l["op"] == "add";
    convs += l["op"] == "conv";
    CHECK(l["mode"] == "int8");
  }
  CHECK(adds == 3);
  CHECK(convs == 9);  // stem + 2 per block + 2 projection shortcuts
  CHECK(j["prediction_agreement"].get<double>() > 0.95);
  CHECK(j["size_ratio"].get<double>() >= 3.5);
  CHECK(j["script"]["max_abs_diff"].get<double>() < 1e-5);  // residual adds as quantized::add_relu in TorchScript too
  // A TorchScript model is not lowered: a clear config error, not a crash.
  REQUIRE(run("train " + kSrc + "/configs/fashion_mnist_mlp.yaml data.limit_train=512 train.duration=1ep checkpoint.every=1ep run.dir=" +
              d.string() + " run.name=ts model.name=torchscript model.path=" + kSrc + "/tests/golden/tiny_script.pt").code == 0);
  auto ts = run("quantize " + (d / "ts" / "v0").string());
  CHECK(ts.code == 2);
  CHECK(ts.out.find("handles the registry's mlp, cnn and resnet") != std::string::npos);
}
