#include "mltrain/train/checkpoint.hpp"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <fstream>

#include "mltrain/core/checked.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fault.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/json.hpp"
#include "mltrain/core/sha256.hpp"

namespace fs = std::filesystem;

namespace mltrain::train {

namespace {
int64_t step_of(const fs::path& p) {
  const std::string n = p.filename().string();
  if (n.rfind("step_", 0) != 0) return -1;
  const std::string digits = n.substr(5);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  int64_t step = -1;  // from_chars: a name too long for int64 is not a checkpoint, not a throw
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  return r.ec == std::errc() && r.ptr == digits.data() + digits.size() ? step : -1;
}
}  // namespace

CheckpointStore::CheckpointStore(fs::path root, CheckpointPolicy policy)
    : root_(std::move(root)), policy_(policy) {
  fs::create_directories(root_);
}

fs::path CheckpointStore::save(int64_t step,
                               const std::function<void(const fs::path&)>& write_files,
                               const nlohmann::json& trainer_state, std::optional<double> monitor) {
  try {
    return save_unchecked(step, write_files, trainer_state, monitor);
  } catch (const RuntimeError& e) {
    // Ours (a refused non-finite weight, a failed write with its own fix): the same error, plus
    // what the user most needs to know, that nothing older is lost.
    throw RuntimeError(e.where(), e.message() + "; " + kept_text(step), e.fix());
  } catch (const fs::filesystem_error& e) {  // a full disk, a read-only folder, a failed rename
    throw RuntimeError(root_.string(),
                       "checkpoint at step " + std::to_string(step) + " not written: " +
                           e.code().message() + " (" + e.path1().string() + "); " + kept_text(step),
                       "free disk space (or make the folder writable), then run the same command "
                       "again: it resumes from the latest intact checkpoint");
  }
}

// The new checkpoint is written beside the old ones, which `latest` still names.
std::string CheckpointStore::kept_text(int64_t step) const {
  std::vector<fs::path> all;
  try {
    all = complete();
  } catch (const std::exception&) {
  }
  while (!all.empty() && step_of(all.back()) >= step) all.pop_back();
  return all.empty() ? "no earlier checkpoint exists"
                     : "the previous checkpoint " + all.back().filename().string() + " is intact";
}

fs::path CheckpointStore::save_unchecked(int64_t step,
                                         const std::function<void(const fs::path&)>& write_files,
                                         const nlohmann::json& trainer_state,
                                         std::optional<double> monitor) {
  const fs::path final_dir = root_ / ("step_" + std::to_string(step));
  const fs::path tmp = root_ / ("step_" + std::to_string(step) + ".partial");
  remove_tree(tmp);
  fs::create_directories(tmp);
  write_files(tmp);
  nlohmann::json ts = trainer_state;
  ts["step"] = step;
  if (monitor && std::isfinite(*monitor)) ts["monitor"] = *monitor;  // a NaN is never "best"
  write_file_atomic((tmp / "trainer.json").string(), ts.dump(2) + "\n");
  nlohmann::json manifest;
  manifest["format"] = "mltrain-checkpoint-1";
  manifest["step"] = step;
  for (const auto& e : fs::directory_iterator(tmp)) {
    const std::string name = e.path().filename().string();
    if (name == "manifest.json" || name.find(".tmp.") != std::string::npos) continue;
    manifest["files"][name] = {{"sha256", sha256_file(e.path().string())},
                               {"bytes", fs::file_size(e.path())}};
  }
  write_file_atomic((tmp / "manifest.json").string(),
                    manifest.dump(2) + "\n");  // completeness marker
  remove_tree(final_dir);
  fault::at("ckpt.folder_rename");
  fs::rename(tmp, final_dir);
  fault::at("ckpt.folder_renamed");
  fsync_dir(root_.string());
  write_file_atomic((root_ / "latest").string(), final_dir.filename().string() + "\n");
  prune();
  return final_dir;
}

std::string CheckpointStore::verify(const fs::path& dir) {
  const fs::path mpath = dir / "manifest.json";
  if (!fs::exists(mpath)) return "no manifest.json (the write did not complete)";
  nlohmann::json manifest;
  try {
    std::ifstream in(mpath);
    manifest = nlohmann::json::parse(in);
  } catch (const std::exception&) {
    return "manifest.json does not parse";
  }
  if (!manifest.is_object() || !manifest.contains("files") || !manifest["files"].is_object())
    return "manifest.json lists no files";
  try {  // wrongly typed fields make the checkpoint damaged (the caller falls back), never a throw
    for (auto it = manifest["files"].begin(); it != manifest["files"].end(); ++it) {
      if (!is_plain_file_name(it.key()))
        return "manifest.json names '" + it.key() + "', not a file of this folder";
      const fs::path f = dir / it.key();
      // error_code forms: a name the file system refuses (too long, say) is a missing file,
      // not a filesystem_error out of verify()
      std::error_code ec;
      if (!fs::is_regular_file(f, ec)) return it.key() + " is missing";
      const auto size = fs::file_size(f, ec);
      if (ec) return it.key() + " cannot be read (" + ec.message() + ")";
      if (size != json_uint(it.value().at("bytes")))
        return it.key() + " has the wrong size (truncated?)";
      if (sha256_file(f.string()) != it.value().at("sha256").get<std::string>())
        return it.key() + " fails its SHA-256 check";
    }
  } catch (const nlohmann::json::exception&) {
    return "manifest.json has malformed entries";
  }
  for (const char* need : {"model.safetensors", "trainer.json"})
    if (!manifest["files"].contains(need)) return std::string(need) + " is not in the manifest";
  return "";
}

LoadedCheckpoint CheckpointStore::load_dir(const fs::path& dir) {
  if (!fs::is_directory(dir))
    throw CheckpointError(dir.string(), "not a checkpoint folder",
                          "pass a checkpoints/step_<N> folder");
  const std::string why = verify(dir);
  if (!why.empty())
    throw CheckpointError(dir.string(), "damaged checkpoint: " + why,
                          "resume from an older checkpoint folder");
  LoadedCheckpoint ck;
  ck.dir = dir;
  try {
    std::ifstream in(dir / "trainer.json");
    ck.trainer_state = nlohmann::json::parse(in);
    ck.step = json_int(ck.trainer_state.at("step"));
  } catch (const std::exception&) {
    throw CheckpointError((dir / "trainer.json").string(), "malformed trainer state");
  }
  return ck;
}

std::vector<fs::path> CheckpointStore::remove_leftovers(const fs::path& run_dir) {
  std::vector<fs::path> removed;
  auto dead_writer = [](const std::string& name) {  // "<name>.tmp.<pid>" of a process that is gone
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos) return false;
    const char* p = name.data() + at + 5;
    const char* e = name.data() + name.size();
    pid_t pid = 0;
    const auto r = std::from_chars(p, e, pid);
    return r.ec == std::errc() && r.ptr == e && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
  };
  for (const fs::path& dir : {run_dir, run_dir / "checkpoints"}) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    std::vector<fs::path> doomed;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      const bool partial = e.is_directory() && name.rfind("step_", 0) == 0 && name.size() > 8 &&
                           name.compare(name.size() - 8, 8, ".partial") == 0;
      // A step_<N> folder without its manifest is one a killed prune had begun to remove (save
      // renames a folder only after its manifest is written).
      const bool half_pruned = dir == run_dir / "checkpoints" && e.is_directory() &&
                               step_of(e.path()) >= 0 && !fs::exists(e.path() / "manifest.json");
      if (partial || half_pruned || (e.is_regular_file() && dead_writer(name)))
        doomed.push_back(e.path());
    }
    for (const auto& p : doomed)
      if (remove_tree(p, ec) > 0) removed.push_back(p);
  }
  return removed;
}

