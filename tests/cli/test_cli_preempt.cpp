// The preemption matrix (#43, README "Preemption"): every way a scheduler stops a job, on a real
// Slurm (scripts/slurm/cluster.sh: two nodes, preemptible partitions) and, for PBS and LSF, by
// their documented signal sequences sent to a job's process group. Each scenario ends with the
// uninterrupted run's weights and optimizer state byte for byte and its metrics records each once,
// with no step but the scheduler's own.
//
// Time is kept short by waiting on events (a step in metrics.jsonl, a line in the job's log), and
// each step is slowed to 40 ms with MLTRAIN_TEST_LOADER_DELAY_MS so that a signal lands mid-run on
// any machine; slowing a step does not change a bit of what it computes.
#include <regex>

#include "cli_support.hpp"

namespace {
const std::string kCfg = kSrc + "/configs/fashion_mnist_mlp.yaml";
// 4 epochs of 32 steps: a checkpoint each epoch, an evaluation every 2, every step logged.
const std::string kRun =
    " data.limit_train=2048 data.batch_size=64 train.duration=4ep train.eval_every=2ep "
    "checkpoint.every=1ep train.log_every=1u data.workers=0 runtime.threads=1 "
    "data.eval_batch_size=2500";
constexpr int64_t kSteps = 128, kEvery = 32;
// Two ranks of 32 samples: the same global batch, so the same steps.
const std::string kTwoRanks = " distributed.nproc_per_node=2 data.batch_size=32";

struct Cluster {
  Cluster() {
    const std::string out = sh("bash " + kSrc + "/scripts/slurm/cluster.sh start").out;
    const auto at = out.find("export SLURM_CONF=");
    if (at == std::string::npos) throw std::runtime_error("cluster.sh start: " + out);
    ::setenv("SLURM_CONF", out.substr(at + 18, out.find('\n', at) - at - 18).c_str(), 1);
  }
  ~Cluster() {
    std::system(("bash " + kSrc + "/scripts/slurm/cluster.sh stop >/dev/null 2>&1").c_str());
  }
};
void cluster() { static Cluster c; }  // started once for the Slurm scenarios, stopped at exit

// "<event> <step> <loss> [<accuracy>]" of every train and eval record: the same list as the
// uninterrupted run's means each record exactly once, with the same values.
std::vector<std::string> records(const fs::path& v0) {
  std::vector<std::string> out;
  for (const auto& line : lines_of(v0 / "metrics.jsonl")) {
    const auto j = nlohmann::json::parse(line);
    const std::string ev = j.value("event", "");
    if (ev != "train" && ev != "eval") continue;
    char b[160];
    std::snprintf(b, sizeof b, "%s %lld %.17g %.17g", ev.c_str(),
                  static_cast<long long>(j.at("step").get<int64_t>()), j.value("loss", -1.0),
                  j.value("accuracy", -1.0));
    out.push_back(b);
  }
  return out;
}

// The uninterrupted runs: one process (the Slurm scenarios) and two ranks (PBS and LSF).
fs::path reference(int ranks) {
  static std::map<int, fs::path> done;
  if (!done.count(ranks)) {
    const auto d = tmpdir("preempt_ref" + std::to_string(ranks));
    const auto r = run("train " + kCfg + kRun + (ranks == 2 ? kTwoRanks : std::string()) +
                       " run.dir=" + d.string() + " run.name=ref");
    INFO(r.out);
    REQUIRE(r.code == 0);
    REQUIRE(records(d / "ref" / "v0").size() == kSteps + 2);
    done[ranks] = d / "ref";
  }
  return done[ranks];
}

void check_as_uninterrupted(const fs::path& run, int ranks = 1) {
  const auto ref = reference(ranks);
  CHECK(final_digests(run) == final_digests(ref));
  CHECK(records(run / "v0") == records(ref / "v0"));
  std::string latest = slurp(run / "v0" / "checkpoints" / "latest");
  CHECK(latest.find("step_" + std::to_string(kSteps)) == 0);
}

int64_t last_step(const fs::path& v0) {
  int64_t s = 0;
  for (const auto& line : lines_of(v0 / "metrics.jsonl"))
    if (line.find("\"event\":\"train\"") != std::string::npos)
      s = std::max(s, nlohmann::json::parse(line).at("step").get<int64_t>());
  return s;
}

bool poll(const std::function<bool()>& f, double seconds) {
  for (auto t0 = std::chrono::steady_clock::now();
       std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds;
       std::this_thread::sleep_for(std::chrono::milliseconds(100)))
    if (f()) return true;
  return false;
}

// The first integer after `key` in `text` at or after `from`, or -1.
int64_t number_after(const std::string& text, const std::string& key, size_t from = 0) {
  const auto at = text.find(key, from);
  return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + key.size());
}

