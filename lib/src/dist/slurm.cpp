#include "mltrain/dist/slurm.hpp"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <sstream>

#include "mltrain/core/process.hpp"

namespace mltrain::dist {

std::string sbatch_script(const SbatchOptions& o) {
  std::ostringstream s;
  s << "#!/bin/bash\n"
    << "# Written by `mltrain slurm`. Submit: sbatch "
    << shell_quote(o.output.empty() ? "this-file" : o.output) << "\n"
    << "#SBATCH --job-name=" << o.job_name << "\n"
    << "#SBATCH --nodes=" << o.nodes << "\n"
    << "#SBATCH --ntasks-per-node=" << o.ntasks_per_node << "\n"
    << "#SBATCH --time=" << o.time << "\n";
  if (!o.partition.empty()) s << "#SBATCH --partition=" << o.partition << "\n";
  s << "#SBATCH --signal=USR1@" << o.signal_lead_s << "   # USR1 to every task " << o.signal_lead_s
    << " s before the time limit: checkpoint, requeue, exit\n"
    << "#SBATCH --requeue                # the job may go back to the queue and start again\n"
    << "#SBATCH --open-mode=append       # a requeued run appends to the same log\n"
    << "#SBATCH --output=" << (o.log_dir.empty() ? o.workdir : o.log_dir) << "/slurm-%j.out\n"
    << "#SBATCH --chdir=" << o.workdir << "\n\n"
    << "set -euo pipefail\n"
    << "# mltrain requeues itself after its checkpoint on USR1/TERM (never more than "
       "distributed.max_requeues).\n"
    << "export MLTRAIN_SLURM_REQUEUE=1\n";
  if (o.nodes > 1)
    s << "# Rank 0 serves the rendezvous on the first node, where this script runs: its own host "
         "name\n"
      << "# resolves even where Slurm's node names (SLURM_JOB_NODELIST) are not DNS names.\n"
      << "export MASTER_ADDR=${MASTER_ADDR:-$(hostname)}\n";
  s << "echo \"job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} on $SLURM_JOB_NODELIST ($(date "
       "-Is))\"\n"
    << "# srun without --signal B: so the signal reaches the tasks, not just this shell.\n"
    << "srun --kill-on-bad-exit=1 " << shell_quote(o.mltrain) << " train " << shell_quote(o.config);
  for (const auto& ov : o.overrides) s << " " << shell_quote(ov);
  s << "\n";
  return s.str();
}

void requeue_after_checkpoint(int64_t max_requeues, int64_t step) {
  const char* job = std::getenv("SLURM_JOB_ID");
  if (!job || !std::getenv("MLTRAIN_SLURM_REQUEUE")) return;
  const char* rc = std::getenv("SLURM_RESTART_COUNT");
  const int64_t restarts = rc ? std::atoll(rc) : 0;
  if (restarts >= max_requeues) {
    spdlog::warn(
        "[slurm] job {} already requeued {} times (distributed.max_requeues): not requeueing", job,
        restarts);
    return;
  }
  spdlog::warn("[slurm] checkpoint saved at step {}; requeueing job {} (restart {} of at most {})",
               step, job, restarts + 1, max_requeues);
  const std::string cmd = std::string("scontrol requeue ") + job;
  if (std::system(cmd.c_str()) != 0)
    spdlog::error("[slurm] `{}` failed; resubmit the job to resume", cmd);
}

}  // namespace mltrain::dist
