// `mltrain slurm` and srun on a real two-node Slurm.
#include "cli_support.hpp"

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

TEST_CASE(
    "Slurm: a 2-task srun job trains over Gloo; a USR1-signalled batch job checkpoints, requeues "
    "and ends with the uninterrupted weights",
    "[cli][slurm]") {
  SlurmCluster cluster;
  const auto d = tmpdir("slurm");
  // 1. srun -N 1 -n 2: the world comes from SLURM_PROCID/NTASKS/LOCALID and the expanded node list.
  const std::string cfg = kSrc + "/configs/fashion_mnist_mlp.yaml";
  auto srun = [&](const std::string& layout, const std::string& name) {
    ::setenv("MLTRAIN_TEST_PARAM_DIGEST", (d / name).c_str(), 1);
    const auto out = sh("cd " + d.string() + " && srun " + layout + " --kill-on-bad-exit=1 " +
                        kBin + " train " + cfg +
                        " data.limit_train=4096 data.batch_size=64 train.duration=1ep "
                        "runtime.threads=1 run.dir=" +
                        d.string() + " run.name=" + name + " 2>&1; echo exit=$?")
                         .out;
    ::unsetenv("MLTRAIN_TEST_PARAM_DIGEST");
    return out;
  };
  const std::string srun_out = srun("-N 1 -n 2", "srun");
  INFO(srun_out);
  CHECK(srun_out.find("exit=0") != std::string::npos);
  CHECK(srun_out.find("(local 0/2, node 0/1, slurm) joined Gloo over FileStore") !=
        std::string::npos);
  CHECK(srun_out.find("test accuracy: ") != std::string::npos);
  CHECK(fs::exists(d / "srun" / "v0" / "checkpoints"));
  CHECK_FALSE(fs::exists(d / "srun" / "v1"));
  // Two nodes (node[1-2], one task each): the TCPStore that rank 0 serves, and the same weights.
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);  // the test cluster's node names do not resolve
  const std::string two_nodes = srun("-N 2 -n 2", "srun2");
  ::unsetenv("MASTER_ADDR");
  INFO(two_nodes);
  CHECK(two_nodes.find("exit=0") != std::string::npos);
  CHECK(two_nodes.find("(local 0/1, node 0/2, slurm) joined Gloo over TCPStore") !=
        std::string::npos);
  const auto one = lines_of(d / "srun.0");
  REQUIRE(one.size() == 32);
  CHECK(lines_of(d / "srun.1") == one);
  CHECK(lines_of(d / "srun2.0") == one);
  CHECK(lines_of(d / "srun2.1") == one);

  auto wait_job = [](const std::string& job) {
    std::string state;
    for (int i = 0; i < 900;
         ++i) {  // requeue: cred_expire 10 s + scheduler, then the rest of the run
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const auto info = sh("scontrol show job " + job).out;
      const auto js = info.find("JobState=");
      state = js == std::string::npos ? "" : info.substr(js + 9, info.find(' ', js) - js - 9);
      if (state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" || state == "TIMEOUT")
        break;
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
  auto w2 = run("slurm " + cfg +
                " --nodes 2 --ntasks-per-node 1 --time 00:05:00 --submit data.limit_train=4096 "
                "data.batch_size=64 "
                "train.duration=1ep runtime.threads=1 run.dir=" +
                d.string() + " run.name=batch2");
  ::unsetenv("MLTRAIN_TEST_PARAM_DIGEST");
  INFO(w2.out);
  REQUIRE(w2.code == 0);
  CHECK(
      slurp(d / "batch2" / "slurm.sbatch").find("export MASTER_ADDR=${MASTER_ADDR:-$(hostname)}") !=
      std::string::npos);
  const std::string job2 = submitted(w2.out);
  const std::string state2 = wait_job(job2);
  INFO(job_log("batch2"));
  REQUIRE(state2 == "COMPLETED");
  CHECK(job_log("batch2").find("(local 0/1, node 0/2, slurm) joined Gloo over TCPStore") !=
        std::string::npos);
  CHECK(lines_of(d / "batch2.0") == one);

  // 2. The batch job: signalled mid-run, it must come back and finish exactly as an uninterrupted run.
  const std::string common =
      " data.limit_train=8192 train.duration=30ep train.eval_every=5ep checkpoint.every=5ep "
      "data.workers=1 run.dir=" +
      d.string();
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