// What a run's logs say about one interruption: the step rank 0 saved at on the signal, and the
// step the next attempt restored.
struct Resume {
  int64_t saved = -1, restored = -1;
};
Resume resume_of(const std::string& log) {
  Resume r;
  const std::regex saved(R"(signal \d+ received: saving at step (\d+))");
  std::smatch m;
  if (std::regex_search(log, m, saved)) r.saved = std::stoll(m[1]);
  r.restored = number_after(log, "(step ", log.find("[checkpoint] restored"));
  return r;
}

// A batch job from `mltrain slurm`, as written (an `edit` may change the script, as a test's
// stand-in for a site's habits), submitted with sbatch from the run's folder.
struct Job {
  fs::path dir;
  std::string name, id;
  fs::path run() const { return dir / name; }
  fs::path v0() const { return run() / "v0"; }
  std::string log() const {
    std::string s;
    if (fs::exists(run()))
      for (const auto& e : fs::directory_iterator(run()))
        if (e.path().filename().string().rfind("slurm-", 0) == 0) s += slurp(e.path());
    return s;
  }
  std::string field(const std::string& key, const std::string& which = "") const {
    const auto info = sh("scontrol show job " + (which.empty() ? id : which)).out;
    const auto at = info.find(key + "=");
    return at == std::string::npos
               ? ""
               : info.substr(at + key.size() + 1,
                             info.find_first_of(" \n", at) - at - key.size() - 1);
  }
  // Waits for the end: COMPLETED, FAILED, ...; a requeued job passes through PENDING again.
  std::string wait(const std::string& which = "") const {
    std::string state;
    poll(
        [&] {
          state = field("JobState", which);
          return state == "COMPLETED" || state == "FAILED" || state == "CANCELLED" ||
                 state == "TIMEOUT";
        },
        420);
    return state;
  }
  bool at_step(int64_t step, double seconds = 120) const {
    return poll([&] { return fs::exists(v0() / "metrics.jsonl") && last_step(v0()) >= step; },
                seconds);
  }
};

Job submit(const std::string& name, const std::string& sbatch_flags,
           const std::map<std::string, std::string>& env = {{"MLTRAIN_TEST_LOADER_DELAY_MS", "40"}},
           const std::function<void(std::string&)>& edit = {}, const std::string& extra = "") {
  cluster();
  Job j{tmpdir("preempt_" + name), name, ""};
  const auto w =
      sh("cd " + j.dir.string() + " && " + kBin + " slurm " + kCfg + " --time 00:10:00 " + kRun +
         " run.dir=" + j.dir.string() + " run.name=" + name + extra);
  INFO(w.out);
  REQUIRE(w.code == 0);
  const fs::path script = j.run() / "slurm.sbatch";
  std::string text = slurp(script);
  if (edit) edit(text);
  std::ofstream(script) << text;
  for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  const auto s =
      sh("cd " + j.dir.string() + " && sbatch --parsable " + sbatch_flags + " " + script.string());
  for (const auto& [k, v] : env) ::unsetenv(k.c_str());
  INFO(s.out);
  REQUIRE(s.code == 0);
  j.id = std::to_string(std::stoll(s.out));
  return j;
}

