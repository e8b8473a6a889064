// `mltrain train` and the executable itself: usage errors, print-config round trip, the malformed-input
// corpora, SIGKILL/SIGTERM resume, damaged checkpoints, the run folder.
#include "cli_support.hpp"

#include <dlfcn.h>
#include <glob.h>

#include <map>
#include <regex>

TEST_CASE("--version, --help and usage errors", "[cli]") {
  auto v = run("--version");
  CHECK(v.code == 0);
  CHECK_THAT(v.out, Catch::Contains("mltrain 0.1.0"));
  CHECK_THAT(v.out, Catch::Contains("LibTorch 2.15"));
  // Where it runs from, and the libtorch_cpu.so the loader took (the venv's torch/lib here; a
  // wheel's is checked by scripts/test_wheel.sh).
  CHECK_THAT(v.out, Catch::Contains("package: build tree (" + kBin));
  CHECK_THAT(v.out, Catch::Contains("/site-packages/torch/lib/libtorch_cpu.so)"));
  CHECK_THAT(v.out, Catch::Contains("kernels: BLAS MKL"));
  CHECK_THAT(v.out, Catch::Contains("kernel_route=onednn"));
  CHECK_THAT(v.out, Catch::Contains("CPU capability AVX"));
  // The build says whether CUDA was compiled in (scripts/build.sh turns it on where nvcc is).
  CHECK_THAT(v.out, Catch::Contains(MLTRAIN_EXPECT_CUDA ? "CUDA compiled in: yes (wheel CUDA 13."
                                                        : "CUDA compiled in: no"));
  auto h = run("--help");
  CHECK(h.code == 0);
  for (const char* sub : {"train", "config", "data", "evaluate", "predict", "Exit codes"})
    CHECK_THAT(h.out, Catch::Contains(sub));
  // Every exit code the program returns is in the help (4 was missing while it was hand-written).
  for (const char* code :
       {" 0 ok;", " 1 runtime failure;", " 2 usage or config error;", " 3 bad data or checkpoint;",
        " 4 `mltrain checklist` found a FAIL item;", " 128+N stopped cleanly"})
    CHECK_THAT(h.out, Catch::Contains(code));
  // Every configs/ path a help text names exists in the source tree (issue #66: tune's help
  // named configs/tune_*.yaml, the files are in configs/tune/).
  auto all = run("--help-all");
  REQUIRE(all.code == 0);
  const std::regex path_re("configs/[A-Za-z0-9_./*-]*[A-Za-z0-9_*]");
  int named = 0;
  for (auto it = std::sregex_iterator(all.out.begin(), all.out.end(), path_re);
       it != std::sregex_iterator(); ++it, ++named) {
    const std::string pattern = kSrc + "/" + it->str();
    glob_t g{};
    INFO("--help-all names " << it->str());
    CHECK(::glob(pattern.c_str(), 0, nullptr, &g) == 0);
    globfree(&g);
  }
  CHECK(named > 0);
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
  auto first =
      run("train " + kSrc +
          "/configs/fashion_mnist_cnn.yaml optim.lr=0.002 --run-name flagged --print-config");
  REQUIRE(first.code == 0);
  CHECK_THAT(first.out, Catch::Contains("name: \"flagged\""));  // the flag beats the file
  CHECK_THAT(first.out, Catch::Contains("lr: 0.002"));
  std::ofstream(d / "resolved.yaml") << first.out;
  auto second = run("train " + (d / "resolved.yaml").string() + " --print-config");
  REQUIRE(second.code == 0);
  CHECK(second.out == first.out);
}

