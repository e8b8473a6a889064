#include "mltrain/tune/array.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/process.hpp"

namespace fs = std::filesystem;

namespace mltrain::tune {
namespace {

constexpr long kTmpfsMagic = 0x01021994, kRamfsMagic = 0x858458f6;

bool under(const fs::path& p, const std::string& root) {
  if (root.empty()) return false;
  const auto r = fs::weakly_canonical(root).string();
  const auto s = p.string();
  return s == r || s.rfind(r + "/", 0) == 0;
}

}  // namespace

void check_shared_study_dir(const StudyConfig& cfg, bool allow_local) {
  const fs::path dir = fs::weakly_canonical(fs::absolute(cfg.study_dir()));
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path probe = dir / ".array-probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0)
    throw ConfigError("study.dir", "cannot write in " + dir.string() + ": " + std::strerror(errno),
                      "point study.dir at a writable folder on a shared file system");
  const bool lock_ok = ::flock(fd, LOCK_EX) == 0;
  ::close(fd);
  fs::remove(probe, ec);
  if (!lock_ok)
    throw ConfigError("study.dir",
                      dir.string() + " does not support flock, which the shared journal needs",
                      "use a file system with flock (local, NFS v4, Lustre with -o flock)");
  if (allow_local) return;
  struct statfs st {};
  const bool ram = ::statfs(dir.c_str(), &st) == 0 &&
                   (long(st.f_type) == kTmpfsMagic || long(st.f_type) == kRamfsMagic);
  const char* tmp = std::getenv("TMPDIR");
  if (ram || under(dir, "/tmp") || under(dir, "/var/tmp") || under(dir, "/dev/shm") ||
      under(dir, tmp ? tmp : ""))
    throw ConfigError("study.dir",
                      dir.string() + " is node-local (" + (ram ? "a tmpfs" : "a temporary folder") +
                          "): array tasks on other nodes would each see their own journal",
                      "put study.dir on a file system every node mounts (home, project or "
                      "scratch), or pass --allow-local-journal when every task runs on this node");
}

std::string write_array_script(const StudyConfig& cfg, const ArrayOptions& o) {
  check_slurm_time("--time", o.time, 0);  // before anything is written; no checkpoint signal
  const fs::path dir = fs::absolute(cfg.study_dir());
  const fs::path out = dir / "tune-array.sbatch";
  const int cpus = o.cpus_per_task > 0
                       ? o.cpus_per_task
                       : std::max(1, cfg.max_concurrent() * std::max(1, cfg.threads()));
  std::ostringstream s;
  s << "#!/bin/bash\n"
    << "# Written by `mltrain tune --slurm-array`. Submit: sbatch " << shell_quote(out.string())
    << "\n"
    << "# " << o.tasks << " drivers of study '" << cfg.name() << "' on the shared journal "
    << shell_quote((dir / "journal.jsonl").string()) << ".\n"
    << "#SBATCH --job-name=tune-" << cfg.name() << "\n"
    << "#SBATCH --array=0-" << o.tasks - 1 << "\n"
    << "#SBATCH --ntasks=1\n"
    << "#SBATCH --cpus-per-task=" << cpus << "\n"
    << "#SBATCH --time=" << o.time << "\n";
  if (!o.partition.empty()) s << "#SBATCH --partition=" << o.partition << "\n";
  s << "#SBATCH --requeue                # a requeued task resumes the study\n"
    << "#SBATCH --open-mode=append\n"
    << "#SBATCH --output=" << dir.string() << "/slurm-%A_%a.out\n"
    << "#SBATCH --chdir=" << o.workdir << "\n\n"
    << "echo \"array task ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID} restart "
       "${SLURM_RESTART_COUNT:-0} on $(hostname) ($(date -Is))\"\n"
    << "# exec: Slurm's SIGTERM (scancel, preemption) reaches the driver, which hands its running\n"
    << "# trials back to the study before it exits.\n"
    << "exec " << shell_quote(o.mltrain) << " tune " << shell_quote(o.study_file);
  for (const auto& ov : o.overrides) s << " " << shell_quote(ov);
  s << " " << shell_quote("study.dir=" + fs::absolute(cfg.dir()).string()) << " --quiet\n";
  fs::create_directories(dir);
  write_file_atomic(out.string(), s.str());
  fs::permissions(out, fs::perms::owner_exec, fs::perm_options::add);
  return out.string();
}

}  // namespace mltrain::tune