// The common ending: completed after one requeue, resumed where the signal's checkpoint was, and
// the uninterrupted run's bits and records.
void check_requeued_once(const Job& j, int64_t seen) {
  const std::string state = j.wait();
  const std::string log = j.log();
  INFO("job " << j.id << " " << state << "\n" << log);
  REQUIRE(state == "COMPLETED");
  CHECK(j.field("Restarts") == "1");
  CHECK(log.find("requeued job " + j.id) != std::string::npos);  // by the batch shell
  const Resume r = resume_of(log);
  CHECK(r.saved >= seen);        // the signal stopped the run at the next step boundary...
  CHECK(r.restored == r.saved);  // ...and the requeued job started from there: no step lost
  check_as_uninterrupted(j.run());
}
}  // namespace

TEST_CASE("preempt 1: USR1 to every step (--signal=USR1@90): checkpoint, requeue, same bits",
          "[cli][preempt][slurm]") {
  const Job j = submit("usr1", "");
  REQUIRE(j.at_step(40));
  const int64_t seen = last_step(j.v0());
  // What slurmctld does at the signal's time: the signal to every step, not the batch shell.
  REQUIRE(sh("scancel --signal=USR1 " + j.id).code == 0);
  check_requeued_once(j, seen);
}

TEST_CASE("preempt 2: USR1 to the batch shell only (--signal=B:USR1@90) reaches the ranks",
          "[cli][preempt][slurm]") {
  const Job j = submit("batch_usr1", "--signal=B:USR1@90");
  REQUIRE(j.at_step(40));
  const int64_t seen = last_step(j.v0());
  REQUIRE(sh("scancel --batch --signal=USR1 " + j.id).code == 0);  // B: the batch shell alone
  check_requeued_once(j, seen);
}

TEST_CASE("preempt 3: no --signal: the time limit's SIGTERM, SIGKILL after KillWait",
          "[cli][preempt][slurm]") {
  // A real one-minute limit (slurmctld enforces it within about 30 s more). One step a second
  // until then; the requeued attempt runs at full speed, as the edit below arranges.
  const Job j = submit("timelimit", "--time=1", {{"MLTRAIN_TEST_LOADER_DELAY_MS", "1000"}},
                       [](std::string& s) {
                         const auto at = s.find("#SBATCH --signal=");  // no --signal at all
                         s.erase(at, s.find('\n', at) + 1 - at);
                         s.replace(s.find("srun_pid=\n"), 10,
                                   "[ \"${SLURM_RESTART_COUNT:-0}\" = 0 ] || unset "
                                   "MLTRAIN_TEST_LOADER_DELAY_MS\nsrun_pid=\n");
                       });
  const std::string state = j.wait();
  const std::string log = j.log();
  INFO(log);
  REQUIRE(state == "COMPLETED");
  CHECK(log.find("DUE TO TIME LIMIT") != std::string::npos);
  CHECK(log.find("signal 15 received") != std::string::npos);
  CHECK(j.field("Restarts") == "1");
  const Resume r = resume_of(log);
  CHECK(r.saved > 0);
  CHECK(r.restored == r.saved);
  check_as_uninterrupted(j.run());
}

TEST_CASE("preempt 4: preemption with GraceTime: SIGTERM, the checkpoint within the grace",
          "[cli][preempt][slurm]") {
  const Job j = submit("grace", "-p grace");
  REQUIRE(j.at_step(40));
  const int64_t seen = last_step(j.v0());
  const std::string node = sh("squeue -h -j " + j.id + " -o %N").out.substr(0, 5);
  // A job of a higher tier that needs the whole node: Slurm preempts ours (PreemptMode=REQUEUE).
  const auto urgent = sh("sbatch --parsable -p urgent -w " + node + " --exclusive --wrap true");
  REQUIRE(urgent.code == 0);
  const std::string state = j.wait();
  const std::string log = j.log();
  INFO(log);
  REQUIRE(state == "COMPLETED");
  CHECK(j.wait(std::to_string(std::stoll(urgent.out))) == "COMPLETED");  // it ran in between
  CHECK(log.find("STEP " + j.id + ".0 ON " + node + " CANCELLED") != std::string::npos);
  CHECK(log.find("signal 15 received") != std::string::npos);
  const Resume r = resume_of(log);
  CHECK(r.saved >= seen);
  CHECK(r.restored == r.saved);
  check_as_uninterrupted(j.run());
}

