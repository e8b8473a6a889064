// The MLflow sink: libcurl requests, the cursor, the sender loop (track/mlflow.hpp).
#include "mltrain/track/mlflow.hpp"

#ifdef MLTRAIN_WITH_CURL
#include <curl/curl.h>
#endif
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include "mltrain/config/format.hpp"
#include "mltrain/config/schema.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fault.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/process.hpp"
#include "mltrain/core/sha256.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace mltrain::track {

namespace {

constexpr size_t kMetricsPerBatch = 1000;  // MLflow's limits per runs/log-batch request
constexpr size_t kParamsPerBatch = 100;
constexpr size_t kTagsPerBatch = 100;
constexpr size_t kParamValueMax = 6000;
constexpr size_t kQueueMax = 20000;  // records held in memory; the rest wait in metrics.jsonl
constexpr double kBackoffMax = 30;
constexpr double kInterval = 1.0;  // seconds between batches while the run goes on

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string env_or(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

json json_or_null(const std::string& text) {
  try {
    return json::parse(text);
  } catch (const std::exception&) {
    return nullptr;
  }
}

// A double as MLflow's JSON takes it: NaN and infinities as the strings protobuf reads.
json metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

std::string random_hex(int bytes) {
  std::random_device rd;
  std::string s;
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < bytes; ++i) {
    const unsigned b = rd() & 0xff;
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

void flatten(const YAML::Node& n, const std::string& prefix,
             std::vector<std::pair<std::string, std::string>>& out) {
  if (n.IsMap() && n.size() > 0) {  // a section: one param per setting below it
    for (const auto& kv : n) {
      const std::string k = kv.first.as<std::string>();
      flatten(kv.second, prefix.empty() ? k : prefix + "." + k, out);
    }
    return;
  }
  std::string v;
  if (n.IsScalar()) {
    v = n.Scalar();
  } else if (n.IsNull()) {
    v = "";
  } else {
    YAML::Emitter e;
    e.SetMapFormat(YAML::Flow);
    e.SetSeqFormat(YAML::Flow);
    e << n;
    v = e.c_str();
  }
  if (v.size() > kParamValueMax) v = v.substr(0, kParamValueMax - 3) + "...";
  out.emplace_back(prefix, v);
}

}  // namespace

std::optional<MlflowTarget> mlflow_target(const config::MlflowConfig& c,
                                          const std::string& default_experiment) {
  MlflowTarget t;
  t.uri = c.uri;
  if (t.uri.empty()) {
    t.uri = env_or("MLFLOW_TRACKING_URI");
    if (t.uri.empty()) return std::nullopt;
    if (const std::string why = config::tracking_uri_problem(t.uri); !why.empty())
      throw ConfigError("MLFLOW_TRACKING_URI", why,
                        "set MLFLOW_TRACKING_URI to the server's address, e.g. "
                        "http://127.0.0.1:5000, or unset it (no MLflow)");
  }
  while (!t.uri.empty() && t.uri.back() == '/') t.uri.pop_back();
  t.experiment =
      !c.experiment.empty() ? c.experiment : env_or("MLFLOW_EXPERIMENT_NAME", default_experiment);
  t.artifacts = c.artifacts;
  t.flush_seconds = c.flush_timeout.enabled() ? c.flush_timeout.secs : 0;
  t.username = env_or("MLFLOW_TRACKING_USERNAME");
  t.password = env_or("MLFLOW_TRACKING_PASSWORD");
  t.token = env_or("MLFLOW_TRACKING_TOKEN");
  return t;
}

std::vector<std::pair<std::string, std::string>> flatten_params(const std::string& config_yaml) {
  std::vector<std::pair<std::string, std::string>> out;
  const YAML::Node root = YAML::Load(config_yaml);
  if (root.IsMap()) flatten(root, "", out);
  return out;
}

std::vector<Point> points_of(const json& record) {
  std::vector<Point> out;
  const std::string event = record.value("event", "");
  const int64_t step = record.value("step", int64_t{0});
  for (const auto& [k, v] : record.items())
    if (k != "step" && v.is_number()) out.push_back({event + "/" + k, v.get<double>(), step});
  return out;
}

std::string git_commit_of(const fs::path& start) {
  std::error_code ec;
  for (fs::path d = fs::absolute(start, ec); !d.empty(); d = d.parent_path()) {
    const fs::path git = d / ".git";
    if (fs::is_directory(git, ec)) {
      std::ifstream head(git / "HEAD");
      std::string line;
      std::getline(head, line);
      if (line.rfind("ref: ", 0) != 0) return line;  // detached: the commit itself
      const std::string ref = line.substr(5);
      std::ifstream loose(git / ref);
      if (std::string sha; std::getline(loose, sha) && sha.size() >= 40) return sha;
      std::ifstream packed(git / "packed-refs");
      while (std::getline(packed, line))
        if (line.size() > 41 && line.compare(41, std::string::npos, ref) == 0)
          return line.substr(0, 40);
      return "";
    }
    if (d == d.parent_path()) break;
  }
  return "";
}

json Cursor::to_json() const {
  return {{"uid", uid},
          {"artifact_uri", artifact_uri},
          {"run_id", run_id},
          {"experiment_id", experiment_id},
          {"acked", acked},
          {"pending", pending},
          {"params", params},
          {"state", state},
          {"artifacts", artifacts}};
}

Cursor Cursor::from_json(const json& j) {
  Cursor c;
  c.uid = j.value("uid", "");
  c.run_id = j.value("run_id", "");
  c.experiment_id = j.value("experiment_id", "");
  c.artifact_uri = j.value("artifact_uri", "");
  if (j.contains("acked")) c.acked = j["acked"].get<std::map<std::string, int64_t>>();
  c.pending = j.value("pending", json(nullptr));
  if (j.contains("params")) c.params = j["params"].get<std::map<std::string, std::string>>();
  c.state = j.value("state", "");
  if (j.contains("artifacts"))
    c.artifacts = j["artifacts"].get<std::map<std::string, std::string>>();
  return c;
}

// ---------------------------------------------------------------------------------------------
// HTTP: one libcurl easy handle per sync, reused (keep-alive); a request in flight is abandoned
// when the sync stops (the progress callback reads the stop flag).

#ifdef MLTRAIN_WITH_CURL
struct RunSync::Http {
  struct Answer {
    long code = 0;  // HTTP status; 0: no answer (curl_error says why)
    std::string body, curl_error;
    bool ok() const { return code >= 200 && code < 300; }
    // MLflow's error_code ("RESOURCE_DOES_NOT_EXIST"), or "".
    std::string error_code() const {
      const json j = json_or_null(body);
      return j.is_object() ? j.value("error_code", "") : "";
    }
    std::string what() const {
      if (code == 0) return curl_error;
      const json j = json_or_null(body);
      const std::string m = j.is_object() ? j.value("message", "") : body.substr(0, 300);
      return "HTTP " + std::to_string(code) + (m.empty() ? "" : ": " + m);
    }
  };
  const MlflowTarget& t;
  const std::atomic<bool>& stop;
  CURL* h = nullptr;

  Http(const MlflowTarget& target, const std::atomic<bool>& stop_flag)
      : t(target), stop(stop_flag) {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    h = curl_easy_init();
  }
  ~Http() {
    if (h) curl_easy_cleanup(h);
  }
  static size_t collect(char* p, size_t size, size_t n, void* out) {
    static_cast<std::string*>(out)->append(p, size * n);
    return size * n;
  }
  static int progress(void* self, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return static_cast<Http*>(self)->stop.load() ? 1 : 0;
  }
  std::string escape(const std::string& s) {
    char* e = curl_easy_escape(h, s.c_str(), static_cast<int>(s.size()));
    std::string out = e ? e : "";
    curl_free(e);
    return out;
  }
  Answer call(const char* method, const std::string& path, const std::string& body,
              const char* content_type = "application/json", long timeout_s = 20) {
    Answer a;
    if (!h) {
      a.curl_error = "libcurl could not start";
      return a;
    }
    curl_easy_reset(h);
    const std::string url = t.uri + path;
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, (std::string("Content-Type: ") + content_type).c_str());
    if (!t.token.empty())
      headers = curl_slist_append(headers, ("Authorization: Bearer " + t.token).c_str());
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    if (!t.username.empty()) {
      curl_easy_setopt(h, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
      curl_easy_setopt(h, CURLOPT_USERNAME, t.username.c_str());
      curl_easy_setopt(h, CURLOPT_PASSWORD, t.password.c_str());
    }
    if (std::string(method) != "GET") {
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    }
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &Http::collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &a.body);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, &Http::progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, this);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 5L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, timeout_s);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    const CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(headers);
    if (rc != CURLE_OK) {
      a.curl_error = std::string(curl_easy_strerror(rc)) + " (" + url + ")";
      a.body.clear();
      return a;
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &a.code);
    return a;
  }
  Answer get(const std::string& path) { return call("GET", "/api/2.0/mlflow/" + path, ""); }
  Answer post(const std::string& path, const json& body) {
    return call("POST", "/api/2.0/mlflow/" + path, body.dump());
  }
};

