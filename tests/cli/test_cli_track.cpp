// Where users look: `mltrain train` with an MLflow server and `mltrain track push`, against a real
// `mlflow server` (the venv's MLflow 3.17, SQLite store, proxied artifacts) started on a free
// loopback port and stopped after; what the server holds is read back through MLflow's own Python
// client (tests/golden/check_mlflow.py): every metrics.jsonl record exactly once, and nothing
// else. And the files other tools read: TensorBoard's own reader on a run's event file, Optuna 5.0
// and optuna-dashboard on `mltrain tune export --optuna-journal`.
#include <random>

#include "cli_support.hpp"

namespace {

const std::string kMlflow = kSrc + "/.venv/bin/mlflow";
const std::string kCheck = kPython + " " + kSrc + "/tests/golden/check_mlflow.py";

// A real MLflow server in its own process group (its workers die with it). start() returns when
// /health answers, so every test waits on the server itself, never on a sleep. Its GenAI job
// runner (seven more Python processes, unrelated to tracking) is off.
class MlflowServer {
 public:
  MlflowServer(fs::path dir, bool auth = false)
      : dir_(std::move(dir)), port_(free_ports(1)), auth_(auth) {
    fs::create_directories(dir_);
  }
  ~MlflowServer() { stop(SIGKILL); }
  std::string uri() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void start() {
    REQUIRE(pid_ < 0);
    const std::string cmd =
        "cd '" + dir_.string() +
        "' && exec env MLFLOW_AUTH_ADMIN_PASSWORD=secret-pass-1 "
        "MLFLOW_FLASK_SERVER_SECRET_KEY=k MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false '" +
        kMlflow + "' server" + (auth_ ? " --app-name basic-auth" : "") +
        " --backend-store-uri sqlite:///" + (dir_ / "mlflow.db").string() +
        " --artifacts-destination " + (dir_ / "artifacts").string() + " --host 127.0.0.1 --port " +
        std::to_string(port_) + " --workers 1 >> server.log 2>&1";
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&at, 0);
    const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
    REQUIRE(posix_spawn(&pid_, "/bin/sh", nullptr, &at, const_cast<char**>(argv), environ) == 0);
    posix_spawnattr_destroy(&at);
    const bool up = wait_for(
        [&] {
          return sh("curl -s -o /dev/null -w '%{http_code}' " + uri() + "/health").out == "200" ||
                 (auth_ &&
                  sh("curl -s -o /dev/null -w '%{http_code}' " + uri() + "/health").out == "401");
        },
        90);
    INFO(slurp(dir_ / "server.log"));
    REQUIRE(up);
  }
  void stop(int sig = SIGTERM) {
    if (pid_ < 0) return;
    ::kill(-pid_, sig);
    wait_exit(pid_);
    // uvicorn's worker may outlive the shell for a moment: wait until the port is closed.
    wait_for([&] { return sh("curl -s -o /dev/null " + uri() + "/health").code != 0; }, 30);
    pid_ = -1;
  }

 private:
  fs::path dir_;
  int port_;
  bool auth_;
  pid_t pid_ = -1;
};

std::vector<std::string> mlp_args(const fs::path& dir, const std::string& name,
                                  const std::string& duration = "1200u") {
  return {kBin,
          "train",
          kSrc + "/configs/fashion_mnist_mlp.yaml",
          "run.dir=" + dir.string(),
          "run.name=" + name,
          "data.limit_train=2048",
          "train.duration=" + duration,
          "train.log_every=5u",
          "train.eval_every=100u",
          "checkpoint.every=25u",
          "checkpoint.keep_last=2",
          "train.tensorboard=false",
          "runtime.threads=1",
          "data.workers=0",
          "tracking.mlflow.flush_timeout=20s"};
}

