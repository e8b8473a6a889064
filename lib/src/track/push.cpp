// `mltrain track push`: run folders and tune studies replayed into MLflow with the live sink's
// cursor (track/mlflow.hpp), so a push after a live run, or twice, sends nothing twice.
#include <algorithm>
#include <atomic>
#include <thread>
#include <fstream>
#include <map>

#include <spdlog/spdlog.h>

#include "mltrain/core/error.hpp"
#include "mltrain/track/mlflow.hpp"

namespace fs = std::filesystem;

namespace mltrain::track {

namespace {

bool is_run(const fs::path& d) {
  return fs::exists(d / "metrics.jsonl") || fs::exists(d / "status.json");
}
bool is_study(const fs::path& d) {
  return fs::exists(d / "study.yaml") && fs::is_directory(d / "trials");
}

std::vector<fs::path> sorted_dirs(const fs::path& d) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(d, ec))
    if (e.is_directory()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

SyncOptions options_for_run(const fs::path& dir, const MlflowTarget& target) {
  SyncOptions o{.target = target,
                .run_dir = dir,
                .run_name = dir.parent_path().filename().string() + "/" + dir.filename().string()};
  if (o.target.experiment.empty()) o.target.experiment = dir.parent_path().filename().string();
  return o;
}

std::vector<std::pair<fs::path, SyncReport>> push_folders(const std::vector<fs::path>& dirs,
                                                          const MlflowTarget& target, int jobs) {
  struct Job {
    SyncOptions o;
    int parent = -1;  // index of the study's job whose run id this one waits for
    bool is_parent = false;
  };
  std::vector<Job> todo;
  for (const fs::path& given : dirs) {
    const fs::path d = fs::absolute(given).lexically_normal();
    if (!fs::is_directory(d))
      throw ConfigError(given.string(), "not a folder",
                        "give run folders (runs/<name>/v<N>), a run's name folder, or a tune "
                        "study folder");
    if (is_run(d)) {
      todo.push_back({options_for_run(d, target)});
    } else if (is_study(d)) {
      // The study is a parent run; each trial's folders are its children.
      SyncOptions parent{.target = target, .run_dir = d, .run_name = d.filename().string()};
      if (parent.target.experiment.empty()) parent.target.experiment = d.filename().string();
      parent.tags["mltrain.study"] = d.filename().string();
      const int p = static_cast<int>(todo.size());
      todo.push_back({parent, -1, true});
      // A trial's end from the study's journal: pruned trials ended as planned (FINISHED, with
      // their state as a tag), failed ones FAILED.
      std::map<std::string, std::string> states;
      std::ifstream journal(d / "journal.jsonl");
      for (std::string line; std::getline(journal, line);) try {
          const auto j = nlohmann::json::parse(line);
          if (j.value("op", "") == "finish") states[j.at("trial").dump()] = j.value("state", "");
        } catch (const std::exception&) {
        }
      for (const fs::path& trial : sorted_dirs(d / "trials"))
        for (const fs::path& v : sorted_dirs(trial)) {
          if (!is_run(v)) continue;
          SyncOptions o{.target = parent.target,
                        .run_dir = v,
                        .run_name = d.filename().string() + "/" + trial.filename().string()};
          if (v.filename() != "v0") o.run_name += "/" + v.filename().string();
          o.tags["mltrain.study"] = d.filename().string();
          o.tags["mltrain.trial"] = trial.filename().string().substr(1);
          const std::string number = std::to_string(std::stoll(o.tags["mltrain.trial"]));
          if (const auto it = states.find(number); it != states.end()) {
            o.tags["mltrain.trial_state"] = it->second;
            o.state = it->second == "FAIL" ? "failed" : "finished";
          }
          todo.push_back({o, p});
        }
    } else {
      bool any = false;
      for (const fs::path& v : sorted_dirs(d))
        if (is_run(v)) {
          todo.push_back({options_for_run(v, target)});
          any = true;
        }
      if (!any)
        throw ConfigError(given.string(), "holds no run (metrics.jsonl, status.json) and no study",
                          "give run folders (runs/<name>/v<N>), a run's name folder, or a tune "
                          "study folder");
    }
  }
  std::vector<std::pair<fs::path, SyncReport>> out(todo.size());
  auto push_one = [&](size_t i) {
    Job& j = todo[i];
    out[i].first = j.o.run_dir;
    if (j.parent >= 0) {
      if (out[j.parent].second.run_id.empty()) {
        out[i].second.error = "its study's run was not pushed";
        return;
      }
      j.o.parent_run_id = out[j.parent].second.run_id;
    }
    RunSync sync(j.o);
    out[i].second = sync.push();
  };
  // Studies' runs first (their children need the id), then the rest, `jobs` folders at a time:
  // the server, not mltrain, is what a push waits on.
  for (size_t i = 0; i < todo.size(); ++i)
    if (todo[i].is_parent) push_one(i);
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, jobs); ++t)
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < todo.size();)
        if (!todo[i].is_parent) push_one(i);
    });
  for (auto& t : pool) t.join();
  return out;
}

}  // namespace mltrain::track