#else
// Built without libcurl: every request fails, saying so once per sync.
struct RunSync::Http {
  struct Answer {
    long code = 0;
    std::string body,
        curl_error = "mltrain was built without libcurl (install libcurl4-openssl-dev and rebuild)";
    bool ok() const { return false; }
    std::string error_code() const { return ""; }
    std::string what() const { return curl_error; }
  };
  Http(const MlflowTarget&, const std::atomic<bool>&) {}
  std::string escape(const std::string& s) { return s; }
  Answer call(const char*, const std::string&, const std::string&, const char* = "", long = 0) {
    return {};
  }
  Answer get(const std::string&) { return {}; }
  Answer post(const std::string&, const json&) { return {}; }
};
#endif

// ---------------------------------------------------------------------------------------------

RunSync::RunSync(SyncOptions o)
    : o_(std::move(o)), http_(std::make_unique<Http>(o_.target, stop_)) {
  const fs::path file = o_.run_dir / "mlflow.json";
  std::error_code ec;
  if (fs::exists(file, ec)) {
    all_cursors_ = json_or_null(read_file(file.string()));
    if (!all_cursors_.is_object()) {
      spdlog::warn("[mlflow] {} is not a cursor file: starting a new MLflow run", file.string());
      all_cursors_ = json::object();
    }
  } else {
    all_cursors_ = json::object();
  }
  if (all_cursors_.contains(o_.target.uri))
    cursor_ = Cursor::from_json(all_cursors_[o_.target.uri]);
  report_.run_id = cursor_.run_id;
}