// The largest step of a train record in metrics.jsonl so far (-1: none).
int64_t last_train_step(const fs::path& metrics) {
  int64_t last = -1;
  for (const auto& line : lines_of(metrics)) try {
      const auto r = nlohmann::json::parse(line);
      if (r.value("event", "") == "train") last = std::max(last, r.at("step").get<int64_t>());
    } catch (const std::exception&) {
    }
  return last;
}

Result check(const std::string& uri, const fs::path& run, const std::string& more = "") {
  return sh(kCheck + " " + uri + " '" + run.string() + "' " + more);
}

// A small real study (the Fashion-MNIST MLP under TPE and ASHA), run from the source folder.
fs::path small_study(const fs::path& dir, int trials) {
  const auto r = sh("cd " + kSrc + " && " + kBin + " tune configs/tune/fashion_mnist_mlp.yaml " +
                    "study.n_trials=" + std::to_string(trials) + " study.dir=" + dir.string() +
                    " 'trial.overrides=[train.duration=40u, train.eval_every=20u, "
                    "data.val_fraction=0.1, checkpoint.every=40u, data.limit_train=1024]'");
  INFO(r.out);
  REQUIRE(r.code == 0);
  return dir / "fashion_mnist_mlp";
}

}  // namespace

TEST_CASE("every record in MLflow exactly once: 20 SIGKILLs, a 60 s outage, a restart", "[track]") {
  const auto dir = tmpdir("track_once");
  MlflowServer server(dir / "server");
  server.start();
  ScopedEnv env({{"MLFLOW_TRACKING_URI", server.uri()}, {"MLFLOW_EXPERIMENT_NAME", "once"}});
  const fs::path rdir = dir / "runs" / "once" / "v0";
  const auto args = mlp_args(dir / "runs", "once");
  // 20 kill steps, seeded, spread over the 1,200 steps.
  std::mt19937 rng(std::getenv("MLTRAIN_TRACK_SEED") ? std::stoi(std::getenv("MLTRAIN_TRACK_SEED"))
                                                     : 7);
  std::set<int64_t> picks;
  while (picks.size() < 20) picks.insert(std::uniform_int_distribution<int64_t>(8, 1100)(rng));
  const std::vector<int64_t> kill_at(picks.begin(), picks.end());
  std::chrono::steady_clock::time_point outage;
  int faults = 0;
  for (size_t c = 0; c < kill_at.size(); ++c) {
    INFO("cycle " << c << ", kill at step " << kill_at[c]);
    if (c == 7) {  // the outage: the server goes away for 60 s while the job trains on
      server.stop();
      outage = std::chrono::steady_clock::now();
    }
    if (c == 13) server.start();  // after the held run below: 60 s have passed
    if (c == 16) {                // a restart: the server dies mid-run and comes back
      server.stop(SIGKILL);
      server.start();
    }
    const fs::path log = dir / ("cycle" + std::to_string(c) + ".log");
    if (c == 3 || c == 5 || c == 17) {
      // Killed by the sink's own fault points: after the server committed a batch and before the
      // cursor knew (track.acked), or after the cursor noted it and before it was posted.
      ScopedEnv f({{"MLTRAIN_FAULT", c == 5 ? "track.pending@1" : "track.acked@1"}});
      const pid_t pid = spawn(args, log);
      CHECK(wait_exit(pid) == 137);
      CHECK(slurp(log).find("[fault] killed at track.") != std::string::npos);
      ++faults;
      continue;
    }
    if (c == 12) {
      // Held (alive, no progress) until the outage is 60 s old, then preempted by SIGTERM: a
      // clean interruption whose records cannot reach the server.
      ScopedEnv hold({{"MLTRAIN_TEST_HOLD", "0:" + std::to_string(kill_at[c])}});
      const pid_t pid = spawn(args, log);
      REQUIRE(
          wait_for([&] { return last_train_step(rdir / "metrics.jsonl") >= kill_at[c] - 5; }, 120));
      REQUIRE(wait_for(
          [&] { return std::chrono::steady_clock::now() - outage >= std::chrono::seconds(60); },
          90));
      ::kill(pid, SIGTERM);
      CHECK(wait_exit(pid) == 128 + SIGTERM);
      CHECK(slurp(log).find("does not answer") != std::string::npos);
      continue;
    }
    const pid_t pid = spawn(args, log);
    const bool reached =
        wait_for([&] { return last_train_step(rdir / "metrics.jsonl") >= kill_at[c]; }, 120);
    ::kill(pid, SIGKILL);
    wait_exit(pid);
    REQUIRE(reached);
  }
  CHECK(faults == 3);
  const auto done = run(join(args, 1) + " 2>&1");
  INFO(done.out);
  REQUIRE(done.code == 0);
  check_metrics_once(rdir / "metrics.jsonl", 1200 / 5);
  const auto r = check(server.uri(), rdir,
                       "--status FINISHED --param optim.lr=0.001 --param data.limit_train=2048 "
                       "--tag mltrain.run_dir --tag mltrain.version --tag mltrain.binary_sha256");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("\"records\": 253") != std::string::npos);  // 240 train, 12 eval, 1 summary
}

