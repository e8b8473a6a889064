#pragma once
// A run folder's records in an MLflow tracking server, exactly once (REST over libcurl; no
// LibTorch). metrics.jsonl stays the record of truth: a sender thread reads what the trainer
// appended to it and posts it with runs/log-batch; a cursor in the run folder (mlflow.json)
// records what the server acknowledged, so a resumed run, a killed process or a server outage
// neither loses nor repeats a point (MLflow appends metric points and never overwrites).
//
//   auto target = track::mlflow_target(cfg.tracking.mlflow, run_name);  // nullopt: no MLflow
//   track::RunSync sync({*target, run_dir, ...});
//   sync.start();                    // thread; training never waits on the network
//   auto r = sync.finish("finished");   // sends what is left, the status, the artifacts
//
//   track::RunSync(...).push();     // `mltrain track push`: the same, in the calling thread
//
// Exactly once: a record is (event, step); records of one event are appended in step order, so
// "acknowledged" is, per event, the largest step the server has. Before a batch is posted the
// cursor notes it as pending with one of its points; when the answer is lost (a kill, a
// timeout, a server that died after committing), the next attempt asks the server for that
// point's history before posting again: MLflow commits a log-batch whole or not at all.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mltrain/config/experiment.hpp"

namespace mltrain::track {

// The server and how to reach it: tracking.mlflow.* and MLflow's own variables.
struct MlflowTarget {
  std::string uri;         // http(s)://host[:port][/prefix], without a trailing slash
  std::string experiment;  // name; created if missing
  std::string artifacts = "config";
  double flush_seconds = 30;
  std::string username, password, token;  // MLFLOW_TRACKING_USERNAME/PASSWORD, _TOKEN
};

// tracking.mlflow.uri, else MLFLOW_TRACKING_URI; nullopt when neither is set. The experiment is
// tracking.mlflow.experiment, else MLFLOW_EXPERIMENT_NAME, else `default_experiment`. A variable
// that is not an http(s) URI is a ConfigError naming it (exit 2).
std::optional<MlflowTarget> mlflow_target(const config::MlflowConfig& c,
                                          const std::string& default_experiment);

// The resolved config (config.yaml's text) as MLflow params: dotted keys (`optim.lr`), scalars
// as written, sequences and maps as flow YAML. Values over MLflow's 6,000 characters are cut.
std::vector<std::pair<std::string, std::string>> flatten_params(const std::string& config_yaml);

// One metrics.jsonl record as metric points "<event>/<field>" (every numeric field but step).
struct Point {
  std::string key;
  double value = 0;
  int64_t step = 0;
};
std::vector<Point> points_of(const nlohmann::json& record);

// The commit of the git work tree holding `dir` (read from .git, no git process), or "".
std::string git_commit_of(const std::filesystem::path& dir);

// What one server acknowledged for one run folder; mlflow.json holds one per server URI.
struct Cursor {
  std::string uid;  // tags the MLflow run, so a create whose answer was lost is found again
  std::string run_id, experiment_id, artifact_uri;
  std::map<std::string, int64_t> acked;       // event -> largest step the server has
  nlohmann::json pending;                     // null, or {"events": {event: step}, "key", "step"}
  std::map<std::string, std::string> params;  // as logged
  std::string state;                          // the status last sent (RUNNING, FINISHED, ...)
  std::map<std::string, std::string> artifacts;  // file -> SHA-256 uploaded
  bool is_acked(const std::string& event, int64_t step) const {
    const auto it = acked.find(event);
    return it != acked.end() && step <= it->second;
  }
  nlohmann::json to_json() const;
  static Cursor from_json(const nlohmann::json& j);
};

// The members after run_name have defaults, so {.target, .run_dir, .run_name} is complete.
struct SyncOptions {
  MlflowTarget target;
  std::filesystem::path run_dir;
  std::string run_name;       // MLflow's run name (mlflow.runName)
  int64_t resume_step = -1;   // a resumed run: params it changes are recorded as tags at this step
  std::string config_yaml{};  // the run's resolved config (live); empty: the folder's config.yaml
  std::string parent_run_id{};  // a study's trial: its study's run
  std::string state{};          // push: the run's end (finished, failed, ...); empty: status.json
  std::map<std::string, std::string> tags{};  // more tags (a study's name, a trial's number)
};

struct SyncReport {
  std::string run_id;
  int64_t sent = 0;     // records acknowledged by this process
  int64_t skipped = 0;  // records the server already had (cursor)
  int64_t left = 0;     // records not sent (server unreachable past the deadline)
  std::string error;    // the first error that stopped the sync ("" if none)
  bool auth = false;    // the server refused the credentials (401/403)
};

class RunSync {
 public:
  explicit RunSync(SyncOptions o);
  ~RunSync();  // stops the thread without waiting for the server
  RunSync(const RunSync&) = delete;
  RunSync& operator=(const RunSync&) = delete;

  void start();  // the sender thread: a batch a second of what metrics.jsonl gained
  // The run ended as `state` (status.json's: finished, failed, interrupted): sends what is left,
  // then the run's status and (finished) the artifacts, waiting at most `seconds` (negative:
  // target.flush_seconds); then stops the thread.
  SyncReport finish(const std::string& state, double seconds = -1);
  // `mltrain track push`: everything in the folder, its status from status.json, in this thread.
  // Gives up after `attempts` failed requests in a row.
  SyncReport push(int attempts = 3);
  // The run's id on the server, once known ("" before).
  std::string run_id() const;

 private:
  struct Http;
  struct Rec {
    std::string event;
    int64_t step;
    std::vector<Point> points;
  };
  void loop();
  bool pump();            // one round: read, make sure of the run, send a batch; false: retry
  void read_new();        // appends metrics.jsonl's new complete lines to queue_
  bool ensure_run();      // experiment, run, params, tags, RUNNING
  bool settle_pending();  // a batch whose answer was lost: ask the server
  bool send_batch();
  bool send_end();                                // status and artifacts, once everything is sent
  std::map<std::string, std::string> run_tags();  // cached in tags_
  bool log_params(std::map<std::string, std::string>& tags);  // adds tags for changed params
  bool upload(const std::string& file, const std::filesystem::path& path);
  void save_cursor();
  void fail(const std::string& what, bool auth);
  bool request_failed(const std::string& what, long code, const std::string& body);

  SyncOptions o_;
  std::unique_ptr<Http> http_;
  Cursor cursor_;
  nlohmann::json all_cursors_;  // mlflow.json: {uri: cursor}
  std::optional<std::map<std::string, std::string>> tags_;
  std::deque<Rec> queue_;
  uintmax_t offset_ = 0;  // bytes of metrics.jsonl read
  uint64_t inode_ = 0;
  bool run_ready_ = false;
  SyncReport report_;
  std::string end_state_;  // set by finish()/push()
  bool end_sent_ = false;
  double backoff_ = 1.0;
  bool warned_down_ = false;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// runs/<name>/v<N> is MLflow run "<name>/v<N>", in experiment <name> unless the target names one:
// the same for a live run and a pushed one.
SyncOptions options_for_run(const std::filesystem::path& run_dir, const MlflowTarget& target);

// `mltrain track push`: one run folder, or a tune study (a parent run with one child run per
// trial folder), `jobs` folders at a time. Every folder's report, in the order given.
std::vector<std::pair<std::filesystem::path, SyncReport>> push_folders(
    const std::vector<std::filesystem::path>& dirs, const MlflowTarget& target, int jobs = 4);

}  // namespace mltrain::track