RunSync::~RunSync() {
  stop_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string RunSync::run_id() const {
  std::lock_guard<std::mutex> l(mu_);
  return report_.run_id;
}

void RunSync::save_cursor() {
  all_cursors_[o_.target.uri] = cursor_.to_json();
  write_file_atomic((o_.run_dir / "mlflow.json").string(), all_cursors_.dump(1) + "\n");
}

void RunSync::fail(const std::string& what, bool auth) {
  if (report_.error.empty()) {
    report_.error = what;
    report_.auth = auth;
  }
}

// A request that failed: 401/403 stop the sync with the variable to set; other 4xx (but 429) stop
// it with the server's message; no answer, 429 and 5xx are left to the retry. Returns false, so a
// step can `return request_failed(...)`.
bool RunSync::request_failed(const std::string& what, long code, const std::string& body) {
  if (code == 401 || code == 403) {
    fail("MLflow at " + o_.target.uri + " answered " + std::to_string(code) + " to " + what +
             ": set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
             "MLFLOW_TRACKING_TOKEN) to credentials it accepts",
         true);
    return false;
  }
  if (code >= 400 && code < 500 && code != 429) {
    fail("MLflow at " + o_.target.uri + " refused " + what + ": " + body, false);
  }
  return false;
}

void RunSync::read_new() {
  const fs::path file = o_.run_dir / "metrics.jsonl";
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return;
  if (static_cast<uint64_t>(st.st_ino) != inode_ || static_cast<uintmax_t>(st.st_size) < offset_) {
    inode_ = st.st_ino;  // replaced (a resume's rewind): read it again from the top
    offset_ = 0;
    queue_.clear();
  }
  if (queue_.size() >= kQueueMax || static_cast<uintmax_t>(st.st_size) == offset_) return;
  std::ifstream in(file, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(offset_));
  std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = 0;
  for (size_t nl; queue_.size() < kQueueMax && (nl = chunk.find('\n', at)) != std::string::npos;
       at = nl + 1) {
    const json j = json_or_null(chunk.substr(at, nl - at));
    if (!j.is_object() || !j.contains("event") || !j.contains("step") ||
        !j["step"].is_number_integer())
      continue;  // a line a kill cut, or not a record
    Rec r{j["event"].get<std::string>(), j["step"].get<int64_t>(), points_of(j)};
    if (cursor_.is_acked(r.event, r.step))
      ++report_.skipped;
    else
      queue_.push_back(std::move(r));
  }
  offset_ += at;
}

// The run's tags, worked out once per sync (env.json read, the binary hashed): a server that is
// down makes ensure_run() retry, and each retry needs them again.
std::map<std::string, std::string> RunSync::run_tags() {
  if (tags_) return *tags_;
  json env = nullptr;
  if (fs::exists(o_.run_dir / "env.json"))
    env = json_or_null(read_file((o_.run_dir / "env.json").string()));
  std::map<std::string, std::string> tags = o_.tags;
  tags["mltrain.run_dir"] = fs::absolute(o_.run_dir).string();
  if (!o_.parent_run_id.empty()) tags["mlflow.parentRunId"] = o_.parent_run_id;
  tags["mlflow.source.name"] = "mltrain";
  tags["mlflow.source.type"] = "JOB";
  if (const std::string user = env_or("USER"); !user.empty()) tags["mlflow.user"] = user;
  bool live;
  {
    std::lock_guard<std::mutex> l(mu_);
    live = end_state_.empty();
  }
  if (live) tags["mltrain.binary_sha256"] = sha256_file(self_exe());  // the binary training now
  if (env.is_object()) {
    if (env.contains("mltrain")) tags["mltrain.version"] = env.value("mltrain", "");
    if (env.contains("binary_sha256"))
      tags["mltrain.binary_sha256"] = env.value("binary_sha256", "");
    if (const std::string git = env.value("config_git", ""); !git.empty())
      tags["mlflow.source.git.commit"] = git;
    if (env.contains("env") && env["env"].is_object())
      for (const auto& [k, v] : env["env"].items())
        if (v.is_string() && (k.rfind("SLURM_", 0) == 0 || k.rfind("KUBERNETES_", 0) == 0 ||
                              k.rfind("PET_", 0) == 0 || k == "JOB_NAME" || k == "POD_NAME"))
          tags["job." + k] = v.get<std::string>();
  }
  tags_ = tags;
  return tags;
}

static json key_values(const std::vector<std::pair<std::string, std::string>>& kv, size_t from,
                       size_t n) {
  json out = json::array();
  for (size_t j = from; j < std::min(kv.size(), from + n); ++j)
    out.push_back({{"key", kv[j].first}, {"value", kv[j].second}});
  return out;
}

bool RunSync::log_params(std::map<std::string, std::string>& tags) {
  // Params: the ones the server has stay; a changed value (a resume with other overrides) is
  // refused by MLflow, so it becomes a tag naming the step it changed at. A resumed run keeps
  // its first config.yaml; the live sync is given the config it runs now.
  std::string yaml = o_.config_yaml;
  for (const char* f : {"config.yaml", "study.yaml"})
    if (yaml.empty() && fs::exists(o_.run_dir / f)) yaml = read_file((o_.run_dir / f).string());
  std::vector<std::pair<std::string, std::string>> fresh;
  for (auto& [k, v] : flatten_params(yaml)) {
    const auto it = cursor_.params.find(k);
    if (it == cursor_.params.end())
      fresh.emplace_back(k, v);
    else if (it->second != v)
      tags["mltrain.param_changed.step_" + std::to_string(std::max<int64_t>(0, o_.resume_step)) +
           "." + k] = v;
  }
  for (size_t i = 0; i < fresh.size(); i += kParamsPerBatch) {
    const auto a = http_->post(
        "runs/log-batch",
        {{"run_id", cursor_.run_id}, {"params", key_values(fresh, i, kParamsPerBatch)}});
    if (!a.ok()) return request_failed("the run's params", a.code, a.what());
  }
  for (auto& [k, v] : fresh) cursor_.params[k] = v;
  return true;
}

// The experiment's id, asked once per process and server (a push of 100 folders asks once).
static std::mutex experiments_mu;
static std::map<std::string, std::string> experiment_ids;  // "<uri> <name>" -> id

bool RunSync::ensure_run() {
  if (run_ready_) return true;
  auto tags = run_tags();
  tags["mltrain.uid"] = cursor_.uid;  // empty before the first attempt: set again below
  bool created = false;
  if (cursor_.run_id.empty()) {
    const std::string cache_key = o_.target.uri + " " + o_.target.experiment;
    if (cursor_.experiment_id.empty()) {
      std::lock_guard<std::mutex> l(experiments_mu);
      if (const auto it = experiment_ids.find(cache_key); it != experiment_ids.end())
        cursor_.experiment_id = it->second;
    }
    if (cursor_.experiment_id.empty()) {
      const std::string get =
          "experiments/get-by-name?experiment_name=" + http_->escape(o_.target.experiment);
      auto a = http_->get(get);
      if (!a.ok() && a.error_code() == "RESOURCE_DOES_NOT_EXIST") {
        a = http_->post("experiments/create", {{"name", o_.target.experiment}});
        if (a.ok())
          a.body = json{{"experiment", {{"experiment_id", json::parse(a.body)["experiment_id"]}}}}
                       .dump();
        else if (a.error_code() == "RESOURCE_ALREADY_EXISTS")  // another run created it meanwhile
          a = http_->get(get);
      }
      if (!a.ok())
        return request_failed("experiment '" + o_.target.experiment + "'", a.code, a.what());
      cursor_.experiment_id = json::parse(a.body)["experiment"]["experiment_id"].get<std::string>();
      std::lock_guard<std::mutex> l(experiments_mu);
      experiment_ids[cache_key] = cursor_.experiment_id;
    }
    if (cursor_.uid.empty()) {
      cursor_.uid = random_hex(16);
      save_cursor();  // before the create: a create whose answer is lost is found by this tag
    } else {
      const auto a =
          http_->post("runs/search", {{"experiment_ids", {cursor_.experiment_id}},
                                      {"filter", "tags.`mltrain.uid` = '" + cursor_.uid + "'"},
                                      {"max_results", 1}});
      if (!a.ok()) return request_failed("a search for this run", a.code, a.what());
      const json j = json_or_null(a.body);
      if (j.is_object() && j.contains("runs") && !j["runs"].empty()) {
        cursor_.run_id = j["runs"][0]["info"]["run_id"].get<std::string>();
        cursor_.artifact_uri = j["runs"][0]["info"].value("artifact_uri", "");
      }
    }
    if (cursor_.run_id.empty()) {  // a new run, with its tags
      tags["mltrain.uid"] = cursor_.uid;
      const auto a = http_->post(
          "runs/create", {{"experiment_id", cursor_.experiment_id},
                          {"run_name", o_.run_name},
                          {"start_time", now_ms()},
                          {"tags", key_values({tags.begin(), tags.end()}, 0, tags.size())}});
      if (!a.ok()) return request_failed("a new run", a.code, a.what());
      const json info = json::parse(a.body)["run"]["info"];
      cursor_.run_id = info["run_id"].get<std::string>();
      cursor_.artifact_uri = info.value("artifact_uri", "");
      cursor_.state = "RUNNING";  // what runs/create starts a run as
      created = true;
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      report_.run_id = cursor_.run_id;
    }
  }
  const size_t tag_count = tags.size();
  if (!log_params(tags)) return false;
  save_cursor();
  // A run that existed already gets its tags again (a Slurm restart count moves on), and a run
  // whose params changed gets the changes.
  if (!created || tags.size() != tag_count) {
    const std::vector<std::pair<std::string, std::string>> all(tags.begin(), tags.end());
    for (size_t i = 0; i < all.size(); i += kTagsPerBatch) {
      const auto a = http_->post("runs/log-batch", {{"run_id", cursor_.run_id},
                                                    {"tags", key_values(all, i, kTagsPerBatch)}});
      if (!a.ok()) return request_failed("the run's tags", a.code, a.what());
    }
  }
  bool ending;
  {
    std::lock_guard<std::mutex> l(mu_);
    ending = !end_state_.empty();
  }
  if (!ending && cursor_.state != "RUNNING") {  // a live run (again, after an interruption)
    const auto a = http_->post("runs/update", {{"run_id", cursor_.run_id}, {"status", "RUNNING"}});
    if (!a.ok()) return request_failed("the run's status", a.code, a.what());
    cursor_.state = "RUNNING";
    save_cursor();
  }
  run_ready_ = true;
  return true;
}

bool RunSync::settle_pending() {
  if (cursor_.pending.is_null()) return true;
  // Did the batch land? Its probe point is in the key's history exactly when it did.
  const std::string key = cursor_.pending["key"].get<std::string>();
  const int64_t step = cursor_.pending["step"].get<int64_t>();
  bool landed = false;
  std::string token;
  do {
    const auto a = http_->get("metrics/get-history?run_id=" + cursor_.run_id +
                              "&metric_key=" + http_->escape(key) + "&max_results=25000" +
                              (token.empty() ? "" : "&page_token=" + http_->escape(token)));
    if (!a.ok()) return request_failed("a metric's history", a.code, a.what());
    const json j = json_or_null(a.body);
    if (!j.is_object()) return false;
    for (const auto& m : j.value("metrics", json::array()))
      if (m.value("step", int64_t{-1}) == step) landed = true;
    token = j.value("next_page_token", "");
  } while (!landed && !token.empty());
  if (landed) {
    for (const auto& [event, s] : cursor_.pending["events"].items())
      cursor_.acked[event] = std::max(cursor_.acked[event], s.get<int64_t>());
    report_.sent += cursor_.pending.value("records", int64_t{0});
    while (!queue_.empty() && cursor_.is_acked(queue_.front().event, queue_.front().step))
      queue_.pop_front();
  }
  cursor_.pending = nullptr;
  save_cursor();
  return true;
}

bool RunSync::send_batch() {
  size_t n = 0, points = 0;
  json metrics = json::array();
  json events = json::object();
  const int64_t ts = now_ms();
  const Point* last = nullptr;
  while (n < queue_.size() && (n == 0 || points + queue_[n].points.size() <= kMetricsPerBatch)) {
    const Rec& r = queue_[n++];
    for (const auto& p : r.points) {
      metrics.push_back(
          {{"key", p.key}, {"value", metric_value(p.value)}, {"timestamp", ts}, {"step", p.step}});
      last = &p;
    }
    points += r.points.size();
    events[r.event] = r.step;
  }
  if (last) {
    cursor_.pending = {{"events", events},
                       {"key", last->key},
                       {"step", last->step},
                       {"records", static_cast<int64_t>(n)}};
    save_cursor();
    fault::at("track.pending");  // noted, not posted
    const auto a =
        http_->post("runs/log-batch", {{"run_id", cursor_.run_id}, {"metrics", metrics}});
    if (!a.ok()) return request_failed("metrics", a.code, a.what());
    fault::at("track.acked");  // the server has them; the cursor does not know yet
  }
  for (const auto& [event, s] : events.items())
    cursor_.acked[event] = std::max(cursor_.acked[event], s.get<int64_t>());
  cursor_.pending = nullptr;
  save_cursor();
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
  report_.sent += static_cast<int64_t>(n);
  return true;
}

bool RunSync::upload(const std::string& name, const fs::path& path) {
  const std::string sha = sha256_file(path.string());
  if (cursor_.artifacts.count(name) && cursor_.artifacts[name] == sha) return true;
  if (cursor_.artifact_uri.empty()) {
    const auto info = http_->get("runs/get?run_id=" + cursor_.run_id);
    if (!info.ok()) return request_failed("the run's artifact location", info.code, info.what());
    cursor_.artifact_uri = json::parse(info.body)["run"]["info"].value("artifact_uri", "");
  }
  const std::string root = cursor_.artifact_uri;
  const std::string scheme = "mlflow-artifacts:";
  if (root.rfind(scheme, 0) != 0) {
    spdlog::warn(
        "[mlflow] artifacts not uploaded: the server stores them at {} itself (start it "
        "with --serve-artifacts to have mltrain upload them)",
        root);
    cursor_.artifacts[name] = sha;
    return true;
  }
  std::string rel = root.substr(scheme.size());
  while (!rel.empty() && rel.front() == '/') rel.erase(0, 1);
  const std::string bytes = read_file(path.string());
  const auto a = http_->call("PUT", "/api/2.0/mlflow-artifacts/artifacts/" + rel + "/" + name,
                             bytes, "application/octet-stream", 600);
  if (!a.ok()) return request_failed("artifact " + name, a.code, a.what());
  cursor_.artifacts[name] = sha;
  return true;
}

// The best checkpoint's weights: the step_<N> whose trainer.json has the best monitor value
// (checkpoint.mode of the run's config; `max` for accuracy-like monitors), else the latest.
static fs::path best_model(const fs::path& run_dir) {
  std::string mode = "min";
  try {
    const auto cfg = config::load_experiment((run_dir / "config.yaml").string(), {});
    mode = config::checkpoint_mode(cfg);
  } catch (const std::exception&) {
  }
  fs::path best;
  double best_v = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir / "checkpoints", ec)) {
    if (e.path().filename().string().rfind("step_", 0) != 0 || e.path().extension() == ".partial")
      continue;
    const json t = json_or_null(read_file((e.path() / "trainer.json").string()));
    if (!t.is_object() || !t.contains("monitor") || !fs::exists(e.path() / "model.safetensors"))
      continue;
    const double v = t["monitor"].get<double>();
    if (best.empty() || (mode == "max" ? v > best_v : v < best_v)) best = e.path(), best_v = v;
  }
  return best.empty() ? best : best / "model.safetensors";
}

