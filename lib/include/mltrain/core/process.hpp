#pragma once
// Child processes for `mltrain tune` trials and `mltrain launch` workers (no LibTorch).
//
//   int out = -1;
//   pid_t pid = spawn_child({"/bin/echo", "hi"}, environment_with({"A=1"}), &out, /*stderr_path=*/"");
//   // read `out` until EOF; waitpid(pid, ...)
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace mltrain {

// The running binary (/proc/self/exe), for re-executing mltrain; "mltrain" when unreadable.
std::string self_exe();

// This process's environment with `set` ("KEY=value") replacing or adding entries.
std::vector<std::string> environment_with(const std::vector<std::string>& set);

// fork + exec (PATH searched) with PR_SET_PDEATHSIG(SIGKILL), so the child never outlives its
// parent, even a SIGKILLed one. The child's stdout goes to a pipe whose read end is returned in
// *stdout_fd; its stderr to stderr_path (truncated first), or to the same pipe when empty.
// own_group: the child leads a new process group (signal it and its children with kill(-pid)).
pid_t spawn_child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                  int* stdout_fd, const std::string& stderr_path, bool own_group);

// A word for a POSIX shell: as it is when it needs no quoting, else in single quotes.
std::string shell_quote(const std::string& s);

// `sbatch --parsable SCRIPT`: the job id; RuntimeError (exit 1) with sbatch's output when it fails.
std::string sbatch_submit(const std::string& script);

// A time limit as sbatch's --time takes it: "minutes", "minutes:seconds", "hours:minutes:seconds",
// "days-hours", "days-hours:minutes", "days-hours:minutes:seconds" (each field digits; Slurm adds
// them as they are, so "90:00" is 90 minutes), or UNLIMITED / INFINITE / -1. Its length in
// seconds, 0 for no limit (as Slurm reads a limit of 0); std::nullopt where sbatch refuses it.
std::optional<long long> slurm_time_seconds(const std::string& t);

// For `mltrain slurm --time` and `mltrain tune --slurm-array --time`, before any script is
// written: ConfigError (exit 2) naming `flag` unless `t` is a limit sbatch takes and, when it is
// finite, longer than `signal_lead_s` (the checkpoint signal's lead; 0 when there is none).
void check_slurm_time(const std::string& flag, const std::string& t, int signal_lead_s);

}  // namespace mltrain
