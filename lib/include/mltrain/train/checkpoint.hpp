#pragma once
// Checkpoints that survive being killed at any instant.
//
//   CheckpointStore store(run_dir / "checkpoints", {.keep_last = 2, .keep_best = 1, .maximize = true});
//   store.save(step, files_writer, trainer_state_json, /*monitor=*/0.91);
//   if (auto ck = store.load_latest()) { ... ck->dir, ck->trainer_state ... }
//
// Layout: checkpoints/step_<N>/{model.safetensors, state.safetensors, trainer.json, manifest.json}.
// A checkpoint is written into step_<N>.partial/, every file by temp+fsync+rename; manifest.json
// (SHA-256 and size of every file) is written last; the folder is renamed to step_<N>; then
// `latest` is replaced atomically; only then are old checkpoints pruned (each one's manifest
// first). Loading takes the newest folder whose manifest verifies (`latest` is for people and tools)
// and falls back past damaged checkpoints with a warning.
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mltrain::train {

struct CheckpointPolicy {
  int64_t keep_last = 2;
  int64_t keep_best = 1;
  bool maximize = true;
};

struct LoadedCheckpoint {
  std::filesystem::path dir;
  int64_t step = 0;
  nlohmann::json trainer_state;
};

class CheckpointStore {
 public:
  CheckpointStore(std::filesystem::path root, CheckpointPolicy policy);

  // write_files(dir) writes the payload files into dir; returns the final checkpoint folder.
  std::filesystem::path save(int64_t step,
                             const std::function<void(const std::filesystem::path&)>& write_files,
                             const nlohmann::json& trainer_state, std::optional<double> monitor);

  // Newest complete and intact checkpoint; warnings go to `warnings`. nullopt when there is none.
  std::optional<LoadedCheckpoint> load_latest(std::vector<std::string>* warnings) const;
  // One specific folder; throws CheckpointError when it is incomplete or damaged.
  static LoadedCheckpoint load_dir(const std::filesystem::path& dir);
  static std::string verify(const std::filesystem::path& dir);  // "" when intact, else the reason

  std::vector<std::filesystem::path> complete() const {
    return list_complete(root_);
  }  // sorted by step, ascending
  // The same listing for any folder, creating nothing (for read-only viewers: runs, report).
  static std::vector<std::filesystem::path> list_complete(const std::filesystem::path& root);
  // Leftovers of a killed writer in a run folder and its checkpoints/: step_<N>.partial folders,
  // step_<N> folders a killed prune left without their manifest, and temp files (<name>.tmp.<pid>)
  // whose process is gone. Removes them, returns what it removed.
  static std::vector<std::filesystem::path> remove_leftovers(const std::filesystem::path& run_dir);
  const std::filesystem::path& root() const { return root_; }

 private:
  std::filesystem::path save_unchecked(
      int64_t step, const std::function<void(const std::filesystem::path&)>& write_files,
      const nlohmann::json& trainer_state, std::optional<double> monitor);
  std::string kept_text(int64_t step) const;
  void prune() const;
  std::filesystem::path root_;
  CheckpointPolicy policy_;
};

}  // namespace mltrain::train