TEST_CASE("malformed config corpus: documented exit code and a message naming file and key",
          "[cli][corpus]") {
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
  { raw_idx = std::string("\0\0\x08\x01\0\0\0\x03", 8) + std::string("\x01\x02\x0c", 3); }
  struct Row {
    std::string images, labels, expect;
    bool labels_at_fault = false;
  };
  const std::vector<Row> rows = {
      {put("truncated.gz", real_gz.substr(0, real_gz.size() / 3)), labels, "gzip"},
      {put("magic.idx", "\x01\x02\x03\x04 not idx at all"), labels, "wrong magic"},
      {kFmnist + "/train-images-idx3-ubyte.gz", labels,
       "shape mismatch: 10000 labels for 60000 images", true},
      {kFmnist + "/t10k-images-idx3-ubyte.gz", put("badlabels.idx", raw_idx),
       "label out of range at index 2: 12", true},
      {put("short.npy", std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                            "{'descr': '|u1', 'fortran_order': False, 'shape': (10000, 28, 28), }" +
                            std::string(118 - 69, ' ') + "\n" + std::string(100, '\0')),
       labels, "truncated: header says 10000x28x28 u8"},
      {d.string() + "/missing.idx", labels, "file not found"},
  };
  for (const auto& r : rows) {
    INFO(r.images << " -> " << r.expect);
    auto res = run("train " + kSrc + "/configs/fashion_mnist_mlp.yaml run.dir=" + d.string() +
                   "/runs data.dataset=files data.train_images=" + r.images +
                   " data.train_labels=" + r.labels + " data.test_images=" + kFmnist +
                   "/t10k-images-idx3-ubyte.gz" + " data.test_labels=" + labels);
    CHECK(res.code == 3);
    CHECK_THAT(res.out, Catch::Contains(r.expect));
    const std::string& culprit = r.labels_at_fault ? r.labels : r.images;
    CHECK_THAT(res.out, Catch::Contains("error: " + culprit + ": "));
  }
}

TEST_CASE("SIGKILL mid-epoch, resume: final weights bitwise equal to an uninterrupted run",
          "[cli][resume]") {
  auto d = tmpdir("killresume");
  auto ref = small_run(d, "reference");
  REQUIRE(run(join(ref, 1)).code == 0);

  auto args = small_run(d, "killed");
  args.push_back("train.log_every=1u");  // a record per step: the progress the test waits on
  pid_t pid = spawn(args, d / "killed1.log");
  // Wait until training has recorded step 23 (past the checkpoint at step 20, 46 steps per epoch):
  // killed between checkpoints, the resumed run redoes the steps after the latest one.
  const fs::path metrics = d / "killed/v0/metrics.jsonl";
  REQUIRE(wait_for(
      [&] {
        return fs::exists(metrics) && slurp(metrics).find("\"step\":23,") != std::string::npos;
      },
      120));
  kill(pid, SIGKILL);
  CHECK(wait_exit(pid) == 128 + SIGKILL);
  CHECK(!fs::exists(d / "killed/v0/checkpoints/step_92"));
  // `mltrain runs` tells what happened: killed, at which step, and where it will resume.
  auto status = run("runs " + (d / "killed/v0").string());
  CHECK(status.code == 0);
  CHECK_THAT(status.out, Catch::Contains("interrupted at step "));
  CHECK_THAT(status.out, Catch::Contains("(killed, pid " + std::to_string(pid) +
                                         " gone; resumes "
                                         "from step_"));
  // Records written after the latest checkpoint (or torn by the kill) are what resume must drop.
  const std::string latest = slurp(d / "killed/v0/checkpoints/latest");
  const int64_t ck_step = std::stoll(latest.substr(latest.find("step_") + 5));
  int64_t beyond = 0;
  std::istringstream before(slurp(metrics));
  for (std::string line; std::getline(before, line);) {
    try {
      beyond += nlohmann::json::parse(line).value("step", int64_t{0}) > ck_step;
    } catch (const std::exception&) {
      ++beyond;
    }
  }

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
  // Each step is recorded once: the records the killed run wrote after its last checkpoint were
  // dropped at resume and written again.
  check_metrics_once(metrics, 92);  // no torn line left either
  CHECK((resumed.out.find("[metrics] dropped " + std::to_string(beyond) + " record") !=
         std::string::npos) == (beyond > 0));
  // A finished run is not resumed again: the next invocation starts v1.
  auto again = run(join(args, 1) + " train.duration=1u");
  CHECK(again.code == 0);
  CHECK(fs::exists(d / "killed/v1"));
}

