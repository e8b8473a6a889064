#include "mltrain/core/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "mltrain/core/error.hpp"

extern char** environ;

namespace mltrain {

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : "mltrain";
}

std::vector<std::string> environment_with(const std::vector<std::string>& set) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& s : set)
      replaced |= kv.compare(0, s.find('=') + 1, s, 0, s.find('=') + 1) == 0;
    if (!replaced) env.push_back(kv);
  }
  env.insert(env.end(), set.begin(), set.end());
  return env;
}

pid_t spawn_child(const std::vector<std::string>& argv_in, const std::vector<std::string>& env_in,
                  int* stdout_fd, const std::string& stderr_path, bool own_group) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0)
    throw RuntimeError("spawn", std::string("pipe: ") + std::strerror(errno));
  const int errfd = stderr_path.empty() ? -1
                                        : ::open(stderr_path.c_str(),
                                                 O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  std::vector<std::string> argv = argv_in, env = env_in;
  std::vector<char*> av, ev;
  for (auto& s : argv) av.push_back(s.data());
  av.push_back(nullptr);
  for (auto& s : env) ev.push_back(s.data());
  ev.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw RuntimeError("spawn", std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    if (own_group) ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
    ::dup2(p[1], STDOUT_FILENO);
    ::dup2(errfd >= 0 ? errfd : p[1], STDERR_FILENO);
    ::execvpe(av[0], av.data(), ev.data());
    std::fprintf(stderr, "cannot run %s: %s\n", av[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(p[1]);
  if (errfd >= 0) ::close(errfd);
  *stdout_fd = p[0];
  return pid;
}

}  // namespace mltrain

namespace mltrain {

std::string shell_quote(const std::string& s) {
  if (!s.empty() &&
      s.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") ==
          std::string::npos)
    return s;
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

std::string sbatch_submit(const std::string& script) {
  const std::string cmd = "sbatch --parsable " + shell_quote(script) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char b[512];
  while (p && std::fgets(b, sizeof b, p)) out += b;
  const int st = p ? ::pclose(p) : -1;
  if (st != 0)
    throw RuntimeError("sbatch",
                       "submission failed: " + (p ? out : std::string("cannot run sbatch")),
                       "check `sinfo`, the partition and the time limit; the script is " + script);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::optional<long long> slurm_time_seconds(const std::string& t) {
  std::string up;
  for (char c : t) up += char(std::toupper(static_cast<unsigned char>(c)));
  if (up == "UNLIMITED" || up == "INFINITE" || up == "-1") return 0;
  auto number = [](const std::string& s) -> std::optional<long long> {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    return std::stoll(s);
  };
  // "[days-]a[:b[:c]]"; "days-" alone, which sbatch also takes, is days-0.
  const auto dash = t.find('-');
  const std::string clock = dash == std::string::npos ? t : t.substr(dash + 1);
  std::vector<long long> f;
  for (size_t from = 0; !clock.empty();) {
    const auto colon = clock.find(':', from);
    const auto v = number(clock.substr(from, colon - from));
    if (!v || f.size() == 3) return std::nullopt;
    f.push_back(*v);
    if (colon == std::string::npos) break;
    from = colon + 1;
  }
  if (dash == std::string::npos) {
    if (f.empty()) return std::nullopt;
    if (f.size() == 3) return f[0] * 3600 + f[1] * 60 + f[2];  // hours:minutes:seconds
    return f[0] * 60 + (f.size() == 2 ? f[1] : 0);             // minutes[:seconds]
  }
  const auto days = number(t.substr(0, dash));
  if (!days) return std::nullopt;
  f.resize(3, 0);  // days-hours[:minutes[:seconds]]
  return *days * 86400 + f[0] * 3600 + f[1] * 60 + f[2];
}

void check_slurm_time(const std::string& flag, const std::string& t, int signal_lead_s) {
  const auto s = slurm_time_seconds(t);
  if (!s)
    throw ConfigError(flag, "'" + t + "' is not a time limit sbatch takes",
                      "give minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]] (e.g. 04:00:00 or "
                      "2-00:00:00), or UNLIMITED");
  if (*s > 0 && *s <= signal_lead_s)
    throw ConfigError(flag,
                      "'" + t + "' (" + std::to_string(*s) +
                          " s) is not longer than the checkpoint signal's lead (--signal-lead " +
                          std::to_string(signal_lead_s) + " s): USR1 would come before any work",
                      "give a longer --time or a shorter --signal-lead");
}

}  // namespace mltrain
