#pragma once
// Where a distributed run resumes, agreed by every rank, on shared or node-local storage. Ranks on
// node-local disks see different run folders and checkpoints: rank 0's run folder name is every
// rank's (under its own run.dir), each rank reports the newest intact checkpoint it holds, and all
// resume at the newest step any rank holds; ranks that lack it (named in the log) receive its
// files from the lowest rank that has it, written into their own checkpoints/ and verified by its
// manifest before loading. On shared storage every rank holds the same step and nothing is sent.
//
//   fs::path dir = agree_run_dir(comm, cfg, dir);                 // rank 0's folder name
//   std::optional<LoadedCheckpoint> ck = agree_on_resume(comm, dir, mine);
#include <filesystem>
#include <optional>

#include "mltrain/config/experiment.hpp"
#include "mltrain/train/checkpoint.hpp"

namespace mltrain::dist {
class Comm;
}

namespace mltrain::train {

// run.dir/run.name/<rank 0's version folder>.
std::filesystem::path agree_run_dir(dist::Comm& comm, const config::ExperimentConfig& cfg,
                                    const std::filesystem::path& mine);

// The checkpoint every rank resumes from (nullopt on every rank when none holds one).
std::optional<LoadedCheckpoint> agree_on_resume(dist::Comm& comm,
                                                const std::filesystem::path& run_dir,
                                                const std::optional<LoadedCheckpoint>& mine);

}  // namespace mltrain::train