TEST_CASE("SIGTERM: checkpoint at the next step, exit 143, then resume and finish",
          "[cli][resume]") {
  auto d = tmpdir("sigterm");
  auto args = small_run(d, "term");
  args.push_back("checkpoint.every=never");
  args.push_back("train.log_every=1u");  // a record per step: the progress the test waits on
  pid_t pid = spawn(args, d / "term.log");
  const fs::path metrics = d / "term/v0/metrics.jsonl";
  REQUIRE(wait_for(
      [&] {
        return fs::exists(metrics) && slurp(metrics).find("\"step\":5,") != std::string::npos;
      },
      60));
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

TEST_CASE("damaged checkpoints: fall back with a warning; an explicit damaged one exits 3",
          "[cli][resume]") {
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
  auto bad =
      run(join(args, 1) + " checkpoint.resume=" + (d / "dmg/v0/checkpoints/step_40").string());
  CHECK(bad.code == 3);
  CHECK_THAT(bad.out, Catch::Contains("damaged checkpoint: state.safetensors has the wrong size"));
  // A checkpoint of another model is rejected with a clear message, not an internal assert.
  auto mismatch = run(join(args, 1) + " model.fc=64 checkpoint.resume=" +
                      (d / "dmg/v0/checkpoints/step_20").string());
  CHECK(mismatch.code == 3);
  CHECK_THAT(mismatch.out,
             Catch::Contains("fc1.weight' has shape [32, 784], the model expects [64, 784]"));
}

// The CUDA binary on a machine without a GPU (this one, CI's): it loads, says so, trains on the
// CPU under runtime.device=auto, and refuses runtime.device=cuda as a config error (exit 2).
TEST_CASE("no GPU: device auto trains on the CPU, device cuda is a config error", "[cli][cuda]") {
  auto d = tmpdir("nogpu");
  auto args = small_run(d, "auto");
  args.push_back("train.duration=5u");
  REQUIRE(run(join(args, 1)).code == 0);
  const std::string env = slurp(d / "auto/v0/env.json");
  CHECK_THAT(
      env, Catch::Contains(MLTRAIN_EXPECT_CUDA ? "\"cuda_built\": true" : "\"cuda_built\": false"));
  CHECK_THAT(env, Catch::Contains("\"cuda\": false"));
  args.push_back("runtime.device=cuda");
  args.push_back("run.name=cuda");
  const auto r = run(join(args, 1));
  CHECK(r.code == 2);
  CHECK_THAT(r.out, Catch::Contains("runtime.device: cuda asked for, but"));
  CHECK_THAT(r.out, Catch::Contains(MLTRAIN_EXPECT_CUDA ? "no CUDA device is visible"
                                                        : "this mltrain was built without CUDA"));
}

// The CUDA half is a plugin loaded only where an NVIDIA driver is (runtime/cuda_plugin.hpp): on
// this machine (no driver) the binary never maps libtorch_cuda.so; MLTRAIN_CUDA=on loads it
// anyway and still finds no device; a broken plugin is named, and CUDA stays off.
TEST_CASE("CUDA libraries load only where a driver is", "[cli][cuda]") {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!driver) driver = dlopen("libcuda.so.1", RTLD_LAZY);
  const bool has_driver = driver != nullptr;
  auto def = run("--version");
  REQUIRE(def.code == 0);
  if (!MLTRAIN_EXPECT_CUDA) {
    CHECK_THAT(def.out, Catch::Contains("CUDA libraries: not built"));
    CHECK_THAT(def.out, Catch::Contains("libtorch_cuda.so in this process: no"));
    return;
  }
  CHECK_THAT(def.out, Catch::Contains(has_driver ? "libtorch_cuda.so in this process: yes"
                                                 : "libtorch_cuda.so in this process: no"));
  if (!has_driver)
    CHECK_THAT(def.out, Catch::Contains("CUDA libraries: not loaded (no NVIDIA driver"));

  auto on = sh("MLTRAIN_CUDA=on " + kBin + " --version");
  REQUIRE(on.code == 0);
  CHECK_THAT(on.out, Catch::Contains("CUDA libraries: loaded ("));
  CHECK_THAT(on.out, Catch::Contains("libmltrain_cuda.so)"));
  CHECK_THAT(on.out, Catch::Contains("libtorch_cuda.so in this process: yes"));

  auto off = sh("MLTRAIN_CUDA=off " + kBin + " --version");
  CHECK_THAT(off.out, Catch::Contains("CUDA libraries: not loaded (MLTRAIN_CUDA=off)"));
  CHECK_THAT(off.out, Catch::Contains("libtorch_cuda.so in this process: no"));

  // Not a shared library where the plugin should be: the loader's error is named, the binary runs
  // on the CPU, and asking for CUDA is a config error that says why.
  auto d = tmpdir("badplugin");
  { std::ofstream(d / "libmltrain_cuda.so") << "not an ELF file\n"; }
  const std::string bad =
      "MLTRAIN_CUDA=on MLTRAIN_CUDA_PLUGIN=" + (d / "libmltrain_cuda.so").string();
  auto b = sh(bad + " " + kBin + " --version");
  CHECK(b.code == 0);
  CHECK_THAT(b.out, Catch::Contains("the CUDA libraries could not be loaded, so CUDA is off"));
  CHECK_THAT(b.out, Catch::Contains("libtorch_cuda.so in this process: no"));
  auto args = small_run(d, "cuda");
  args.push_back("runtime.device=cuda");
  auto t = sh(bad + " " + kBin + " " + join(args, 1));
  CHECK(t.code == 2);
  CHECK_THAT(t.out, Catch::Contains("no CUDA device is visible: CUDA libraries not loaded ("));
  CHECK_THAT(t.out, Catch::Contains((d / "libmltrain_cuda.so").string()));
  auto missing = sh("MLTRAIN_CUDA=on MLTRAIN_CUDA_PLUGIN=" + (d / "none.so").string() + " " + kBin +
                    " --version");
  CHECK_THAT(missing.out,
             Catch::Contains("not loaded (no libmltrain_cuda.so at " + (d / "none.so").string()));
  if (driver) dlclose(driver);
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
  for (const char* f : {"config.yaml", "env.json", "metrics.jsonl", "metrics.csv", "status.json",
                        "checkpoints/latest"})
    CHECK(fs::exists(v0 / f));
  CHECK_THAT(slurp(v0 / "env.json"), Catch::Contains("\"blas\": \"MKL "));
  CHECK_THAT(slurp(v0 / "env.json"), Catch::Contains("\"kernel_route\": \"onednn\""));
  const auto csv = slurp(v0 / "metrics.csv");
  CHECK(csv.rfind("event,step,epoch,loss,accuracy,samples_per_s,data_wait,lr,grad_norm,time_s\n",
                  0) == 0);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 1 + 4 + 1);  // header, 4 train rows, 1 eval
  // Train records carry the resident set (LibTorch alone maps more than 50 MiB).
  std::istringstream jl(slurp(v0 / "metrics.jsonl"));
  std::string first;
  std::getline(jl, first);
  const auto rec = nlohmann::json::parse(first);
  CHECK(rec.at("event") == "train");
  CHECK(rec.at("rss_mib").get<double>() > 50);
  CHECK(rec.at("rss_mib").get<double>() < 4096);
  // The saved config re-runs as is: it resolves to the same config, and it trains.
  const auto again = run("train " + (v0 / "config.yaml").string() + " --print-config");
  CHECK(again.code == 0);
  CHECK(again.out == slurp(v0 / "config.yaml"));
  const auto rerun = run("train " + (v0 / "config.yaml").string() + " run.name=rf_again");
  CHECK(rerun.code == 0);
  CHECK_THAT(rerun.out, Catch::Contains("test accuracy: "));
  const std::string py =
      kPython +
      " -c \"import json,struct,numpy as np,sys; b=open(sys.argv[1],'rb').read(); "
      "n=struct.unpack('<Q',b[:8])[0]; "
      "h=json.loads(b[8:8+n]); e=h['conv1.weight']; s,t=e['data_offsets']; "
      "a=np.frombuffer(b[8+n+s:8+n+t],dtype=np.float32).reshape(e['shape']); "
      "print('shape',a.shape,'finite',np.isfinite(a).all())\" ";
  FILE* p =
      popen((py + (v0 / "checkpoints/step_20/model.safetensors").string() + " 2>&1").c_str(), "r");
  char buf[512] = {};
  fread(buf, 1, sizeof buf - 1, p);
  CHECK(pclose(p) == 0);
  CHECK_THAT(std::string(buf), Catch::Contains("shape (8, 1, 5, 5) finite True"));
}