TEST_CASE("track push: finished and interrupted runs, twice, and a tune study", "[track]") {
  const auto dir = tmpdir("track_push");
  // Folders written with no server at all.
  const fs::path runs = dir / "runs";
  REQUIRE(run(join(mlp_args(runs, "done", "200u"), 1)).code == 0);
  const pid_t pid = spawn(mlp_args(runs, "cut", "2000u"), dir / "cut.log");
  REQUIRE(
      wait_for([&] { return last_train_step(runs / "cut" / "v0" / "metrics.jsonl") >= 60; }, 120));
  ::kill(pid, SIGTERM);  // interrupted cleanly: status.json says so
  REQUIRE(wait_exit(pid) == 128 + SIGTERM);
  const fs::path sdir = small_study(dir / "tune", 2);

  MlflowServer server(dir / "server");
  server.start();
  const std::string push = "track push --uri " + server.uri() + " ";
  auto first = run(push + (runs / "done").string() + " " + (runs / "cut" / "v0").string() + " " +
                   sdir.string());
  INFO(first.out);
  REQUIRE(first.code == 0);
  CHECK(first.out.find(": 43 record(s) sent, 0 already there") != std::string::npos);  // 40+2+1
  CHECK(check(server.uri(), runs / "done" / "v0",
              "--status FINISHED --param train.duration=200u --tag mltrain.run_dir")
            .code == 0);
  CHECK(check(server.uri(), runs / "cut" / "v0", "--status KILLED").code == 0);
  CHECK(check(server.uri(), sdir, "--status FINISHED --tag-value mltrain.study=fashion_mnist_mlp")
            .code == 0);
  for (const char* t : {"t0000", "t0001"})
    CHECK(check(server.uri(), sdir / "trials" / t / "v0",
                std::string("--status FINISHED --parent ") + sdir.string() +
                    " --tag-value mltrain.trial=" + std::string(t).substr(1) +
                    " --tag-value mltrain.trial_state=" + (t[4] == '0' ? "COMPLETE" : "PRUNED"))
              .code == 0);
  // Artifacts of a finished run, through the server's proxy.
  CHECK(
      sh("curl -sf '" + server.uri() + "/api/2.0/mlflow/artifacts/list?run_id=" +
         nlohmann::json::parse(slurp(runs / "done" / "v0" / "mlflow.json"))[server.uri()]["run_id"]
             .get<std::string>() +
         "' | grep -q config.yaml")
          .code == 0);
  // Twice: the cursor knows what the server has; nothing is sent again.
  auto again = run(push + (runs / "done").string() + " " + sdir.string());
  INFO(again.out);
  REQUIRE(again.code == 0);
  CHECK(again.out.find(": 0 record(s) sent, 43 already there") != std::string::npos);
  CHECK(again.out.find("error") == std::string::npos);
  CHECK(check(server.uri(), runs / "done" / "v0", "--status FINISHED").code == 0);
}