TEST_CASE(
    "preempt 5: no grace, SIGKILL only (the node lost): resumed from the last periodic "
    "checkpoint",
    "[cli][preempt][slurm]") {
  const Job j = submit("sigkill", "");
  REQUIRE(j.at_step(kEvery + 10));
  const std::string node = sh("squeue -h -j " + j.id + " -o %N").out.substr(0, 5);
  const int64_t seen = last_step(j.v0());
  REQUIRE(sh("bash " + kSrc + "/scripts/slurm/cluster.sh lose " + node).code == 0);
  // Slurm requeues the job (--requeue) and starts it on the other node; the lost one comes back.
  REQUIRE(poll([&] { return j.field("Restarts") == "1"; }, 30));
  REQUIRE(sh("bash " + kSrc + "/scripts/slurm/cluster.sh revive " + node).code == 0);
  const std::string state = j.wait();
  const std::string log = j.log();
  INFO(log);
  REQUIRE(state == "COMPLETED");
  CHECK(log.find("signal") == std::string::npos);  // no notice came
  const int64_t restored = number_after(log, "(step ", log.find("[checkpoint] restored"));
  CHECK(restored % kEvery == 0);
  CHECK(restored > 0);
  CHECK(seen - restored <= kEvery);  // lost: at most one checkpoint interval
  check_as_uninterrupted(j.run());
}

TEST_CASE(
    "preempt 6: no scontrol in the ranks' environment (a container): the batch shell "
    "requeues",
    "[cli][preempt][slurm]") {
  // The tasks run with a PATH holding no scontrol, as in `srun --container-image`.
  const Job j =
      submit("container", "", {{"MLTRAIN_TEST_LOADER_DELAY_MS", "40"}}, [](std::string& s) {
        const std::string srun = "srun --kill-on-bad-exit=1 ";
        s.replace(s.find(srun), srun.size(), srun + "--export=ALL,PATH=/nonexistent ");
      });
  REQUIRE(j.at_step(40));
  const int64_t seen = last_step(j.v0());
  REQUIRE(sh("scancel --signal=USR1 " + j.id).code == 0);
  check_requeued_once(j, seen);
  CHECK(j.log().find("asking the batch script to requeue job " + j.id) != std::string::npos);
}

TEST_CASE("preempt 7: one task of an array job preempted: only that task is requeued",
          "[cli][preempt][slurm]") {
  // Two tasks, each its own run folder (run.name from the task id).
  const Job j =
      submit("array", "--array=0-1", {{"MLTRAIN_TEST_LOADER_DELAY_MS", "40"}}, [](std::string& s) {
        const std::string name = " run.name=array ";
        s.replace(s.find(name), name.size(), " \"run.name=task${SLURM_ARRAY_TASK_ID}\" ");
      });
  const Job t0{j.dir, "task0", j.id + "_0"}, t1{j.dir, "task1", j.id + "_1"};
  REQUIRE(t0.at_step(40));
  REQUIRE(t1.at_step(40));
  REQUIRE(sh("scancel --signal=USR1 " + t1.id).code == 0);
  CHECK(t0.wait(t0.id) == "COMPLETED");
  CHECK(t1.wait(t1.id) == "COMPLETED");
  std::string logs;
  for (const auto& e : fs::directory_iterator(j.run()))
    if (e.path().filename().string().rfind("slurm-", 0) == 0) logs += slurp(e.path());
  INFO(logs);
  CHECK(j.field("Restarts", t0.id) == "0");
  CHECK(j.field("Restarts", t1.id) == "1");
  CHECK(logs.find("requeued job " + t1.id) != std::string::npos);
  check_as_uninterrupted(t0.run());
  check_as_uninterrupted(t1.run());
}