// train.final_eval: the summary's test evaluation is the whole split, an evenly spaced sample or
// none; its cost and the time to the first step are in the summary and the log.
TEST_CASE("train.final_eval full|sample|none and the evaluation's share in the log", "[cli]") {
  auto d = tmpdir("finaleval");
  auto summary_of = [&](const std::string& name, const std::vector<std::string>& extra) {
    auto args = small_run(d, name);
    for (const char* a : {"train.duration=10u", "checkpoint.every=never", "data.val_fraction=0.1"})
      args.push_back(a);
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = run(join(args, 1));
    REQUIRE(r.code == 0);
    const auto lines = lines_of(d / name / "v0/metrics.jsonl");
    return std::make_pair(r.out, nlohmann::json::parse(lines.back()));
  };
  const auto [full_out, full] = summary_of("full", {});
  CHECK(full.at("final_eval") == "full");
  CHECK(full.at("test_samples") == 10000);
  CHECK(full.at("final_eval_seconds").get<double>() > 0);
  CHECK(full.at("eval_seconds").get<double>() > full.at("final_eval_seconds").get<double>());
  CHECK(full.at("first_step_s").get<double>() > 0.05);  // dynamic loading alone takes longer
  CHECK(full.at("first_step_s").get<double>() < 60);
  CHECK(full.at("setup_s").get<double>() > 0.05);
  CHECK(full.at("setup_s").get<double>() < full.at("first_step_s").get<double>());
  CHECK_THAT(full_out, Catch::Contains("[train] first optimizer step done "));
  CHECK_THAT(full_out,
             Catch::Contains("[eval] final evaluation: the whole test split, 10000 samples, "));
  CHECK_THAT(full_out, Catch::Contains("evaluations took "));
  // A sample as large as the split is the split: the same metrics.
  const auto [all_out, all] =
      summary_of("all", {"train.final_eval=sample", "train.final_eval_samples=20000"});
  CHECK(all.at("test_samples") == 10000);
  CHECK(all.at("test_accuracy") == full.at("test_accuracy"));
  CHECK(all.at("test_loss") == full.at("test_loss"));
  const auto [part_out, part] =
      summary_of("part", {"train.final_eval=sample", "train.final_eval_samples=1000"});
  CHECK(part.at("test_samples") == 1000);
  const double hits = part.at("test_accuracy").get<double>() * 1000;
  CHECK(std::abs(hits - std::round(hits)) < 1e-6);
  CHECK(std::abs(part.at("test_accuracy").get<double>() - full.at("test_accuracy").get<double>()) <
        0.1);
  CHECK_THAT(part_out, Catch::Contains("1000 of the 10000 test samples (train.final_eval=sample)"));
  const auto [none_out, none] = summary_of("none", {"train.final_eval=none"});
  CHECK(none.at("final_eval") == "none");
  CHECK(none.at("final_eval_seconds") == 0.0);
  CHECK_FALSE(none.contains("test_accuracy"));
  CHECK_FALSE(none.contains("test_samples"));
  CHECK_THAT(none_out, Catch::Contains("no test evaluation (train.final_eval=none)"));
  // Evaluated on the test split during training: none reuses that evaluation at no cost.
  auto args = small_run(d, "reuse");
  for (const char* a : {"train.duration=10u", "train.eval_every=10u", "checkpoint.every=never",
                        "train.final_eval=none"})
    args.push_back(a);
  REQUIRE(run(join(args, 1)).code == 0);
  const auto reuse = nlohmann::json::parse(lines_of(d / "reuse/v0/metrics.jsonl").back());
  CHECK(reuse.at("test_samples") == 10000);
  CHECK(reuse.at("final_eval_seconds") == 0.0);
  CHECK(reuse.contains("test_accuracy"));
  // A mode it does not know: a config error naming the key.
  const auto bad =
      run("train " + kSrc + "/configs/fashion_mnist_cnn.yaml train.final_eval=partial");
  CHECK(bad.code == 2);
  CHECK_THAT(bad.out, Catch::Contains("train.final_eval"));
}

