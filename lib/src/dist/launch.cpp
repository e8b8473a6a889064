#include "mltrain/dist/launch.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <cstring>
#include <random>
#include <thread>

#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/process.hpp"
#include "mltrain/runtime/runtime.hpp"
#include "mltrain/dist/rendezvous.hpp"

extern char** environ;

namespace mltrain::dist {
namespace {

volatile sig_atomic_t g_forward = 0;
void on_signal(int s) { g_forward = s; }

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = 29500;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) ::close(fd);
  return port;
}

struct Worker {
  pid_t pid = -1;
  int fd = -1;
  std::string buf;
  bool done = false;
  int status = 0;
};

std::string describe(int rank, int status) {
  if (WIFSIGNALED(status))
    return "rank " + std::to_string(rank) + " killed by signal " +
           std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "rank " + std::to_string(rank) + " exited with status " +
         std::to_string(WEXITSTATUS(status));
}

// Exit 2: the same on every attempt, so never worth a restart.
bool usage_error(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == kExitUsage; }

void flush_lines(Worker& w, int rank, bool all) {
  size_t nl;
  while ((nl = w.buf.find('\n')) != std::string::npos) {
    std::fprintf(stdout, "[rank %d] %s\n", rank, w.buf.substr(0, nl).c_str());
    w.buf.erase(0, nl + 1);
  }
  if (all && !w.buf.empty()) {
    std::fprintf(stdout, "[rank %d] %s\n", rank, w.buf.c_str());
    w.buf.clear();
  }
  std::fflush(stdout);
}

}  // namespace

