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
    "Slurm: a 2-task srun job trains over Gloo, on one node and across two; a two-node batch job "
    "from `mltrain slurm --nodes 2` ends with the same weights",
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

  // A batch job signalled mid-run, preempted, timed out, ...: tests/cli/test_cli_preempt.cpp.
}

// The journal of a study, parsed.
static std::vector<nlohmann::json> journal_of(const fs::path& study) {
  std::vector<nlohmann::json> recs;
  for (const auto& line : lines_of(study / "journal.jsonl"))
    recs.push_back(nlohmann::json::parse(line));
  return recs;
}

TEST_CASE(
    "Slurm: `mltrain slurm --time` takes what a real sbatch takes, and exits 2 on the rest before "
    "it writes a script",
    "[cli][slurm]") {
  SlurmCluster cluster;
  const auto d = tmpdir("slurm_time");
  const std::string cfg = kSrc + "/configs/fashion_mnist_mlp.yaml";
  // Each --time and the TimeLimit sbatch gives a held job with it ("": sbatch refuses it).
  const std::vector<std::pair<std::string, std::string>> table = {{"90", "01:30:00"},
                                                                  {"90:30", "01:31:00"},
                                                                  {"01:00:00", "01:00:00"},
                                                                  {"99:99:99", "4-04:41:00"},
                                                                  {"2-12", "2-12:00:00"},
                                                                  {"2-12:30", "2-12:30:00"},
                                                                  {"2-12:30:15", "2-12:31:00"},
                                                                  {"1-", "1-00:00:00"},
                                                                  {"0", "UNLIMITED"},
                                                                  {"UNLIMITED", "UNLIMITED"},
                                                                  {"infinite", "UNLIMITED"},
                                                                  {"-1", "UNLIMITED"},
                                                                  {"4h", ""},
                                                                  {"1:2:3:4", ""},
                                                                  {"12:", ""},
                                                                  {":30", ""},
                                                                  {"1-2-3", ""},
                                                                  {"1.5", ""}};
  int i = 0;
  for (const auto& [t, limit] : table) {
    INFO("--time " << t);
    const auto sb = sh("sbatch --parsable --hold --time='" + t + "' --wrap true");
    if (limit.empty()) {
      CHECK(sb.code != 0);
    } else {
      INFO(sb.out);
      REQUIRE(sb.code == 0);
      const std::string job = std::to_string(std::stol(sb.out));
      CHECK(sh("scontrol show job " + job).out.find(" TimeLimit=" + limit + " ") !=
            std::string::npos);
      sh("scancel " + job);
    }
    const std::string name = "t" + std::to_string(i++);
    const auto ml =
        run("slurm " + cfg + " --time '" + t + "' run.dir=" + d.string() + " run.name=" + name);
    INFO(ml.out);
    CHECK(ml.code == (limit.empty() ? 2 : 0));
    CHECK(fs::exists(d / name / "slurm.sbatch") == !limit.empty());
    if (limit.empty()) CHECK(ml.out.find("error: --time: '" + t + "'") != std::string::npos);
  }
  // A limit no longer than the checkpoint signal's lead (USR1@90) would stop the run at its start.
  const auto short_limit = run("slurm " + cfg + " --time 00:01:30 run.dir=" + d.string());
  CHECK(short_limit.code == 2);
  CHECK(short_limit.out.find("--signal-lead 90 s") != std::string::npos);
  CHECK(run("slurm " + cfg + " --time 00:01:30 --signal-lead 30 run.dir=" + d.string()).code == 0);
  CHECK(run("slurm " + cfg + " --nodes 0 run.dir=" + d.string()).code == 2);
}