TEST_CASE(
    "preempt 8: the signal arrives during a checkpoint write: the write completes, no step "
    "lost",
    "[cli][preempt][slurm]") {
  const Job j =
      submit("during_ckpt", "",
             {{"MLTRAIN_TEST_LOADER_DELAY_MS", "40"}, {"MLTRAIN_PAUSE", "ckpt.write@2:4000"}});
  // The second checkpoint (step 64) pauses between its weights and its optimizer state.
  REQUIRE(poll([&] { return j.log().find("paused at ckpt.write@2") != std::string::npos; }, 120));
  REQUIRE(sh("scancel --signal=USR1 " + j.id).code == 0);
  check_requeued_once(j, 2 * kEvery);
  CHECK(resume_of(j.log()).saved == 2 * kEvery);
}

TEST_CASE("preempt 9: the signal arrives during evaluation, and before the first step",
          "[cli][preempt][slurm]") {
  const Job ev = submit("during_eval", "",
                        {{"MLTRAIN_TEST_LOADER_DELAY_MS", "40"}, {"MLTRAIN_PAUSE", "eval@1:4000"}});
  const Job first =
      submit("before_first", "",
             {{"MLTRAIN_TEST_LOADER_DELAY_MS", "40"}, {"MLTRAIN_PAUSE", "fit.begin@1:4000"}});
  REQUIRE(
      poll([&] { return first.log().find("paused at fit.begin@1") != std::string::npos; }, 120));
  CHECK((!fs::exists(first.v0() / "metrics.jsonl") || last_step(first.v0()) == 0));  // no step yet
  REQUIRE(sh("scancel --signal=USR1 " + first.id).code == 0);
  REQUIRE(poll([&] { return ev.log().find("paused at eval@1") != std::string::npos; }, 120));
  REQUIRE(sh("scancel --signal=USR1 " + ev.id).code == 0);
  check_requeued_once(first, 0);
  CHECK(resume_of(first.log()).saved == 1);  // the step under way when it came
  check_requeued_once(ev, 2 * kEvery);
  CHECK(resume_of(ev.log()).saved == 2 * kEvery);  // the evaluation's step
}

TEST_CASE("preempt 10: the requeue limit reached: a clean terminal status in `mltrain runs`",
          "[cli][preempt][slurm]") {
  const Job j = submit("limit", "", {{"MLTRAIN_TEST_LOADER_DELAY_MS", "40"}}, {},
                       " distributed.max_requeues=0");
  REQUIRE(j.at_step(40));
  REQUIRE(sh("scancel --signal=USR1 " + j.id).code == 0);
  const std::string state = j.wait();
  const std::string log = j.log();
  INFO(log);
  CHECK(state == "FAILED");  // ended, not pending: the job did not finish its training
  CHECK(j.field("Restarts") == "0");
  const int64_t saved = resume_of(log).saved;
  REQUIRE(saved >= 40);
  const auto runs = run("runs " + j.dir.string());
  INFO(runs.out);
  CHECK(runs.code == 0);
  CHECK(runs.out.find("interrupted") != std::string::npos);
  CHECK(runs.out.find("requeue limit reached") != std::string::npos);
  const auto status = nlohmann::json::parse(slurp(j.v0() / "status.json"));
  CHECK(status["state"] == "interrupted");
  CHECK(status["step"] == saved);
  CHECK(status["detail"].get<std::string>().find("submit it again to resume from step " +
                                                 std::to_string(saved)) != std::string::npos);
  // Submitting again, as it says, finishes the run with the uninterrupted bits.
  const auto again =
      sh("cd " + j.dir.string() + " && sbatch --parsable " + (j.run() / "slurm.sbatch").string());
  REQUIRE(again.code == 0);
  const Job j2{j.dir, j.name, std::to_string(std::stoll(again.out))};
  CHECK(j2.wait() == "COMPLETED");
  check_as_uninterrupted(j.run());
}

