#include <nlohmann/json.hpp>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "mltrain/dist/nccl_check.hpp"

namespace fs = std::filesystem;

namespace mltrain::dist {
namespace {
fs::path helper() {
  std::error_code ec;
  const auto self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : self.parent_path() / "mltrain_nccl_check";
}
}  // namespace

bool nccl_compiled() {
  std::error_code ec;
  return fs::exists(helper(), ec);
}

NcclResult nccl_allreduce_check(double bytes, int iters, double timeout_s) {
  NcclResult r;
  r.bytes = bytes;
  const fs::path exe = helper();
  if (!nccl_compiled()) {
    r.error =
        "no mltrain_nccl_check beside this binary (built only with a CUDA LibTorch and nccl.h)";
    return r;
  }
  int fds[2];
  if (::pipe(fds) != 0) {
    r.error = "pipe() failed";
    return r;
  }
  const std::string b = std::to_string(static_cast<int64_t>(bytes)), it = std::to_string(iters);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execl(exe.c_str(), exe.c_str(), b.c_str(), it.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  const auto t0 = std::chrono::steady_clock::now();
  bool timed_out = false;
  for (;;) {
    const double left =
        timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left * 1000)) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (timed_out) {
    r.error = "the NCCL all-reduce did not finish within " +
              std::to_string(static_cast<int>(timeout_s)) + " s (hung; killed)";
    return r;
  }
  try {
    const auto j = nlohmann::json::parse(out.substr(out.find('{')));
    r.ok = j.value("ok", false);
    r.version = j.value("version", "");
    r.world = j.value("world", 0);
    r.seconds = j.value("seconds", 0.0);
    r.algbw_gbps = j.value("algbw_gbps", 0.0);
    r.busbw_gbps = j.value("busbw_gbps", 0.0);
    r.error = j.value("error", "");
  } catch (const std::exception&) {
    r.error = "mltrain_nccl_check exited with status " +
              std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)) +
              " and no report";
  }
  return r;
}

}  // namespace mltrain::dist