TEST_CASE(
    "Slurm: `mltrain tune --slurm-array 2` drivers share the journal; a cancelled task and a "
    "requeued task lose no trial and run none twice",
    "[cli][slurm][tune]") {
  const auto d = tmpdir("tune_array");
  auto write_file = [](const fs::path& p, const std::string& text) { std::ofstream(p) << text; };
  // A node-local study folder is refused before anything is written.
  write_file(d / "s.yaml", "study: {name: s, dir: " + d.string() +
                               ", n_trials: 12, seed: 1, stale_after_s: 120}\n"
                               "sampler: {name: random}\n"
                               "objective: {metric: loss, direction: minimize}\n"
                               "trial: {command: [" +
                               (d / "trial.sh").string() +
                               "]}\n"
                               "space:\n  x: {type: float, low: 0, high: 1}\n");
  auto refused = run("tune " + (d / "s.yaml").string() + " --slurm-array 2");
  CHECK(refused.code == 2);
  CHECK(refused.out.find("study.dir") != std::string::npos);
  CHECK(refused.out.find("node-local") != std::string::npos);
  // So is a time limit sbatch would refuse.
  auto bad_time =
      run("tune " + (d / "s.yaml").string() + " --slurm-array 2 --time 4h --allow-local-journal");
  CHECK(bad_time.code == 2);
  CHECK(bad_time.out.find("error: --time: '4h'") != std::string::npos);
  CHECK_FALSE(fs::exists(d / "s" / "tune-array.sbatch"));

  SlurmCluster cluster;
  // Each trial: 4 reports 0.4 s apart; the trial numbers a process ran are logged.
  write_file(d / "trial.sh",
             "#!/bin/sh\necho \"$MLTRAIN_TRIAL_NUMBER $$\" >> " + (d / "runs.log").string() +
                 "\nfor s in 1 2 3 4; do sleep 0.4; awk -v x=\"$MLTRAIN_PARAM_X\" -v s=$s "
                 "'BEGIN { printf \"{\\\"step\\\": %d, \\\"loss\\\": %.17g}\\n\", s, "
                 "(x - 0.3) ^ 2 + 1 / s }'; done\n");
  fs::permissions(d / "trial.sh", fs::perms::owner_all);
  // Every "node" of the test cluster is this host: the tmp folder is shared here.
  auto w = run("tune " + (d / "s.yaml").string() +
               " --slurm-array 2 --time 00:05:00 --cpus-per-task 1 --allow-local-journal --submit");
  INFO(w.out);
  REQUIRE(w.code == 0);
  const auto script = slurp(d / "s" / "tune-array.sbatch");
  CHECK(script.find("#SBATCH --array=0-1") != std::string::npos);
  CHECK(script.find("#SBATCH --requeue") != std::string::npos);
  const auto at = w.out.find("submitted job ");
  REQUIRE(at != std::string::npos);
  const std::string job = std::to_string(std::stol(w.out.substr(at + 14)));
  auto finished = [&] {
    int n = 0;
    for (const auto& r : journal_of(d / "s")) n += r["op"] == "finish";
    return n;
  };
  // Journal and squeue are read every 200 ms (cli_support's wait_for polls every 5 ms).
  auto poll = [](const std::function<bool()>& f) {
    for (int i = 0; i < 1500; ++i) {  // 300 s
      if (f()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  };
  // Both drivers at work: two workers in the journal, some trials done.
  REQUIRE(poll([&]() -> bool {
    if (!fs::exists(d / "s" / "journal.jsonl")) return false;
    std::set<std::string> workers;
    for (const auto& r : journal_of(d / "s"))
      if (r["op"] == "create") workers.insert(r["worker"].get<std::string>());
    return workers.size() == 2 && finished() >= 2;
  }));
  // Cancel task 1 for good; requeue task 0 (it restarts and resumes the study).
  REQUIRE(std::system(("scancel " + job + "_1").c_str()) == 0);
  REQUIRE(poll([&]() -> bool { return finished() >= 5; }));
  REQUIRE(std::system(("scontrol requeue " + job + "_0").c_str()) == 0);
  REQUIRE(poll([&]() -> bool {
    return sh("squeue -h -j " + job + " 2>/dev/null").out.find(job) == std::string::npos;
  }));
  std::string logs;
  for (const auto& e : fs::directory_iterator(d / "s"))
    if (e.path().filename().string().rfind("slurm-", 0) == 0) logs += slurp(e.path());
  INFO(logs);
  CHECK(logs.find("restart 1") != std::string::npos);  // task 0 ran again after its requeue
  // The study: 12 trials complete; every stale one (a driver stopped under it) retried once.
  std::map<int, std::string> state;
  std::map<int, int> finishes, retry_of;
  for (const auto& r : journal_of(d / "s")) {
    const int t = r["trial"].is_number() ? r["trial"].get<int>() : -1;
    if (r["op"] == "create" && r.contains("retry_of")) retry_of[r["retry_of"].get<int>()]++;
    if (r["op"] == "finish") state[t] = r["state"], finishes[t]++;
  }
  int complete = 0, stale = 0;
  for (const auto& [t, s] : state) {
    INFO("trial " << t);
    CHECK(finishes[t] == 1);  // one verdict per trial
    complete += s == "COMPLETE";
    if (s == "FAIL") {
      ++stale;
      CHECK(retry_of[t] == 1);
    }
  }
  CHECK(complete == 12);
  CHECK(stale >= 1);  // the cancel and the requeue each stopped a running trial
  // No trial number was run by two processes.
  std::map<std::string, int> runs;
  for (const auto& line : lines_of(d / "runs.log")) runs[line.substr(0, line.find(' '))]++;
  for (const auto& [t, n] : runs) {
    INFO("trial " << t);
    CHECK(n == 1);
  }
}
