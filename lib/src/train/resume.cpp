#include "mltrain/train/resume.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/dist/ddp.hpp"

namespace fs = std::filesystem;

namespace mltrain::train {

// A short string from `root` to every rank (a fixed 256-byte frame).
static std::string broadcast_text(dist::Comm& comm, const std::string& text, int root,
                                  const char* what) {
  torch::Tensor t = torch::zeros({256}, torch::kUInt8);
  if (comm.rank() == root) {
    if (text.size() >= 256)
      throw RuntimeError("run.name", "'" + text + "' is longer than 255 characters",
                         "use a shorter run.name");
    std::memcpy(t.data_ptr<uint8_t>(), text.data(), text.size());
  }
  std::vector<torch::Tensor> ts = {t};
  comm.broadcast(ts, root, what);
  return std::string(reinterpret_cast<const char*>(ts[0].data_ptr<uint8_t>()));
}

fs::path agree_run_dir(dist::Comm& comm, const config::ExperimentConfig& cfg,
                       const fs::path& mine) {
  const std::string leaf =
      broadcast_text(comm, mine.filename().string(), 0, "broadcast(run folder)");
  const fs::path dir = fs::path(cfg.run.dir) / cfg.run.name / leaf;
  if (dir != mine)
    spdlog::info("[checkpoint] rank {}: run folder {} (rank 0's), not {}", comm.rank(),
                 dir.string(), mine.string());
  return dir;
}

// One file of the checkpoint from `root` to every rank; the ranks in `write` store it under dir.
static void ship_file(dist::Comm& comm, int root, const fs::path& from, const fs::path& to,
                      bool write) {
  std::string bytes;
  torch::Tensor size = torch::zeros({1}, torch::kLong);
  if (comm.rank() == root) {
    bytes = read_file(from.string());
    size[0] = static_cast<int64_t>(bytes.size());
  }
  std::vector<torch::Tensor> s = {size};
  comm.broadcast(s, root, "broadcast(checkpoint file size)");
  const int64_t n = s[0][0].item<int64_t>();
  torch::Tensor data = torch::empty({n}, torch::kUInt8);
  if (comm.rank() == root) std::memcpy(data.data_ptr<uint8_t>(), bytes.data(), size_t(n));
  std::vector<torch::Tensor> d = {data};
  comm.broadcast(d, root, "broadcast(checkpoint file)");
  if (write)
    write_file_atomic(
        to.string(),
        std::string(reinterpret_cast<const char*>(d[0].data_ptr<uint8_t>()), size_t(n)));
}

std::optional<LoadedCheckpoint> agree_on_resume(dist::Comm& comm, const fs::path& run_dir,
                                                const std::optional<LoadedCheckpoint>& mine) {
  const int64_t my_step = mine ? mine->step : -1;
  std::vector<int64_t> steps;
  for (const auto& t :
       comm.allgather(torch::tensor({my_step}, torch::kLong), "allgather(newest checkpoint step)"))
    steps.push_back(t[0].item<int64_t>());
  const int64_t newest = *std::max_element(steps.begin(), steps.end());
  if (newest < 0) return std::nullopt;
  int root = 0;
  while (steps[size_t(root)] != newest) ++root;
  bool lacking = false;
  for (size_t r = 0; r < steps.size(); ++r)
    if (steps[r] != newest) {
      lacking = true;
      if (comm.rank() == 0)
        spdlog::warn(
            "[checkpoint] rank {} holds {} in its run folder: every rank resumes at step {}, its "
            "files sent from rank {}",
            r,
            steps[r] < 0 ? std::string("no intact checkpoint") : "step " + std::to_string(steps[r]),
            newest, root);
    }
  if (!lacking) return mine;
  // Every rank joins every broadcast; only those without the step keep the bytes.
  const std::string name = "step_" + std::to_string(newest);
  const fs::path root_dir = mine && comm.rank() == root ? mine->dir : fs::path();
  const fs::path partial = run_dir / "checkpoints" / (name + ".partial");
  const bool receive = my_step != newest;
  if (receive) fs::create_directories(partial);
  for (const char* f : {"model.safetensors", "state.safetensors", "trainer.json", "manifest.json"})
    ship_file(comm, root, root_dir / f, partial / f, receive);
  if (!receive) return mine;
  const fs::path final_dir = run_dir / "checkpoints" / name;
  if (fs::exists(final_dir)) remove_tree(final_dir);  // a damaged copy of the same step
  fs::rename(partial, final_dir);
  fsync_dir((run_dir / "checkpoints").string());
  write_file_atomic((run_dir / "checkpoints" / "latest").string(), name + "\n");
  spdlog::warn("[checkpoint] rank {}: received step {} from rank {} into {}", comm.rank(), newest,
               root, final_dir.string());
  return CheckpointStore::load_dir(final_dir);  // verifies every file against the manifest
}

}  // namespace mltrain::train
