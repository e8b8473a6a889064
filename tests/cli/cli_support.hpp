#pragma once
// Shared by the CLI tests (one file per command, tests/cli/test_cli_<command>.cpp, one ctest entry
// each): run the real `mltrain` binary, spawn and wait for it, fresh temp folders, small files.
#include <catch2/catch.hpp>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <zlib.h>

#include "temp_dir.hpp"

extern char** environ;
namespace fs = std::filesystem;

inline const std::string kBin = MLTRAIN_BIN;
inline const std::string kSrc = MLTRAIN_SOURCE_DIR;
// The project venv's Python (torch 2.15, numpy, scikit-learn: scripts/venv.sh).
inline const std::string kPython = kSrc + "/.venv/bin/python";
inline const std::string kFmnist = "/usr/share/datasets/fashion-mnist";

// The first of n consecutive loopback TCP ports that were free when asked (the kernel's pick for
// the first, each next one checked by binding it): rendezvous ports for tests, never fixed ones,
// so parallel ctest entries and leftovers from other runs cannot collide.
inline int free_ports(int n = 1) {
  auto bind_port = [](int port) {  // the bound socket's fd (port 0: the kernel picks), or -1
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    if (fd >= 0) ::close(fd);
    return -1;
  };
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int first = bind_port(0);
    REQUIRE(first >= 0);
    sockaddr_in a{};
    socklen_t len = sizeof a;
    ::getsockname(first, reinterpret_cast<sockaddr*>(&a), &len);
    const int port = ntohs(a.sin_port);
    std::vector<int> held{first};
    for (int k = 1; k < n && held.size() == size_t(k); ++k)
      if (const int fd = port + k < 65536 ? bind_port(port + k) : -1; fd >= 0) held.push_back(fd);
    const bool all = held.size() == size_t(n);
    for (const int fd : held) ::close(fd);
    if (all) return port;
  }
  FAIL("no " << n << " consecutive free loopback ports");
  return 0;
}

// Environment variables set for a scope and put back as they were (unset, or the old value) when it
// ends or restore() is called, also when a REQUIRE throws: one test case's hooks (MLTRAIN_TEST_*)
// never leak into the next.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<std::string, std::string>> vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_.push_back({k, old ? std::optional<std::string>(old) : std::nullopt});
      ::setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void restore() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it)
      it->second ? ::setenv(it->first.c_str(), it->second->c_str(), 1)
                 : ::unsetenv(it->first.c_str());
    saved_.clear();
  }
  ~ScopedEnv() { restore(); }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// The tiny MLP run most CLI tests start from: `mltrain train` on configs/fashion_mnist_mlp.yaml with
// `limit` real training images, writing under `dir` as run `name`; `extra` overrides follow.
inline std::string tiny_mlp(const fs::path& dir, const std::string& name, int64_t limit = 2048,
                            const std::string& extra = "") {
  return "train " + kSrc + "/configs/fashion_mnist_mlp.yaml run.dir=" + dir.string() +
         " run.name=" + name + " data.limit_train=" + std::to_string(limit) + " " + extra;
}

struct Result {
  int code;
  std::string out;
};

inline Result sh(const std::string& command) {
  const std::string cmd = "{ " + command + " ; } 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

inline Result run(const std::string& args) { return sh(kBin + " " + args); }

inline fs::path tmpdir(const std::string& name) {
  return mltrain::testing::fresh_temp_dir("cli_" + name);
}

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline pid_t spawn(const std::vector<std::string>& args, const fs::path& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, kBin.c_str(), &fa, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

// A run in its own process group (a 2-rank run's launcher and workers die together, as a node's,
// or a scheduler signals them all), its output appended to `log`.
inline pid_t spawn_group(const std::vector<std::string>& args, const fs::path& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&at, 0);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, kBin.c_str(), &fa, &at, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  return pid;
}

inline int wait_exit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline bool wait_for(const std::function<bool()>& cond, double seconds) {
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// A small, quick, fully deterministic CNN run on real Fashion-MNIST data.
inline std::vector<std::string> small_run(const fs::path& dir, const std::string& name) {
  return {kBin,
          "train",
          kSrc + "/configs/fashion_mnist_cnn.yaml",
          "run.dir=" + dir.string(),
          "run.name=" + name,
          "data.limit_train=3000",
          "data.batch_size=64",
          "data.eval_batch_size=500",
          "train.duration=2ep",
          "train.eval_every=1ep",
          "checkpoint.every=10u",
          "checkpoint.keep_last=3",
          "runtime.threads=2",
          "model.channels=[8, 16]",
          "model.fc=32",
          "data.workers=1"};
}
inline std::string join(const std::vector<std::string>& v, size_t from) {
  std::string s;
  for (size_t i = from; i < v.size(); ++i) s += " '" + v[i] + "'";
  return s;
}

// The report printed by --json, after any log lines.
inline nlohmann::json json_of(const std::string& out) {
  const size_t at = out.compare(0, 2, "{\n") == 0 ? 0 : out.find("\n{\n");
  REQUIRE(at != std::string::npos);
  return nlohmann::json::parse(out.substr(at == 0 ? 0 : at + 1));
}

inline std::string gunzip(const fs::path& p) {
  gzFile f = gzopen(p.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::string out;
  char buf[65536];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  return out;
}

inline std::vector<std::string> lines_of(const fs::path& p) {
  std::vector<std::string> v;
  std::ifstream in(p);
  std::string l;
  while (std::getline(in, l)) v.push_back(l);
  return v;
}

// A file's SHA-256 (hex), by sha256sum: a tool that is not mltrain's.
inline std::string sha256_of(const fs::path& p) {
  const auto r = sh("sha256sum '" + p.string() + "'");
  REQUIRE(r.code == 0);
  return r.out.substr(0, 64);
}

// The SHA-256 of the model and state files of the checkpoint `latest` names in a run folder's v0.
inline std::pair<std::string, std::string> final_digests(const fs::path& run) {
  std::string latest = slurp(run / "v0" / "checkpoints" / "latest");
  latest.erase(latest.find_last_not_of(" \n") + 1);
  const fs::path ck = run / "v0" / "checkpoints" / latest;
  return {sha256_of(ck / "model.safetensors"), sha256_of(ck / "state.safetensors")};
}

// Steps 1..n each recorded once as a train record, and every line whole.
inline void check_metrics_once(const fs::path& metrics, int64_t n) {
  std::map<int64_t, int> seen;
  for (const auto& line : lines_of(metrics)) {
    const auto rec = nlohmann::json::parse(line);
    if (rec.value("event", "") == "train") ++seen[rec.at("step").get<int64_t>()];
  }
  CHECK(int64_t(seen.size()) == n);
  for (const auto& [step, k] : seen) CHECK(k == 1);
}