namespace {

void check_options(const LaunchOptions& o) {
  if (o.nproc < 1) throw ConfigError("--nproc-per-node", "must be at least 1");
  if (o.nnodes < 1) throw ConfigError("--nnodes", "must be at least 1");
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw ConfigError(
        "--node-rank",
        std::to_string(o.node_rank) + " is not below --nnodes " + std::to_string(o.nnodes),
        "number the nodes 0 .. nnodes-1");
  if (o.elastic) {
    if (o.min_nodes < 1 || o.min_nodes > o.max_nodes)
      throw ConfigError("--nnodes", "MIN " + std::to_string(o.min_nodes) + " is above MAX " +
                                        std::to_string(o.max_nodes));
    if (o.master_port <= 0)
      throw ConfigError("--master-port", "an elastic rendezvous needs a port every node agrees on",
                        "pass the same --master-addr and --master-port on every node");
    if (o.rdzv_id.empty()) throw ConfigError("--rdzv-id", "must not be empty");
  }
  if (o.nnodes > 1 && o.master_port <= 0)
    throw ConfigError("--master-port", "several nodes need a port agreed on by every launcher",
                      "pass the same --master-port (and --master-addr) on every node");
  if (o.master_port < 0 || o.master_port > 65535)
    throw ConfigError("--master-port", std::to_string(o.master_port) + " is not a TCP port");
  if (o.command.empty())
    throw ConfigError("mltrain launch", "no command given",
                      "mltrain launch --nproc-per-node 2 -- mltrain train cfg.yaml");
}

// This node's workers of one attempt, with torchrun's environment; stdout and stderr through one
// pipe each, streamed with the rank's prefix; they die with the launcher. `agent_store`: the
// workers' process group meets in the launchers' rendezvous store (elastic rounds), under the
// attempt's prefix, as torchrun's workers do in its agent's store.
std::vector<Worker> start_workers(const LaunchOptions& o, int attempt, int port,
                                  const std::string& run_id, bool agent_store = false) {
  const int world = o.nnodes * o.nproc, first = o.node_rank * o.nproc;
  std::vector<Worker> ws(size_t(o.nproc));
  for (int r = 0; r < o.nproc; ++r) {
    std::vector<std::string> set = {"RANK=" + std::to_string(first + r),
                                    "WORLD_SIZE=" + std::to_string(world),
                                    "LOCAL_RANK=" + std::to_string(r),
                                    "LOCAL_WORLD_SIZE=" + std::to_string(o.nproc),
                                    "GROUP_RANK=" + std::to_string(o.node_rank),
                                    "MASTER_ADDR=" + o.master_addr,
                                    "MASTER_PORT=" + std::to_string(port),
                                    "TORCHELASTIC_RESTART_COUNT=" + std::to_string(attempt),
                                    "MLTRAIN_RUN_ID=" + run_id + "-" + std::to_string(attempt)};
    if (agent_store) set.push_back("TORCHELASTIC_USE_AGENT_STORE=True");
    ws[size_t(r)].pid =
        spawn_child(o.command, environment_with(set), &ws[size_t(r)].fd, "", /*own_group=*/false);
  }
  std::fprintf(stderr, "[launch] %s %d: node %d/%d, %d workers, rendezvous %s:%d\n",
               agent_store ? "round" : "attempt", attempt, o.node_rank, o.nnodes, o.nproc,
               o.master_addr.c_str(), port);
  return ws;
}

// A usage error with restarts left: said once, and the restarts are not spent on it.
bool no_restart(int status, int max_restarts) {
  if (!usage_error(status)) return false;
  if (max_restarts > 0)
    std::fprintf(stderr,
                 "[launch] not restarting: a configuration error (exit 2) fails every attempt\n");
  return true;
}

struct Outcome {
  int failed = -1, status = 0;  // the first worker that failed (global rank), its wait status
  bool interrupted = false;     // stopped because `interrupt` said so (a new elastic round)
};

// Streams the workers' output until every one has exited. The first failure (or a signal to the
// launcher, or `interrupt` returning true, asked every quarter second) stops the others: SIGTERM,
// then SIGKILL after the grace period.
Outcome supervise(const LaunchOptions& o, std::vector<Worker>& ws,
                  const std::function<bool()>& interrupt = nullptr) {
  const int first = o.node_rank * o.nproc;
  Outcome out;
  int alive = o.nproc;
  bool stopping = false;
  auto stop_time = std::chrono::steady_clock::time_point::max();
  auto stop_all = [&](int sig) {
    for (auto& w : ws)
      if (!w.done) ::kill(w.pid, sig);
    stopping = true;
    stop_time =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(o.grace_s * 1000));
  };
  auto asked = std::chrono::steady_clock::now();
  while (alive > 0) {
    if (g_forward && !stopping) stop_all(g_forward);  // the launcher was signalled: pass it on
    if (interrupt && !stopping &&
        std::chrono::steady_clock::now() - asked > std::chrono::milliseconds(250)) {
      asked = std::chrono::steady_clock::now();
      if (interrupt()) {
        out.interrupted = true;
        stop_all(SIGTERM);  // every rank stops at one step; rank 0 checkpoints
      }
    }
    std::vector<pollfd> pf;
    for (auto& w : ws) pf.push_back({w.fd, POLLIN, 0});
    ::poll(pf.data(), pf.size(), 100);
    for (size_t r = 0; r < ws.size(); ++r) {
      auto& w = ws[r];
      if (w.fd >= 0 && (pf[r].revents & (POLLIN | POLLHUP))) {
        char b[8192];
        const ssize_t k = ::read(w.fd, b, sizeof b);
        if (k > 0)
          w.buf.append(b, size_t(k));
        else if (k == 0)
          ::close(w.fd), w.fd = -1;
        flush_lines(w, first + int(r), false);
      }
      if (w.done) continue;
      int st = 0;
      if (::waitpid(w.pid, &st, WNOHANG) != w.pid) continue;
      w.done = true, w.status = st, --alive;
      const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (!ok && out.failed < 0 && !stopping) {
        out.failed = first + int(r), out.status = st;
        std::fprintf(stderr, "[launch] %s; stopping the other workers\n",
                     describe(out.failed, st).c_str());
        stop_all(SIGTERM);
      }
    }
    if (stopping && std::chrono::steady_clock::now() > stop_time)
      for (auto& x : ws)
        if (!x.done) ::kill(x.pid, SIGKILL);
  }
  for (size_t r = 0; r < ws.size(); ++r) {  // the rest of their output
    auto& w = ws[r];
    if (w.fd >= 0) {
      char b[8192];
      ssize_t k;
      while ((k = ::read(w.fd, b, sizeof b)) > 0) w.buf.append(b, size_t(k));
      ::close(w.fd);
    }
    flush_lines(w, first + int(r), true);
  }
  // A rank that exited 2 (a usage or config error) is the cause even when a peer was reaped
  // first: a rank left joining the group, or waiting in a collective, with the one that raised it
  // exits 1 ("connection closed by peer"), often sooner than the raiser finishes exiting.
  if (out.failed >= 0 && !usage_error(out.status))
    for (size_t r = 0; r < ws.size(); ++r)
      if (usage_error(ws[r].status)) {
        out.failed = first + int(r), out.status = ws[r].status;
        std::fprintf(stderr, "[launch] %s: a configuration error, the cause\n",
                     describe(out.failed, out.status).c_str());
        break;
      }
  return out;
}

}  // namespace