TEST_CASE("a param changed on resume becomes a tag; a resumed finished run adds its summary",
          "[track]") {
  const auto dir = tmpdir("track_param");
  MlflowServer server(dir / "server");
  server.start();
  ScopedEnv env({{"MLFLOW_TRACKING_URI", server.uri()}});
  auto args = mlp_args(dir / "runs", "grow", "60u");
  REQUIRE(run(join(args, 1)).code == 0);
  const fs::path rdir = dir / "runs" / "grow" / "v0";
  // Train on to step 100 from the final checkpoint: MLflow refuses a changed param value.
  args[6] = "train.duration=100u";
  args.push_back("checkpoint.resume=" + (rdir / "checkpoints" / "step_60").string());
  const auto r = run(join(args, 1));
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto c = check(server.uri(), rdir,
                       "--status FINISHED --param train.duration=60u --extra summary "
                       "--tag-value mltrain.param_changed.step_60.train.duration=100u");
  INFO(c.out);
  CHECK(c.code == 0);
}

TEST_CASE("MLflow bad input: no scheme, unreachable, refused credentials", "[track]") {
  const auto dir = tmpdir("track_bad");
  SECTION("a URI without a scheme exits 2 before any run folder") {
    {
      ScopedEnv env({{"MLFLOW_TRACKING_URI", "localhost:5000"}});
      const auto r = run(join(mlp_args(dir / "runs", "x", "20u"), 1));
      CHECK(r.code == 2);
      CHECK(r.out.find("MLFLOW_TRACKING_URI: 'localhost:5000' has no scheme") != std::string::npos);
    }
    const auto c = run(join(mlp_args(dir / "runs", "x", "20u"), 1) +
                       " tracking.mlflow.uri=file:///tmp/mlruns");
    CHECK(c.code == 2);
    CHECK(c.out.find("tracking.mlflow.uri") != std::string::npos);
    CHECK(c.out.find("only http:// and https://") != std::string::npos);
    const auto p = run("track push --uri 127.0.0.1:5000 " + dir.string());
    CHECK(p.code == 2);
    CHECK(!fs::exists(dir / "runs"));
  }
  SECTION("an unreachable server: one warning, training goes on, push sends it later") {
    MlflowServer server(dir / "server");  // not started yet: its port refuses
    ScopedEnv env({{"MLFLOW_TRACKING_URI", server.uri()}});
    auto args = mlp_args(dir / "runs", "away", "100u");
    args.back() = "tracking.mlflow.flush_timeout=3s";
    const auto r = run(join(args, 1));
    INFO(r.out);
    REQUIRE(r.code == 0);
    size_t warnings = 0;
    for (size_t at = 0; (at = r.out.find("does not answer", at)) != std::string::npos; ++at)
      ++warnings;
    CHECK(warnings == 1);
    CHECK(r.out.find("record(s) not sent") != std::string::npos);
    server.start();
    const auto p = run("track push " + (dir / "runs" / "away" / "v0").string());
    INFO(p.out);
    CHECK(p.code == 0);
    CHECK(check(server.uri(), dir / "runs" / "away" / "v0", "--status FINISHED").code == 0);
  }
  SECTION("a server that is not MLflow: one error with its answer; training goes on") {
    const int port = free_ports(1);
    const fs::path root = dir / "www";
    fs::create_directories(root);
    pid_t web = 0;
    const std::string py = "/usr/bin/python3", port_s = std::to_string(port);
    const char* argv[] = {py.c_str(), "-m",        "http.server", port_s.c_str(),
                          "--bind",   "127.0.0.1", nullptr};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addchdir_np(&fa, root.c_str());
    REQUIRE(posix_spawn(&web, py.c_str(), &fa, nullptr, const_cast<char**>(argv), environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    const std::string uri = "http://127.0.0.1:" + port_s;
    REQUIRE(wait_for([&] { return sh("curl -s -o /dev/null " + uri + "/").code == 0; }, 30));
    ScopedEnv env({{"MLFLOW_TRACKING_URI", uri}});
    const auto r = run(join(mlp_args(dir / "runs", "web", "20u"), 1));
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK(r.out.find("refused experiment 'web': HTTP 404") != std::string::npos);
    const auto p = run("track push " + (dir / "runs" / "web" / "v0").string());
    INFO(p.out);
    CHECK(p.code == 1);
    CHECK(p.out.find("HTTP 404") != std::string::npos);
    ::kill(web, SIGTERM);
    wait_exit(web);
  }
  SECTION("401: one error naming the variables; training goes on; the right ones work") {
    MlflowServer server(dir / "server", /*auth=*/true);
    server.start();
    const fs::path rdir = dir / "runs" / "locked" / "v0";
    {
      ScopedEnv env({{"MLFLOW_TRACKING_URI", server.uri()},
                     {"MLFLOW_TRACKING_USERNAME", "admin"},
                     {"MLFLOW_TRACKING_PASSWORD", "wrong"}});
      const auto r = run(join(mlp_args(dir / "runs", "locked", "60u"), 1));
      INFO(r.out);
      CHECK(r.code == 0);
      CHECK(r.out.find("answered 401") != std::string::npos);
      CHECK(r.out.find("set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD") !=
            std::string::npos);
      const auto p = run("track push " + rdir.string());
      CHECK(p.code == 2);
      CHECK(p.out.find("answered 401") != std::string::npos);
    }
    ScopedEnv env({{"MLFLOW_TRACKING_URI", server.uri()},
                   {"MLFLOW_TRACKING_USERNAME", "admin"},
                   {"MLFLOW_TRACKING_PASSWORD", "secret-pass-1"}});
    const auto p = run("track push " + rdir.string());
    INFO(p.out);
    CHECK(p.code == 0);
    CHECK(check(server.uri(), rdir, "--status FINISHED").code == 0);
  }
}

TEST_CASE("TensorBoard's own reader sees every scalar of a run, as metrics.jsonl has it",
          "[interop]") {
  const auto dir = tmpdir("track_tb");
  auto args = mlp_args(dir / "runs", "tb", "96u");
  args[11] = "train.tensorboard=true";
  args.push_back("train.histograms_every=48u");
  REQUIRE(run(join(args, 1)).code == 0);
  const auto r = sh(kPython + " " + kSrc + "/tests/golden/check_tensorboard.py " +
                    (dir / "runs" / "tb" / "v0").string() + " --histograms 12");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("\"problems\": 0") != std::string::npos);
}

TEST_CASE("tune export: Optuna 5.0 loads every trial; optuna-dashboard lists them", "[interop]") {
  const auto dir = tmpdir("track_optuna");
  const fs::path sdir = small_study(dir / "tune", 4);
  const fs::path out = dir / "study.log";
  const auto e = run("tune export " + sdir.string() + " --optuna-journal " + out.string());
  INFO(e.out);
  REQUIRE(e.code == 0);
  CHECK(e.out.find("4 trial(s)") != std::string::npos);
  const auto r = sh(kPython + " " + kSrc + "/tests/golden/check_optuna_journal.py " +
                    sdir.string() + " " + out.string() + " --dashboard");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("\"dashboard_trials\": 4") != std::string::npos);
  const auto bad = run("tune export " + (dir / "nothing").string() + " --optuna-journal " +
                       (dir / "x.log").string());
  CHECK(bad.code == 3);
  CHECK(bad.out.find("is not a study folder (no study.yaml)") != std::string::npos);
  CHECK(!fs::exists(dir / "x.log"));
}