bool RunSync::send_end() {
  std::string state;
  {
    std::lock_guard<std::mutex> l(mu_);
    state = end_state_;
  }
  const std::string status = state == "finished"      ? "FINISHED"
                             : state == "failed"      ? "FAILED"
                             : state == "interrupted" ? "KILLED"
                                                      : "";
  if (status.empty()) return end_sent_ = true;  // still running: nothing to close
  if (status == "FINISHED" && o_.target.artifacts != "none") {
    for (const char* f : {"config.yaml", "study.yaml", "report.html", "summary.json"})
      if (fs::exists(o_.run_dir / f) && !upload(f, o_.run_dir / f)) return save_cursor(), false;
    if (o_.target.artifacts == "model")
      if (const fs::path m = best_model(o_.run_dir); !m.empty() && !upload("model.safetensors", m))
        return save_cursor(), false;
  }
  if (cursor_.state != status) {
    const auto a = http_->post(
        "runs/update", {{"run_id", cursor_.run_id}, {"status", status}, {"end_time", now_ms()}});
    if (!a.ok()) return request_failed("the run's status", a.code, a.what());
    cursor_.state = status;
  }
  save_cursor();
  return end_sent_ = true;
}

bool RunSync::pump() {
  read_new();
  if (!ensure_run() || !settle_pending()) return false;
  while (!queue_.empty() && !stop_) {
    if (!send_batch()) return false;
    read_new();
  }
  bool ending;
  {
    std::lock_guard<std::mutex> l(mu_);
    ending = !end_state_.empty();
  }
  if (ending && queue_.empty() && !end_sent_) return send_end();
  return true;
}