std::vector<fs::path> CheckpointStore::list_complete(const fs::path& root) {
  std::vector<fs::path> out;
  if (!fs::exists(root)) return out;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && step_of(e.path()) >= 0 && fs::exists(e.path() / "manifest.json"))
      out.push_back(e.path());
  std::sort(out.begin(), out.end(),
            [](const fs::path& a, const fs::path& b) { return step_of(a) < step_of(b); });
  return out;
}

std::optional<LoadedCheckpoint> CheckpointStore::load_latest(
    std::vector<std::string>* warnings) const {
  // The newest intact folder, not the one `latest` names: a run killed after a folder's rename
  // but before the swap of `latest` has a newer complete checkpoint than `latest` says.
  std::vector<fs::path> dirs;
  for (const auto& e : fs::exists(root_) ? fs::directory_iterator(root_) : fs::directory_iterator())
    if (e.is_directory() && step_of(e.path()) >= 0) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end(),
            [](const fs::path& a, const fs::path& b) { return step_of(a) > step_of(b); });
  for (const auto& d : dirs) {
    const std::string why = verify(d);
    if (why.empty()) return load_dir(d);
    if (warnings)
      warnings->push_back(d.string() + ": " + why + "; falling back to an older checkpoint");
  }
  return std::nullopt;
}

void CheckpointStore::prune() const {
  auto all = complete();
  std::vector<fs::path> keep;
  const int64_t n = static_cast<int64_t>(all.size());
  for (int64_t i = std::max<int64_t>(0, n - std::max<int64_t>(1, policy_.keep_last)); i < n; ++i)
    keep.push_back(all[i]);
  std::vector<std::pair<double, fs::path>> scored;
  for (const auto& d : all) {
    try {
      std::ifstream in(d / "trainer.json");
      auto j = nlohmann::json::parse(in);
      if (j.contains("monitor")) scored.emplace_back(j["monitor"].get<double>(), d);
    } catch (const std::exception&) {
    }
  }
  std::stable_sort(scored.begin(), scored.end(), [&](auto& a, auto& b) {
    return policy_.maximize ? a.first > b.first : a.first < b.first;
  });
  for (int64_t i = 0; i < std::min<int64_t>(policy_.keep_best, scored.size()); ++i)
    keep.push_back(scored[i].second);
  for (const auto& d : all) {
    if (std::find(keep.begin(), keep.end(), d) != keep.end()) continue;
    // The manifest goes first: a folder half-removed by a kill is incomplete, never "damaged".
    fs::remove(d / "manifest.json");
    fsync_dir(d.string());
    fault::at("ckpt.prune");
    remove_tree(d);
  }
}

}  // namespace mltrain::train