namespace {
// Each train record's `field` by step, from a run folder's metrics.jsonl.
std::map<int64_t, double> per_step(const fs::path& run, const std::string& field) {
  std::map<int64_t, double> v;
  for (const auto& line : lines_of(run / "v0" / "metrics.jsonl"))
    if (const auto rec = nlohmann::json::parse(line); rec.value("event", "") == "train")
      v[rec.at("step").get<int64_t>()] = rec.at(field).get<double>();
  return v;
}
}  // namespace

TEST_CASE(
    "train.lr_scaling: the learning rate each step uses is optim.lr x accumulate (linear) or "
    "x sqrt(accumulate) (sqrt), for accumulate 1, 2 and 4",
    "[cli][lr_scaling]") {
  const auto d = tmpdir("lr_scaling");
  for (const std::string rule : {"none", "linear", "sqrt"})
    for (const int k : {1, 2, 4}) {
      const std::string name = rule + std::to_string(k);
      const auto r = run(tiny_mlp(d, name, 1024,
                                  "train.duration=3u train.log_every=1u optim.lr=0.001 "
                                  "schedule.name=constant data.batch_size=32 train.accumulate=" +
                                      std::to_string(k) + " train.lr_scaling=" + rule));
      INFO(name << "\n" << r.out);
      REQUIRE(r.code == 0);
      const double factor = rule == "linear" ? k : rule == "sqrt" ? std::sqrt(double(k)) : 1.0;
      const auto lr = per_step(d / name, "lr");
      REQUIRE(lr.size() == 3);
      for (const auto& [step, v] : lr) CHECK(v == Approx(0.001 * factor).epsilon(1e-12));
    }
}