void RunSync::loop() {
  while (!stop_) {
    const bool ok = pump();
    if (!report_.error.empty() || end_sent_) break;
    if (ok) {
      if (warned_down_)
        spdlog::info("[mlflow] {} answers again: records are flowing", o_.target.uri);
      warned_down_ = false;
      backoff_ = 1;
    } else if (!warned_down_) {
      spdlog::warn(
          "[mlflow] {} does not answer: training goes on; retrying with backoff up to "
          "{:.0f} s (`mltrain track push {}` sends what is left later)",
          o_.target.uri, kBackoffMax, o_.run_dir.string());
      warned_down_ = true;
    }
    std::unique_lock<std::mutex> l(mu_);
    const double wait = ok ? kInterval : backoff_;
    if (!ok) backoff_ = std::min(kBackoffMax, backoff_ * 2);
    // A success gathers records for kInterval (one request a second, however often the trainer
    // logs: the server's work per request, not per point, is what a co-located server takes from
    // training); a failure waits out the backoff. The end of the run cuts either short.
    cv_.wait_for(l, std::chrono::duration<double>(wait),
                 [&] { return stop_.load() || (!end_state_.empty() && ok); });
  }
  if (!report_.error.empty())
    spdlog::error("[mlflow] {}; training goes on (`mltrain track push {}` sends the records later)",
                  report_.error, o_.run_dir.string());
  done_ = true;
  cv_.notify_all();
}

