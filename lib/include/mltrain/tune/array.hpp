#pragma once
// `mltrain tune STUDY.yaml --slurm-array N [--time T] [--partition P] [--cpus-per-task C]
// [--submit]`: a Slurm array job of N tasks, each a study driver on the one shared journal. The
// journal's flock'd transactions hand every trial to exactly one driver; a cancelled or requeued
// task's driver marks its running trials stale on SIGTERM (or, killed outright, they go stale by
// heartbeat), and another driver retries them (study.max_retry), so nothing is lost or run twice.
// A requeued task is the same command again: it resumes the study.
//
//   check_shared_study_dir(cfg, false);                    // ConfigError for node-local folders
//   auto path = write_array_script(cfg, {.tasks = 4, ...});
#include <string>
#include <vector>

#include "mltrain/tune/study.hpp"

namespace mltrain::tune {

struct ArrayOptions {
  int tasks = 2;
  std::string time = "01:00:00", partition;
  int cpus_per_task = 0;                     // 0: study.max_concurrent x trial.threads
  std::string mltrain, study_file, workdir;  // absolute
  std::vector<std::string> overrides;        // the command line's, passed on to every task
  bool allow_local = false;                  // the study folder may be node-local
};

// The study folder must be one every node sees: a tmpfs/ramfs folder, or one under /tmp,
// /var/tmp, /dev/shm or $TMPDIR, is node-local on clusters (ConfigError naming study.dir, exit 2)
// unless allow_local (every task on this node). Also checks that the folder is writable and that
// flock works on it (some NFS mounts refuse it).
void check_shared_study_dir(const StudyConfig& cfg, bool allow_local);

// Writes <study dir>/tune-array.sbatch and returns its path; a --time sbatch would refuse is a
// ConfigError (exit 2) before anything is written.
std::string write_array_script(const StudyConfig& cfg, const ArrayOptions& o);

}  // namespace mltrain::tune
