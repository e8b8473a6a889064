#pragma once
// `mltrain slurm CONFIG --nodes N --ntasks-per-node G --time T [--partition P] [--submit]`: a
// readable sbatch script that runs `srun mltrain train CONFIG ...` with --signal=USR1@90,
// --requeue and --open-mode=append. On the signal (or a preemption's SIGTERM) every rank stops at
// the same step boundary, rank 0 checkpoints and runs `scontrol requeue $SLURM_JOB_ID`, and the
// requeued job resumes from that checkpoint (distributed.max_requeues caps it).
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

// After a stop signal's checkpoint, under `mltrain slurm`'s batch script (SLURM_JOB_ID and
// MLTRAIN_SLURM_REQUEUE set): puts the job back in the queue with `scontrol requeue`, unless it has
// already been requeued max_requeues times (SLURM_RESTART_COUNT). Logs what it did; no-op elsewhere.
void requeue_after_checkpoint(int64_t max_requeues, int64_t step);

}  // namespace mltrain::dist