void RunSync::start() {
  thread_ = std::thread([this] {
    // Below the training threads: on a full machine the records wait, not the steps.
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
    try {
      loop();
    } catch (const std::exception& e) {  // the sink never stops the training
      spdlog::error("[mlflow] sync stopped: {}", e.what());
      fail(e.what(), false);
      done_ = true;
      cv_.notify_all();
    }
  });
}

SyncReport RunSync::finish(const std::string& state, double seconds) {
  if (seconds < 0) seconds = o_.target.flush_seconds;
  {
    std::unique_lock<std::mutex> l(mu_);
    end_state_ = state;
    cv_.notify_all();
    if (thread_.joinable())
      cv_.wait_for(l, std::chrono::duration<double>(seconds), [&] { return done_.load(); });
  }
  stop_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  read_new();
  report_.left = static_cast<int64_t>(queue_.size());
  if (report_.left > 0 || !end_sent_)
    spdlog::warn(
        "[mlflow] {} record(s) not sent to {} within {:.0f} s; `mltrain track push {}` "
        "sends them",
        report_.left, o_.target.uri, seconds, o_.run_dir.string());
  return report_;
}

SyncReport RunSync::push(int attempts) {
  std::string state = o_.state;
  if (!state.empty()) {
  } else if (fs::exists(o_.run_dir / "status.json")) {
    const json s = json_or_null(read_file((o_.run_dir / "status.json").string()));
    if (s.is_object()) state = s.value("state", "");
  } else if (fs::exists(o_.run_dir / "summary.json")) {
    state = "finished";  // a finished tune study
  }
  end_state_ = state.empty() ? "running" : state;
  int failures = 0;
  for (double wait = 0.5; report_.error.empty();) {
    bool ok = false;
    try {
      ok = pump();
    } catch (const std::exception& e) {  // a 200 whose body is not MLflow's JSON, a full disk
      fail("MLflow at " + o_.target.uri + ": " + e.what(), false);
      break;
    }
    if (ok) {
      failures = 0;
      if (end_sent_) break;
      continue;
    }
    if (!report_.error.empty()) break;
    if (++failures >= attempts) {
      fail("MLflow at " + o_.target.uri + " did not answer after " + std::to_string(attempts) +
               " attempts",
           false);
      break;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    wait *= 2;
  }
  read_new();
  report_.left = static_cast<int64_t>(queue_.size());
  return report_;
}

}  // namespace mltrain::track
