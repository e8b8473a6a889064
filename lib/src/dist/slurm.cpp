#include "mltrain/dist/slurm.hpp"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <sstream>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/process.hpp"

namespace mltrain::dist {

void check_sbatch_options(const SbatchOptions& o) {
  if (o.nodes < 1) throw ConfigError("--nodes", "must be at least 1");
  if (o.ntasks_per_node < 1) throw ConfigError("--ntasks-per-node", "must be at least 1");
  if (o.signal_lead_s < 1 || o.signal_lead_s > 65535)
    throw ConfigError("--signal-lead", "must be between 1 and 65535 s (sbatch's range)");
  check_slurm_time("--time", o.time, o.signal_lead_s);
}

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
    << R"(set -uo pipefail
# A stop signal that reaches this shell (--signal=B:USR1@..., scancel -b, the time limit's or a
# preemption's SIGTERM) goes on to the job's steps, and the shell waits for srun, so the
# checkpoint is written before the job ends. Through scancel, not srun: an srun whose step Slurm
# is already ending answers any signal by killing its tasks at once.
# An array task is named by its array id and index: its own SLURM_JOB_ID, for the array's last
# task, is also the whole array's id, and `scontrol requeue` on it requeues every task.
job=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}
job=${job:-$SLURM_JOB_ID}
srun_pid=
forward() {
  scancel --signal="$1" "$job" 2>/dev/null && return
  [ "$1" = USR1 ] && [ -n "$srun_pid" ] && kill -s USR1 "$srun_pid" 2>/dev/null
  true
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
trap 'forward INT' INT
# After a stop signal's checkpoint rank 0 asks for a requeue by writing this file, and this shell
# runs `scontrol requeue` (never more than distributed.max_requeues): the ranks need no scontrol,
# so it works when they run in a container (srun --container-image).
export MLTRAIN_SLURM_REQUEUE=1
export MLTRAIN_REQUEUE_FILE="$PWD/.mltrain-requeue-$SLURM_JOB_ID"
rm -f "$MLTRAIN_REQUEUE_FILE"
)";
  if (o.nodes > 1)
    s << "# Rank 0 serves the rendezvous on the first node, where this script runs: its own host "
         "name\n"
      << "# resolves even where Slurm's node names (SLURM_JOB_NODELIST) are not DNS names.\n"
      << "export MASTER_ADDR=${MASTER_ADDR:-$(hostname)}\n";
  s << "echo \"job $SLURM_JOB_ID restart ${SLURM_RESTART_COUNT:-0} on $SLURM_JOB_NODELIST ($(date "
       "-Is))\"\n"
    << "srun --kill-on-bad-exit=1 " << shell_quote(o.mltrain) << " train " << shell_quote(o.config);
  for (const auto& ov : o.overrides) s << " " << shell_quote(ov);
  s << R"( &
srun_pid=$!
# wait returns early when a trapped signal arrives; srun is still running then.
while kill -0 "$srun_pid" 2>/dev/null; do wait "$srun_pid"; done
wait "$srun_pid"
status=$?
if [ -f "$MLTRAIN_REQUEUE_FILE" ]; then
  rm -f "$MLTRAIN_REQUEUE_FILE"
  if command -v scontrol >/dev/null; then
    scontrol requeue "$job" && echo "requeued job $job"
  else
    echo "mltrain: no scontrol on this node to requeue job $job: submit this script again to resume" >&2
  fi
fi
exit $status
)";
  return s.str();
}

std::string requeue_after_checkpoint(int64_t max_requeues, int64_t step) {
  const char* id = std::getenv("SLURM_JOB_ID");
  if (!id || !std::getenv("MLTRAIN_SLURM_REQUEUE")) return "";
  // An array task by array id and index (its own id may also be the whole array's).
  const char* array = std::getenv("SLURM_ARRAY_JOB_ID");
  const char* index = std::getenv("SLURM_ARRAY_TASK_ID");
  const std::string spec = array && index ? std::string(array) + "_" + index : std::string(id);
  const char* job = spec.c_str();
  const char* rc = std::getenv("SLURM_RESTART_COUNT");
  const int64_t restarts = rc ? std::atoll(rc) : 0;
  if (restarts >= max_requeues) {
    spdlog::warn(
        "[slurm] job {} already requeued {} times (distributed.max_requeues): not requeueing; "
        "submit it again to resume from step {}",
        job, restarts, step);
    return "requeue limit reached: job " + std::string(job) + " already requeued " +
           std::to_string(restarts) + " times (distributed.max_requeues); submit it again to " +
           "resume from step " + std::to_string(step);
  }
  const std::string what = "requeued job " + std::string(job) + " (restart " +
                           std::to_string(restarts + 1) + " of at most " +
                           std::to_string(max_requeues) + ")";
  // Under `mltrain slurm`'s script the batch shell requeues: it runs outside any container.
  if (const char* file = std::getenv("MLTRAIN_REQUEUE_FILE"); file && *file) {
    spdlog::warn(
        "[slurm] checkpoint saved at step {}; asking the batch script to requeue job {} "
        "(restart {} of at most {})",
        step, job, restarts + 1, max_requeues);
    try {
      write_file_atomic(file, "step " + std::to_string(step) + "\n");
      return what;
    } catch (const std::exception& e) {
      spdlog::error("[slurm] {}; trying scontrol here", e.what());
    }
  }
  spdlog::warn("[slurm] checkpoint saved at step {}; requeueing job {} (restart {} of at most {})",
               step, job, restarts + 1, max_requeues);
  const std::string cmd = std::string("scontrol requeue ") + job;
  if (std::system(cmd.c_str()) != 0) {
    spdlog::error("[slurm] `{}` failed; submit the job again to resume", cmd);
    return "requeue failed: submit the job again to resume from step " + std::to_string(step);
  }
  return what;
}

}  // namespace mltrain::dist