TEST_CASE(
    "distributed.rewarm: after a resume the learning rate climbs k/n of the schedule's at the "
    "k-th step, then is the schedule's",
    "[cli][rewarm]") {
  const auto d = tmpdir("rewarm");
  const std::string args = tiny_mlp(d, "r", 1024,
                                    "train.duration=10u train.log_every=1u optim.lr=0.002 "
                                    "schedule.name=constant data.batch_size=32 checkpoint.every=4u "
                                    "distributed.rewarm=4u");
  {
    ScopedEnv kill({{"MLTRAIN_TEST_KILL", "0:6"}});
    REQUIRE(run(args).code != 0);
  }
  const auto r = run(args);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto lr = per_step(d / "r", "lr");
  REQUIRE(lr.size() == 10);
  for (int64_t s = 1; s <= 4; ++s) CHECK(lr.at(s) == Approx(0.002).epsilon(1e-12));  // before
  for (int64_t s = 5; s <= 8; ++s)  // resumed from step 4: 1/4, 2/4, 3/4, 4/4 of the schedule's
    CHECK(lr.at(s) == Approx(0.002 * double(s - 4) / 4).epsilon(1e-12));
  for (int64_t s = 9; s <= 10; ++s) CHECK(lr.at(s) == Approx(0.002).epsilon(1e-12));
}

TEST_CASE(
    "label smoothing on a schedule: the epsilon each step trains with is the schedule's at that "
    "step (cosine from 0.2 to 0.05 over 12 steps)",
    "[cli][smoothing]") {
  const auto d = tmpdir("smoothing_schedule");
  const auto r = run(tiny_mlp(d, "s", 1024,
                              "train.duration=12u train.log_every=1u data.batch_size=32 "
                              "label_smoothing.value=0.2 label_smoothing.schedule.name=cosine "
                              "label_smoothing.schedule.eta_min=0.05"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto eps = per_step(d / "s", "label_smoothing");
  REQUIRE(eps.size() == 12);
  const double pi = std::acos(-1.0);
  for (const auto& [step, v] : eps) {
    const double t = double(step - 1);  // the update that ends at `step` starts at t = step - 1
    CHECK(v == Approx(0.05 + (0.2 - 0.05) * (1 + std::cos(pi * t / 12)) / 2).epsilon(1e-12));
  }
  // and it reaches the loss: the same run without smoothing has another loss at step 1
  REQUIRE(run(tiny_mlp(d, "plain", 1024, "train.duration=1u train.log_every=1u data.batch_size=32"))
              .code == 0);
  CHECK(per_step(d / "plain", "loss").at(1) != Approx(per_step(d / "s", "loss").at(1)));
}
