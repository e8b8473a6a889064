#pragma once
// `mltrain slurm CONFIG --nodes N --ntasks-per-node G --time T [--partition P] [--submit]`: a
// readable sbatch script that runs `srun mltrain train CONFIG ...` with --signal=USR1@90,
// --requeue and --open-mode=append. On the signal (or a preemption's or the time limit's SIGTERM,
// reaching the tasks directly or through the batch shell, which forwards it) every rank stops at the
// same step boundary, rank 0 checkpoints and asks the batch shell to run `scontrol requeue`, and
// the requeued job resumes from that checkpoint (distributed.max_requeues caps it). The
// scenarios, each a test on a real Slurm: tests/cli/test_cli_preempt.cpp.
#include <cstdint>
#include <string>
#include <vector>

namespace mltrain::dist {

struct SbatchOptions {
  std::string job_name, mltrain, config, workdir, output, log_dir;  // absolute paths
  std::vector<std::string> overrides;
  int nodes = 1, ntasks_per_node = 1;
  std::string time = "01:00:00", partition;
  int signal_lead_s = 90;
};

std::string sbatch_script(const SbatchOptions& o);

// What sbatch would refuse, or a job that could never checkpoint, as a ConfigError (exit 2) naming
// the flag: --nodes / --ntasks-per-node below 1, --signal-lead outside sbatch's 1-65535 s, a
// --time sbatch does not take or no longer than the signal's lead (core/process.hpp).
void check_sbatch_options(const SbatchOptions& o);

// After a stop signal's checkpoint, under `mltrain slurm`'s batch script (SLURM_JOB_ID and
// MLTRAIN_SLURM_REQUEUE set): puts the job back in the queue, unless it has already been requeued
// max_requeues times (SLURM_RESTART_COUNT). With MLTRAIN_REQUEUE_FILE (the batch script sets it)
// it writes that file and the batch shell requeues; otherwise it runs `scontrol requeue` itself.
// Returns what it did for status.json ("" when not under Slurm requeue).
std::string requeue_after_checkpoint(int64_t max_requeues, int64_t step);

}  // namespace mltrain::dist
