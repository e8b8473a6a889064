#include "mltrain/core/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

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

}  // namespace mltrain