void log_contract(const NodeContract& c, const LaunchOptions& o) {
  if (c.source == "none") return;
  std::fprintf(stderr, "[launch] %s: node %d/%d, %d workers per node, rendezvous %s:%d\n",
               c.source == "trainer" ? "Kubeflow Trainer (PET_* variables)"
                                     : "Kubeflow PyTorchJob (WORLD_SIZE nodes, RANK node rank)",
               o.node_rank, o.nnodes, o.nproc, o.master_addr.c_str(), o.master_port);
}

namespace {

// --nnodes MIN:MAX: rounds of the elastic rendezvous (rendezvous.hpp). A worker failure opens the
// next round and counts against --max-restarts; a membership change (a node waiting to join while
// the round is below MAX, or another node opening the next round) stops the workers with SIGTERM
// (a clean checkpoint) and does not.
LaunchResult launch_elastic(const LaunchOptions& o) {
  LaunchResult res;
  Rendezvous rdzv({o.master_addr, o.master_port, o.rdzv_id, o.min_nodes, o.max_nodes, o.last_call_s,
                   o.join_timeout_s, [] { return g_forward != 0; }});
  for (;;) {
    const Round r = rdzv.next_round();
    if (r.cancelled) {
      res.exit_code = 128 + int(g_forward);
      return res;
    }
    if (r.done) {
      std::fprintf(stderr, "[launch] the job finished before this node could join a round\n");
      return res;
    }
    LaunchOptions ro = o;
    ro.nnodes = r.nnodes, ro.node_rank = r.node_rank;
    std::vector<Worker> ws = start_workers(ro, r.number, o.master_port, o.rdzv_id, true);
    bool store_ok = true;
    const Outcome out = supervise(ro, ws, [&] {
      if (!store_ok) return false;
      try {
        if (rdzv.superseded(r.number)) {
          std::fprintf(stderr, "[launch] round %d was superseded: stopping the workers\n",
                       r.number);
          return true;
        }
        if (r.nnodes < o.max_nodes && rdzv.waiting(r.number) > 0) {
          std::fprintf(stderr,
                       "[launch] a node is waiting to join (round of %d, at most %d): restarting "
                       "the group to admit it\n",
                       r.nnodes, o.max_nodes);
          rdzv.open_next(r.number);
          return true;
        }
      } catch (const std::exception& e) {  // the store's host is gone: supervise the workers alone
        std::fprintf(stderr,
                     "[launch] rendezvous store unreachable (%s); watching the workers only\n",
                     e.what());
        store_ok = false;
      }
      return false;
    });
    if (g_forward) {
      res.exit_code = 128 + int(g_forward);
      return res;
    }
    if (out.failed < 0 && !out.interrupted) {
      if (store_ok) rdzv.finish(r.number, r.nnodes);
      return res;
    }
    if (out.interrupted) continue;  // a membership change, not a failure
    res.failed_rank = out.failed;
    res.failure = describe(out.failed, out.status);
    if (res.restarts >= o.max_restarts || no_restart(out.status, o.max_restarts)) {
      res.exit_code =
          WIFEXITED(out.status) && WEXITSTATUS(out.status) != 0 ? WEXITSTATUS(out.status) : 1;
      return res;
    }
    ++res.restarts;
    std::fprintf(stderr,
                 "[launch] opening round %d after the failure (%d of %d restarts); the group "
                 "resumes from its latest checkpoint with the nodes that join\n",
                 r.number + 1, res.restarts, o.max_restarts);
    rdzv.open_next(r.number);
  }
}

}  // namespace