// PBS and LSF, emulated: the job's command in a process group of its own, signalled as their
// servers signal a job's processes, and run again as a rerunnable job is.
namespace {
struct Emulated {
  fs::path dir, log;
  pid_t pid = -1;
  fs::path v0() const { return dir / "run" / "v0"; }
  void start(int n) {
    log = dir / ("attempt" + std::to_string(n) + ".log");
    std::vector<std::string> all = {kBin, "train", kCfg, "run.dir=" + dir.string(), "run.name=run"};
    std::istringstream extra(kRun + kTwoRanks);
    for (std::string w; extra >> w;) all.push_back(w);
    pid = spawn_group(all, log);  // the job's own process group, as the scheduler makes
  }
  // Sends each signal to the whole group, `gap_s` apart, until the job has exited; returns how
  // many were sent and the exit code.
  std::pair<int, int> stop(const std::vector<int>& sigs, double gap_s) {
    int sent = 0, code = -1;
    for (int sig : sigs) {
      ::kill(-pid, sig);
      ++sent;
      int st = 0;
      if (poll([&] { return ::waitpid(pid, &st, WNOHANG) == pid; }, gap_s)) {
        code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
    }
    if (code < 0) code = wait_exit(pid);
    return {sent, code};
  }
};

void delay_steps(bool on) {
  if (on)
    ::setenv("MLTRAIN_TEST_LOADER_DELAY_MS", "40", 1);
  else
    ::unsetenv("MLTRAIN_TEST_LOADER_DELAY_MS");
}
}  // namespace

TEST_CASE("preempt 11: PBS: SIGTERM, SIGKILL after the kill delay (10 s); rerun, same bits",
          "[cli][preempt][pbs]") {
  Emulated job{tmpdir("preempt_pbs")};
  delay_steps(true);
  job.start(1);
  REQUIRE(poll([&] { return fs::exists(job.v0() / "metrics.jsonl") && last_step(job.v0()) >= 40; },
               120));
  const int64_t seen = last_step(job.v0());
  const auto [sent, code] = job.stop({SIGTERM, SIGKILL}, 10);  // PBS's default kill_delay
  delay_steps(false);
  const std::string log = slurp(job.log);
  INFO(log);
  CHECK(sent == 1);  // stopped on SIGTERM, inside the kill delay: SIGKILL was never needed
  CHECK(code == 128 + SIGTERM);
  job.start(2);
  CHECK(wait_exit(job.pid) == 0);
  const Resume r = resume_of(log + slurp(job.log));
  CHECK(r.saved >= seen);
  CHECK(r.restored == r.saved);
  check_as_uninterrupted(job.dir / "run", 2);
}

TEST_CASE("preempt 12: LSF: SIGINT, SIGTERM, SIGKILL 10 s apart; a parallel job's SIGKILL alone",
          "[cli][preempt][lsf]") {
  Emulated job{tmpdir("preempt_lsf")};
  delay_steps(true);
  job.start(1);
  REQUIRE(poll([&] { return fs::exists(job.v0() / "metrics.jsonl") && last_step(job.v0()) >= 20; },
               120));
  const int64_t seen = last_step(job.v0());
  // SIGINT reaches every rank twice (directly and through the launcher): one request, not two.
  const auto [sent, code] = job.stop({SIGINT, SIGTERM, SIGKILL}, 10);
  std::string logs = slurp(job.log);
  INFO(logs);
  CHECK(sent == 1);
  CHECK(code == 128 + SIGINT);
  const Resume r = resume_of(logs);
  CHECK(r.saved >= seen);
  // The rerun; then, as LSF treats a parallel job's remote tasks, SIGKILL with no notice.
  job.start(2);
  REQUIRE(poll([&] { return last_step(job.v0()) >= r.saved + kEvery + 10; }, 120));
  const int64_t seen2 = last_step(job.v0());
  CHECK(job.stop({SIGKILL}, 10).second == 128 + SIGKILL);
  logs += slurp(job.log);
  delay_steps(false);
  job.start(3);
  CHECK(wait_exit(job.pid) == 0);
  const std::string last = slurp(job.log);
  INFO(last);
  CHECK(number_after(logs, "(step ", logs.find("[checkpoint] restored")) == r.saved);
  const int64_t restored = number_after(last, "(step ", last.find("[checkpoint] restored"));
  CHECK(restored % kEvery == 0);
  CHECK(seen2 - restored <= kEvery);  // lost: at most one checkpoint interval
  check_as_uninterrupted(job.dir / "run", 2);
}