LaunchResult launch(const LaunchOptions& o) {
  check_options(o);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  if (o.elastic) return launch_elastic(o);
  LaunchResult res;
  std::mt19937_64 rng(std::random_device{}());
  // Every node must agree on the run id; one node alone picks its own.
  const std::string run_id =
      o.nnodes > 1 ? "launch-" + o.master_addr + "-" + std::to_string(o.master_port)
                   : std::to_string(::getpid()) + "-" + std::to_string(rng() % 1000000);
  for (int attempt = 0;; ++attempt) {
    const int port = o.master_port > 0 ? o.master_port + attempt : free_port();
    std::vector<Worker> ws = start_workers(o, attempt, port, run_id);
    const Outcome out = supervise(o, ws);
    if (g_forward) {  // stopped on request
      res.exit_code = 128 + int(g_forward);
      return res;
    }
    if (out.failed < 0) {
      res.exit_code = 0;
      return res;
    }
    res.failed_rank = out.failed;
    res.failure = describe(out.failed, out.status);
    if (attempt < o.max_restarts && !no_restart(out.status, o.max_restarts)) {
      ++res.restarts;
      std::fprintf(stderr,
                   "[launch] restarting the group (%d of %d restarts); it resumes from its latest "
                   "checkpoint\n",
                   attempt + 1, o.max_restarts);
      continue;
    }
    res.exit_code =
        WIFEXITED(out.status) && WEXITSTATUS(out.status) != 0 ? WEXITSTATUS(out.status) : 1;
    return res;
  }
}

}  // namespace mltrain::dist

namespace mltrain::dist {

LaunchOptions with_node_contract(LaunchOptions o, const NodeContract& c,
                                 const std::set<std::string>& given, int cores, int gpus) {
  if (c.source == "none") return o;
  auto unset = [&](const char* flag) { return given.count(flag) == 0; };
  if (unset("--nnodes")) o.nnodes = c.nnodes;
  if (unset("--node-rank")) o.node_rank = c.node_rank;
  if (unset("--master-addr")) o.master_addr = c.master_addr;
  if (unset("--master-port")) o.master_port = c.master_port;
  if (unset("--nproc-per-node") && !c.nproc.empty()) o.nproc = resolve_nproc(c.nproc, cores, gpus);
  if (unset("--nnodes") && c.elastic) {
    o.elastic = true;
    o.min_nodes = c.min_nodes, o.max_nodes = c.max_nodes;
    if (!c.rdzv_id.empty()) o.rdzv_id = c.rdzv_id;
  }
  return o;
}

std::optional<int> launch_if_configured(const config::DistributedConfig& cfg,
                                        const std::vector<std::string>& command) {
  const NodeContract c = node_contract_from_env();
  // Already a worker: a launcher's (LOCAL_RANK), srun's, or a hand-set world outside a pod.
  if (std::getenv("LOCAL_RANK") || std::getenv("SLURM_PROCID") ||
      (std::getenv("RANK") && c.source != "pytorchjob"))
    return std::nullopt;
  LaunchOptions lo;
  lo.nproc = static_cast<int>(cfg.nproc_per_node);
  lo.max_restarts = static_cast<int>(cfg.max_restarts);
  lo.command = command;
  std::set<std::string> given;
  if (lo.nproc > 1) given.insert("--nproc-per-node");  // the config's count wins over the cluster's
  lo = with_node_contract(lo, c, given, runtime::usable_cores(), compat::cuda_device_count());
  if (lo.nproc <= 1 && !lo.elastic) return std::nullopt;
  if (lo.elastic && lo.rdzv_id.empty())
    lo.rdzv_id = "launch-" + lo.master_addr + "-" + std::to_string(lo.master_port);
  log_contract(c, lo);
  const LaunchResult r = launch(lo);
  if (r.exit_code != 0 && !r.failure.empty())
    std::fprintf(stderr, "error: launch: %s\n", r.failure.c_str());
  return r.exit_code;
}

}  // namespace mltrain::dist
