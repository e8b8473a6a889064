#include "mltrain/dist/ddp.hpp"

#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <future>
#include <thread>

#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/dist/heartbeat.hpp"
#include "mltrain/optim/optimizer.hpp"

#ifdef MLTRAIN_WITH_GLOO
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

namespace fs = std::filesystem;

namespace mltrain::dist {

bool gloo_compiled() {
#ifdef MLTRAIN_WITH_GLOO
  return true;
#else
  return false;
#endif
}

bool nccl_group_compiled() {
  const auto* cuda = compat::cuda_plugin();
  return cuda && cuda->make_nccl_group;
}

// A FileStore's lock file (claim_file_store), held by an open descriptor until the owner goes.
// The last live rank to go removes it, so a finished run leaves nothing in the folder.
struct StoreLock {
  int fd = -1;
  std::string path;
  StoreLock() = default;
  StoreLock(const StoreLock&) = delete;
  StoreLock& operator=(const StoreLock&) = delete;
  ~StoreLock() {
    if (fd < 0) return;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) ::unlink(path.c_str());
    ::close(fd);
  }
};

struct Comm::Impl {
  StoreLock store_lock;  // a FileStore's (claim_file_store); released after the store below
#ifdef MLTRAIN_WITH_GLOO
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<compat::C10dGroup> pg;
#endif
  torch::Device device = torch::kCPU;  // where the group's tensors must live
  bool nccl = false;
  std::thread watchdog;  // distributed.hang_timeout: Comm::watch()
#ifdef MLTRAIN_WITH_GLOO
  // The watchdog's own client of a TCP store, with a short timeout: a store whose host is lost
  // or frozen is named instead of blocking the watchdog for the collectives' timeout.
  c10::intrusive_ptr<c10d::Store> watch_store;
#endif
  std::string store_at;  // "host:port (rank 0's)" or "(torchrun's agent)"; empty: a FileStore
  // What the watchdog last read of every rank, for reports when the store is gone.
  std::mutex cache_mu;
  std::vector<std::string> who;
  std::vector<Beat> beats;
  std::mutex watch_mu;
  std::condition_variable watch_cv;
  bool stop_watch = false;
  // The watchdog's latest store round trip (a detached thread): ready once that thread has let go
  // of the store. Guarded by watch_mu.
  std::shared_future<std::vector<std::string>> store_io;
  // The tensors the group works on: `ts` itself, or copies on the group's device.
  std::vector<torch::Tensor> stage(const std::vector<torch::Tensor>& ts) const {
    std::vector<torch::Tensor> v;
    for (const auto& t : ts) v.push_back(t.device() == device ? t : t.to(device));
    return v;
  }
  static void unstage(const std::vector<torch::Tensor>& staged, std::vector<torch::Tensor>& ts) {
    for (size_t i = 0; i < ts.size(); ++i)
      if (!staged[i].is_same(ts[i])) ts[i].copy_(staged[i]);
  }
};

struct Comm::Pending {
#ifdef MLTRAIN_WITH_GLOO
  c10::intrusive_ptr<c10d::Work> work;
#endif
  std::string what;
  torch::Tensor target, staged;  // NCCL with a CPU tensor: the result is copied back on wait()
  torch::Tensor keep;            // a send's buffer
};

Comm::Comm() : impl_(std::make_unique<Impl>()) {}
// A collective whose size differs between ranks is caught by Gloo in one of its threads, which
// throws where nothing catches (std::terminate). The doctor's last word from that rank: its beat,
// with the collective it had just issued, for the survivors to compare, and a line naming it.
namespace {
constexpr int64_t kStoreAnswerMs = 5000;  // the watchdog's store: a host silent this long is lost
std::atomic<const Comm*> g_doctor_comm{nullptr};
std::terminate_handler g_previous_terminate = nullptr;
[[noreturn]] void doctor_terminate() {
  std::string what = "an exception nothing caught";
  try {
    if (auto e = std::current_exception()) std::rethrow_exception(e);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  const Comm* c = g_doctor_comm.load();
  if (c && what.find("collective mismatch") != std::string::npos) {
    try {
      c->publish_beat();
    } catch (...) {
    }
    std::fprintf(stderr,
                 "[doctor] rank %d: Gloo found a collective of another size on a peer: %s\n",
                 c->rank(), what.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}
}  // namespace

Comm::~Comm() {
  const Comm* self = this;
  g_doctor_comm.compare_exchange_strong(self, nullptr);
  if (impl_->watchdog.joinable()) {
    {
      std::lock_guard<std::mutex> l(impl_->watch_mu);
      impl_->stop_watch = true;
    }
    impl_->watch_cv.notify_all();
    impl_->watchdog.join();
    // A round trip still in flight holds the store: wait for it (briefly: a lost TCPStore host
    // never answers), so the store's last user is this thread. Otherwise a FileStore's count of
    // users could miss this rank at exit and leave the file behind (seen once in cli_launch).
    std::shared_future<std::vector<std::string>> io;
    {
      std::lock_guard<std::mutex> l(impl_->watch_mu);
      io = impl_->store_io;
    }
    if (io.valid()) io.wait_for(std::chrono::seconds(2));
  }
#ifdef MLTRAIN_WITH_GLOO
  if (impl_->nccl && impl_->pg) compat::cuda_plugin()->shutdown_nccl_group(impl_->pg);
#endif
}

#ifdef MLTRAIN_WITH_GLOO
// The file the ranks of one node meet in: named by the run id, so every rank of a run finds it.
static fs::path file_store_path(const World& w, const CommOptions& o) {
  const fs::path dir = o.store_dir.empty() ? fs::temp_directory_path() : fs::path(o.store_dir);
  return dir / ("mltrain-store-" + w.run_id + "-" + std::to_string(w.size));
}

// Before a rank opens the FileStore: every live rank of a run holds a shared lock on
// "<store>.lock" for as long as it runs (the kernel drops it when the process dies, SIGKILL
// included). c10d's FileStore deletes its file only when every rank that opened it has let go,
// so a killed run leaves it behind, with the dead ranks' addresses in it, for the next run with
// the same id (a Slurm job id handed out again, a fixed MLTRAIN_RUN_ID) to read. A rank that can
// take the lock exclusively knows no live rank uses the file and removes it; the others wait for
// that on their shared lock. (The converted lock is briefly released: a rank taking it then
// finds no file left to remove. The last rank of a run removes the lock file as it goes; a run
// with the same id started in that instant could split over two lock files, which nothing but
// two runs sharing an id at once does.)
static void claim_file_store(const fs::path& path, StoreLock& lock) {
  const std::string lp = path.string() + ".lock";
  lock.path = lp;
  lock.fd = ::open(lp.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (lock.fd < 0)
    throw RuntimeError("distributed", "cannot open " + lp + ": " + std::strerror(errno),
                       "make the folder writable, or point TMPDIR at one that is");
  if (::flock(lock.fd, LOCK_EX | LOCK_NB) == 0) {
    std::error_code ec;
    if (fs::remove(path, ec))
      spdlog::warn("[dist] removed {}: the store file of a killed run with the same id",
                   path.string());
  }
  while (::flock(lock.fd, LOCK_SH) != 0 && errno == EINTR) {
  }
}

// The rendezvous store, following the launcher: torchrun's own TCPStore, a FileStore on one node,
// else a TCPStore served by rank 0. *kind names it for the log.
static c10::intrusive_ptr<c10d::Store> make_store(const World& w, const CommOptions& o,
                                                  StoreLock& lock,
                                                  std::chrono::milliseconds timeout,
                                                  std::string* kind) {
  c10::intrusive_ptr<c10d::Store> store;
  if (w.agent_store) {
    // torchrun (static rendezvous, its default) already serves a TCPStore at MASTER_ADDR:MASTER_PORT:
    // every rank is a client, as torch.distributed's env:// does; each attempt its own key prefix.
    c10d::TCPStoreOptions so;
    so.port = uint16_t(w.master_port);
    so.isServer = false;
    so.numWorkers = w.size;
    so.timeout = timeout;
    try {
      auto tcp = c10::make_intrusive<c10d::TCPStore>(w.master_addr, so);
      store = c10::make_intrusive<c10d::PrefixStore>("mltrain/attempt_" + std::to_string(w.restart),
                                                     tcp);
    } catch (const std::exception& e) {
      throw RuntimeError("distributed",
                         "rank " + std::to_string(w.rank) +
                             " could not reach torchrun's store at " + w.master_addr + ":" +
                             std::to_string(w.master_port) + ": " + e.what(),
                         "is the torchrun agent still running? unset TORCHELASTIC_USE_AGENT_STORE "
                         "if this process was not started by torchrun");
    }
    *kind = "torchrun's TCPStore";
  } else if (w.single_node()) {
    const fs::path path = file_store_path(w, o);
    claim_file_store(path, lock);
    store = c10::make_intrusive<c10d::FileStore>(path.string(), w.size);
    *kind = "FileStore";
  } else {
    if (w.rank == 0)
      spdlog::warn(
          "[dist] TCPStore on {}:{}: the port is unauthenticated and open on all interfaces; run "
          "inside a trusted network",
          w.master_addr, w.master_port);
    c10d::TCPStoreOptions so;
    so.port = uint16_t(w.master_port);
    so.isServer = w.rank == 0;
    so.numWorkers = w.size;
    so.timeout = timeout;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(w.master_addr, so);
    } catch (const std::exception& e) {
      throw RuntimeError("distributed",
                         "rank " + std::to_string(w.rank) +
                             (w.rank == 0 ? " could not serve" : " could not reach") +
                             " the TCPStore at " + w.master_addr + ":" +
                             std::to_string(w.master_port) + ": " + e.what(),
                         w.rank == 0 ? "choose a free MASTER_PORT"
                                     : "check MASTER_ADDR/MASTER_PORT and that rank 0 started");
    }
    *kind = "TCPStore";
  }
  return store;
}
#endif

#ifdef MLTRAIN_WITH_GLOO
// A Gloo group of `size` ranks meeting in `store`. One node: loopback. Several: GLOO_SOCKET_IFNAME,
// else the interface this host's name resolves to.
static c10::intrusive_ptr<compat::C10dGroup> gloo_group(
    const c10::intrusive_ptr<c10d::Store>& store, const World& w, int rank, int size,
    std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create();
  const char* iface = std::getenv("GLOO_SOCKET_IFNAME");
  opts->devices.push_back(iface ? c10d::ProcessGroupGloo::createDeviceForInterface(iface)
                          : w.single_node()
                              ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                              : c10d::ProcessGroupGloo::createDefaultDevice());
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}
#endif

std::unique_ptr<Comm> Comm::create(const World& w, const CommOptions& o) {
#ifndef MLTRAIN_WITH_GLOO
  throw ConfigError("distributed", "this mltrain was built without c10d Gloo",
                    "rebuild with libgloo-dev installed (scripts/install-deps.sh)");
#else
  const bool nccl = o.backend == "nccl";
  if (nccl && !compat::cuda_built())
    throw ConfigError("distributed.backend",
                      "nccl is not available in this build (no CUDA LibTorch with nccl.h)",
                      "use distributed.backend=gloo, or build with -DMLTRAIN_WITH_CUDA=ON against "
                      "a CUDA LibTorch");
  // A device that is not CUDA is the likelier mistake (and, without a driver, the reason the
  // CUDA plugin is not loaded), so it is named before the plugin's NCCL support.
  if (nccl && !o.device.is_cuda())
    throw ConfigError("distributed.backend",
                      "nccl moves CUDA tensors only, and this run trains on the CPU",
                      "set runtime.device=cuda, or distributed.backend=gloo");
  if (nccl && !nccl_group_compiled())
    throw ConfigError("distributed.backend",
                      "nccl is not available: CUDA libraries " + compat::cuda_plugin_status() +
                          (compat::cuda_plugin() ? ", built without nccl.h" : ""),
                      "use distributed.backend=gloo, or rebuild where the wheel's nccl.h is found "
                      "(scripts/build.sh)");
  if (!nccl && o.backend != "gloo")
    throw ConfigError("distributed.backend", "unknown backend '" + o.backend + "'",
                      "use gloo or nccl");
  std::unique_ptr<Comm> c(new Comm());
  c->impl_->nccl = nccl;
  c->impl_->device = nccl ? o.device : torch::Device(torch::kCPU);
  c->world_ = w;
  c->timeout_s_ = o.timeout_s;
  const auto timeout = std::chrono::milliseconds(int64_t(o.timeout_s * 1000));
  std::string store_kind;
  c->impl_->store = make_store(w, o, c->impl_->store_lock, timeout, &store_kind);
  c->impl_->store->setTimeout(timeout);
  auto group_store = c10::make_intrusive<c10d::PrefixStore>("mltrain", c->impl_->store);
  try {
    if (nccl) {
      // A collective that outlives the timeout raises in wait() (blocking wait) instead of the
      // watchdog aborting the process, so the failure path below names the missing ranks.
      ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 0);
      ::setenv("NCCL_BLOCKING_WAIT", "1", 0);  // its name before LibTorch 2.2
      c->impl_->pg = compat::cuda_plugin()->make_nccl_group(group_store, w.rank, w.size, timeout);
    } else {
      c->impl_->pg = gloo_group(group_store, w, w.rank, w.size, timeout);
    }
  } catch (const std::exception& e) {
    // c10's errors carry a C++ backtrace in what(); the message alone is what a user can act on.
    const auto* c10e = dynamic_cast<const c10::Error*>(&e);
    throw RuntimeError("distributed",
                       std::string("rank ") + std::to_string(w.rank) + " could not join the " +
                           (nccl ? "NCCL" : "Gloo") +
                           " group: " + (c10e ? c10e->what_without_backtrace() : e.what()),
                       store_kind == "FileStore"
                           ? "check that every rank started; if an earlier run with the same id "
                             "was killed, delete its store file " +
                                 file_store_path(w, o).string() +
                                 " (or export MLTRAIN_RUN_ID=<a new id>)"
                           : "check that every rank started and MASTER_ADDR/MASTER_PORT match");
  }
  // Who is who, for naming the missing ranks when a collective fails.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = std::string(host) + ":" + std::to_string(::getpid());
  c->impl_->store->set("mltrain/pid/" + std::to_string(w.rank),
                       std::vector<uint8_t>(me.begin(), me.end()));
  here::set_rank(w.rank);
  spdlog::info("[dist] rank {}/{} (local {}/{}, node {}/{}, {}) joined {} over {}", w.rank, w.size,
               w.local_rank, w.local_size, w.node_rank, w.nodes, w.source,
               nccl ? "NCCL on " + c->impl_->device.str() : std::string("Gloo"), store_kind);
  if ((o.hang_timeout_s > 0 || o.doctor) && w.size > 1) {
    c->impl_->watch_store = c->impl_->store;
    if (store_kind != "FileStore") {
      c->impl_->store_at = w.master_addr + ":" + std::to_string(w.master_port) +
                           (w.agent_store ? " (torchrun's agent)" : " (served by rank 0)");
      try {
        c10d::TCPStoreOptions so;
        so.port = uint16_t(w.master_port);
        so.isServer = false;
        so.timeout = std::chrono::milliseconds(kStoreAnswerMs);
        c10::intrusive_ptr<c10d::Store> tcp =
            c10::make_intrusive<c10d::TCPStore>(w.master_addr, so);
        c->impl_->watch_store = tcp;
        if (w.agent_store)
          c->impl_->watch_store = c10::make_intrusive<c10d::PrefixStore>(
              "mltrain/attempt_" + std::to_string(w.restart), tcp);
      } catch (const std::exception& e) {
        spdlog::warn(
            "[doctor] a second client of the store failed ({}): the watchdog shares the "
            "collectives' client",
            e.what());
      }
    }
    if (!g_previous_terminate) g_previous_terminate = std::set_terminate(doctor_terminate);
    g_doctor_comm = c.get();
    Comm* self = c.get();
    c->impl_->watchdog = std::thread([self, h = o.hang_timeout_s] { self->watch(h); });
  }
  return c;
#endif
}

bool Comm::nccl() const { return impl_->nccl; }

void Comm::record(const char* op, int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  ring_.push_back(Op{++seq_, op, bytes});
  if (ring_.size() > 32) ring_.pop_front();
  bytes_ += bytes;
}

static std::string op_text(const Op& op) {
  return "#" + std::to_string(op.seq) + " " + op.name + " " + std::to_string(op.bytes) + " B";
}

std::string Comm::recent() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string s;
  for (const auto& r : ring_) s += "  " + op_text(r) + "\n";
  return s;
}

template <class F>
void Comm::blocked(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  blocked_since_ms_ =
      std::chrono::duration_cast<std::chrono::milliseconds>(t0.time_since_epoch()).count();
  struct Add {
    double& to;
    std::atomic<int64_t>& since;
    std::chrono::steady_clock::time_point t0;
    ~Add() {
      to += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      since = 0;
    }
  } add{blocked_s_, blocked_since_ms_, t0};
  f();
}

// Gone: no such process, or a zombie its launcher has not reaped yet (torchrun polls its workers
// every few seconds, so a killed peer stays a zombie well after the survivors notice).
static bool process_gone(int pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');  // "pid (comm) S ...": comm may hold spaces and parentheses
  return paren != std::string::npos && paren + 2 < line.size() &&
         (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

static const char* const kAllAlive =
    "every rank on this host is alive (a peer on another host, or a hang)";

namespace {
std::string heartbeat_key(int rank) { return "mltrain/heartbeat/" + std::to_string(rank); }
// A join record ("host:pid", stored under mltrain/pid/<rank>) as reports name it.
std::string host_pid_text(const std::string& hp) {
  const auto colon = hp.rfind(':');
  return colon == std::string::npos
             ? hp
             : "host " + hp.substr(0, colon) + ", pid " + hp.substr(colon + 1);
}
}  // namespace

static std::string where_text(const Beat& b) {
  const bool within = b.where == Phase::kData || b.where == Phase::kCopy ||
                      b.where == Phase::kForward || b.where == Phase::kBackward ||
                      b.where == Phase::kAllreduce || b.where == Phase::kOptimizer;
  std::string s = std::string("in ") + where_name(b.where) +
                  (b.where == Phase::kSetup ? std::string()
                   : within                 ? " of step " + std::to_string(b.step + 1)
                                            : " after step " + std::to_string(b.step));
  if (!b.recent.empty()) {
    const Op& op = b.recent.back();
    s += ", its last collective: #" + std::to_string(op.seq) + " " + op.name + " (" +
         std::to_string(op.bytes) + " B)";
  } else {
    s += ", no collective yet";
  }
  return s;
}

// The report of a doctor's finding, then the end of this process: the main thread is blocked in a
// collective the faulty rank never completes, so only an exit lets the launcher see a failure
// and restart the group.
[[noreturn]] static void doctor_exit(int me, const std::string& what, const std::string& fix) {
  spdlog::error("[doctor] rank {}: {}", me, what);
  spdlog::default_logger()->flush();
  std::fprintf(stderr, "error: distributed: %s\n  fix: %s\n", what.c_str(), fix.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(1);
}

// Ranks on this host whose process is gone, from the pids every rank stored when it joined.
static std::string missing_ranks(Comm::Impl& impl, int size) {
#ifdef MLTRAIN_WITH_GLOO
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string gone, unknown;
  for (int r = 0; r < size; ++r) {
    try {
      const auto key = "mltrain/pid/" + std::to_string(r);
      if (!impl.store->check({key})) {
        unknown += (unknown.empty() ? "" : ", ") + std::to_string(r);
        continue;
      }
      const auto v = impl.store->get(key);
      const std::string hp(v.begin(), v.end());
      const auto colon = hp.rfind(':');
      const int pid = std::atoi(hp.c_str() + colon + 1);
      if (hp.substr(0, colon) == host && pid > 0 && process_gone(pid)) {
        gone += (gone.empty() ? "rank " : ", rank ") + std::to_string(r) + " (host " + host +
                ", pid " + std::to_string(pid);
        // Where it was: its last beat, when the doctor published one.
        if (impl.store->check({heartbeat_key(r)})) {
          const auto b = impl.store->get(heartbeat_key(r));
          const Beat beat = decode_beat(std::string(b.begin(), b.end()));
          if (beat.issued > 0) gone += "; last seen " + where_text(beat);
        }
        gone += ")";
      }
    } catch (const std::exception&) {
      unknown += (unknown.empty() ? "" : ", ") + std::to_string(r);
    }
  }
  std::string s;
  if (!gone.empty()) s += "missing: " + gone + " exited";
  if (!unknown.empty())
    s += std::string(s.empty() ? "" : "; ") + "never joined or unknown: ranks " + unknown;
  return s.empty() ? kAllAlive : s;
#else
  (void)impl, (void)size;
  return "";
#endif
}

std::string Comm::who(int rank) const {
  if (impl_->watchdog.joinable()) {  // the doctor's: from what its watchdog read, never the store
    std::lock_guard<std::mutex> l(impl_->cache_mu);
    return size_t(rank) < impl_->who.size() ? impl_->who[size_t(rank)] : "pid unknown";
  }
  std::string who = "pid unknown";
#ifdef MLTRAIN_WITH_GLOO
  try {
    const auto key = "mltrain/pid/" + std::to_string(rank);
    if (impl_->store->check({key})) {
      const auto v = impl_->store->get(key);
      who = host_pid_text(std::string(v.begin(), v.end()));
    }
  } catch (const std::exception&) {
  }
#else
  (void)rank;
#endif
  return who;
}

Beat Comm::own_beat() const {
  Beat b;
  b.where = here::where();
  b.step = here::step();
  b.progress = here::progress();
  b.step_s = here::step_median_s();
  b.busy_s = here::busy_median_s();
  b.steps = here::steps_seen();
  std::lock_guard<std::mutex> l(mu_);
  b.issued = seq_;
  const size_t keep = std::min<size_t>(ring_.size(), 8);
  b.recent.assign(ring_.end() - std::ptrdiff_t(keep), ring_.end());
  return b;
}

void Comm::publish_beat() const {
#ifdef MLTRAIN_WITH_GLOO
  const std::string text = encode_beat(own_beat());
  impl_->store->set(heartbeat_key(world_.rank), std::vector<uint8_t>(text.begin(), text.end()));
#endif
}

// The watchdog: every 250 ms (with a fixed timeout, a fifth of it, 50 ms .. 1 s) publish this
// rank's beat when it changed, read the others', and stop the group when one is hung or the
// collectives diverged; name a straggler once (rank 0).
void Comm::watch(double hang_timeout_s) {
#ifdef MLTRAIN_WITH_GLOO
  using Clock = std::chrono::steady_clock;
  Impl& im = *impl_;
  const bool automatic = hang_timeout_s <= 0;
  const auto period = std::chrono::milliseconds(
      automatic ? 250 : std::clamp<int64_t>(int64_t(hang_timeout_s * 200), 50, 1000));
  const int n = world_.size, me = world_.rank;
  std::vector<std::pair<uint64_t, uint64_t>> seen(size_t(n), {0, 0});  // issued, progress
  std::vector<Clock::time_point> moved(size_t(n), Clock::now());
  std::string published;
  std::vector<bool> named_straggler(size_t(n), false);
  std::unique_lock<std::mutex> lock(im.watch_mu);
  while (!im.watch_cv.wait_for(lock, period, [&] { return im.stop_watch; })) {
    lock.unlock();  // the destructor may stop the watch while the store is slow to answer
    struct Relock {
      std::unique_lock<std::mutex>& l;
      ~Relock() { l.lock(); }
    } relock{lock};
    try {
      const Beat mine = own_beat();
      const std::string text = encode_beat(mine);
      // The store's part runs on a helper thread with a deadline: a TCPStore client whose server
      // is frozen (SIGSTOP, a lost host, a dropped port) retries past its own timeout, measured.
      // Also the ranks' "host:pid" until every one is known: reports name ranks from these,
      // without asking a store that may be the thing lost.
      std::vector<bool> need_who(static_cast<size_t>(n));
      {
        std::lock_guard<std::mutex> l(im.cache_mu);
        for (int r = 0; r < n; ++r)
          need_who[size_t(r)] = size_t(r) >= im.who.size() || im.who[size_t(r)] == "pid unknown";
      }
      auto reply = std::make_shared<std::promise<std::vector<std::string>>>();
      const std::shared_future<std::vector<std::string>> answer = reply->get_future().share();
      {
        std::lock_guard<std::mutex> g(im.watch_mu);
        im.store_io = answer;
      }
      std::thread([store = im.watch_store, me, n, text, publish = text != published, need_who,
                   reply]() mutable {
        std::vector<std::string> out(static_cast<size_t>(2 * n));
        std::exception_ptr failed;
        try {
          if (publish)
            store->set(heartbeat_key(me), std::vector<uint8_t>(text.begin(), text.end()));
          for (int r = 0; r < n; ++r) {
            if (r != me && store->check({heartbeat_key(r)})) {
              const auto v = store->get(heartbeat_key(r));
              out[size_t(r)].assign(v.begin(), v.end());
            }
            const std::string key = "mltrain/pid/" + std::to_string(r);
            if (need_who[size_t(r)] && store->check({key})) {
              const auto v = store->get(key);
              out[size_t(n + r)].assign(v.begin(), v.end());
            }
          }
        } catch (...) {
          failed = std::current_exception();
        }
        store.reset();  // let go before answering: once the answer is ready, only Comm holds it
        if (failed)
          reply->set_exception(failed);
        else
          reply->set_value(std::move(out));
      }).detach();
      const auto asked = Clock::now();
      while (answer.wait_for(period) != std::future_status::ready) {
        {
          std::lock_guard<std::mutex> g(im.watch_mu);
          if (im.stop_watch) return;  // the group is ending: nothing left to watch
        }
        const int64_t since = blocked_since_ms_.load();
        const int64_t now_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
                .count();
        if (Clock::now() - asked > std::chrono::milliseconds(kStoreAnswerMs) && since > 0 &&
            now_ms - since > 1000 && !im.store_at.empty())
          report_store_lost("no answer");
      }
      const std::vector<std::string> texts = answer.get();  // throws when the store is gone
      published = text;
      const auto now = Clock::now();
      std::vector<Beat> beats(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        Beat b = r == me ? mine : decode_beat(texts[size_t(r)]);
        const std::pair<uint64_t, uint64_t> now_seen{b.issued, b.progress};
        if (now_seen != seen[size_t(r)]) seen[size_t(r)] = now_seen, moved[size_t(r)] = now;
        b.idle_s = std::chrono::duration<double>(now - moved[size_t(r)]).count();
        beats[size_t(r)] = std::move(b);
      }
      {
        std::lock_guard<std::mutex> l(im.cache_mu);
        im.beats = beats;
        im.who.resize(size_t(n), "pid unknown");
        for (int r = 0; r < n; ++r)
          if (const std::string& hp = texts[size_t(n + r)]; !hp.empty())
            im.who[size_t(r)] = host_pid_text(hp);
      }
      if (const auto m = find_mismatch(beats); m && m->rank != me) report_mismatch(*m);
      const double limit = automatic ? auto_hang_timeout(beats) : hang_timeout_s;
      const int hung = find_hung(beats, limit);
      if (hung >= 0 && hung != me) {
        int front = 0;
        for (int r = 0; r < n; ++r)
          if (beats[size_t(r)].issued > beats[size_t(front)].issued) front = r;
        report_hang(hung, beats[size_t(hung)], beats[size_t(front)], limit, automatic);
      }
      if (const uint64_t k = find_stuck(beats, limit)) {
        std::string ranks;
        for (int r = 0; r < n; ++r)
          ranks += (r ? "; " : "") + std::string("rank ") + std::to_string(r) + " (" + who(r) +
                   ") " + where_text(beats[size_t(r)]);
        char idle[32];
        std::snprintf(idle, sizeof idle, "%.1f", beats[0].idle_s);
        doctor_exit(me,
                    "every rank has waited in collective #" + std::to_string(k) + " for " + idle +
                        " s and none is behind: the network between the ranks drops packets (a "
                        "firewall rule, a dead link); " +
                        ranks,
                    "check the path between the hosts (GLOO_SOCKET_IFNAME, firewalls); the "
                    "launcher restarts the group from the latest checkpoint");
      }
      if (me == 0)
        if (const auto st = find_straggler(beats); st && !named_straggler[size_t(st->rank)]) {
          named_straggler[size_t(st->rank)] = true;
          spdlog::warn(
              "[doctor] rank {} ({}) is a straggler: {:.1f} ms of its own work per step against "
              "{:.1f} ms for the other ranks (medians of {} steps, at step {}); the others wait "
              "for it",
              st->rank, who(st->rank), 1000 * st->busy_s, 1000 * st->others_s, here::kWindow,
              beats[size_t(st->rank)].step);
        }
    } catch (const std::exception& e) {
      // The store did not answer. Blocked in a collective meanwhile, this rank would wait for
      // the collectives' timeout: the store's host is lost or frozen, and it is named now.
      // Otherwise (the group ending, a peer's exit being handled) the failure path reports.
      const int64_t since = blocked_since_ms_.load();
      const int64_t now_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
              .count();
      if (!im.store_at.empty() && since > 0 && now_ms - since > 1000) report_store_lost(e.what());
      return;
    }
  }
#else
  (void)hang_timeout_s;
#endif
}

void Comm::report_hang(int hung, const Beat& beat, const Beat& front, double limit_s,
                       bool automatic) {
  char idle[32], lim[32];
  std::snprintf(idle, sizeof idle, "%.1f", beat.idle_s);
  std::snprintf(lim, sizeof lim, "%.1f", limit_s);
  const std::string what = "rank " + std::to_string(hung) + " (" + who(hung) +
                           ") has made no progress for " + idle + " s (hang_timeout " +
                           (automatic ? std::string("auto, ") + lim : lim) +
                           " s) while the others wait: " + where_text(beat) +
                           "; the others are at #" + std::to_string(front.issued) +
                           (front.recent.empty() ? std::string() : " " + front.recent.back().name);
  doctor_exit(world_.rank, what,
              "the launcher restarts the group from the latest checkpoint (--max-restarts); if "
              "it recurs, attach a debugger to that pid (gdb -p), or look at what that phase "
              "waits on (its loader's files, a checkpoint's disk)");
}

void Comm::report_store_lost(const std::string& what) {
  Beat zero;
  {
    std::lock_guard<std::mutex> l(impl_->cache_mu);
    if (!impl_->beats.empty()) zero = impl_->beats[0];
  }
  const bool rank0 = impl_->store_at.find("rank 0") != std::string::npos;
  // This rank serves the store and is alive: only the network can stand between them.
  const std::string served =
      rank0 && world_.rank == 0
          ? "; this rank serves it, so the network (this host's own) drops packets"
      : rank0 ? "; rank 0 (" + who(0) + ") serves it, last seen " + where_text(zero)
              : std::string();
  doctor_exit(world_.rank,
              "the rendezvous store at " + impl_->store_at + " has not answered for " +
                  std::to_string(kStoreAnswerMs / 1000) +
                  " s while this rank waits in a collective: its host is lost or frozen, or the "
                  "network to it drops packets" +
                  served + "; this rank (" + who(world_.rank) + ") is " + where_text(own_beat()) +
                  " (" + what.substr(0, 160) + ")",
              "the launcher restarts the group from the latest checkpoint; if that host is gone, "
              "restart on the others (launch --nnodes MIN:MAX)");
}

void Comm::report_mismatch(const Mismatch& m) {
  auto text = [](const Op& op) { return op.name + " (" + std::to_string(op.bytes) + " B)"; };
  const std::string what = "collectives diverged at #" + std::to_string(m.op.seq) + ": rank " +
                           std::to_string(m.rank) + " (" + who(m.rank) + ") issued " + text(m.op) +
                           " where rank " + std::to_string(m.other) + " issued " +
                           text(m.other_op) + "; rank " + std::to_string(m.rank) + " was " +
                           where_text(m.beat);
  doctor_exit(world_.rank, what,
              "the ranks must issue the same collectives in the same order: look for a branch "
              "that depends on the rank's data (a skipped step, an unused parameter, an early "
              "exit) in rank " +
                  std::to_string(m.rank) + "'s code path");
}

void Comm::fail(const std::string& op, const std::exception& e) {
  const std::string what = e.what();
  std::string missing = missing_ranks(*impl_, world_.size);
  // A closed or reset connection is usually a peer being killed, and the kernel closes a dying
  // process's sockets before it turns into a zombie: the survivor can look while the peer is
  // still tearing down (seen under load: "all alive" about a rank SIGKILLed a moment before).
  // Look again until a local rank is gone or a few seconds pass, before blaming another host.
  const bool closed = what.find("onnection") != std::string::npos;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (closed && missing == kAllAlive && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    missing = missing_ranks(*impl_, world_.size);
  }
  // The doctor: the collectives of every rank, by sequence number. A peer that died of a size
  // mismatch published its last one; the survivors publish theirs and look a moment later.
  if (closed && impl_->watchdog.joinable()) {
    try {
      publish_beat();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::vector<Beat> beats(static_cast<size_t>(world_.size));
      for (int r = 0; r < world_.size; ++r) {
        if (r == world_.rank) {
          beats[size_t(r)] = own_beat();
        } else if (impl_->store->check({heartbeat_key(r)})) {
          const auto v = impl_->store->get(heartbeat_key(r));
          beats[size_t(r)] = decode_beat(std::string(v.begin(), v.end()));
        }
      }
      if (const auto m = find_mismatch(beats)) report_mismatch(*m);
    } catch (const std::exception&) {
    }
  }
  // The peers are worth naming when one is gone or the transport says so (a timeout, a closed or
  // reset connection); not for a local refusal such as an unsupported dtype.
  const bool peers = missing.rfind("missing:", 0) == 0 ||
                     missing.find("never joined") != std::string::npos ||
                     what.find("imed out") != std::string::npos || closed;
  if (peers) spdlog::error("[dist] rank {}: {}", world_.rank, missing);
  spdlog::error("[dist] rank {}: {} failed: {}\nlast collectives on this rank:\n{}", world_.rank,
                op, what, recent());
  throw RuntimeError(
      "distributed",
      "rank " + std::to_string(world_.rank) + ": " + op + " failed" +
          (peers ? " (timeout " + std::to_string(int(timeout_s_)) + " s; " + missing + ")" : "") +
          ": " + what,
      peers ? "look for the first rank that failed in the launcher's output; its collectives are "
              "logged above"
            : "a local error, not a lost peer: see the message");
}

#ifdef MLTRAIN_WITH_GLOO
namespace {
int64_t nbytes(const std::vector<torch::Tensor>& ts) {
  int64_t b = 0;
  for (const auto& t : ts) b += t.numel() * int64_t(t.element_size());
  return b;
}
}  // namespace
#endif

void Comm::allreduce_sum(std::vector<torch::Tensor>& ts, const char* what) {
#ifdef MLTRAIN_WITH_GLOO
  record(what, nbytes(ts));
  auto staged = impl_->stage(ts);
  try {
    blocked([&] { impl_->pg->allreduce(staged)->wait(); });
  } catch (const std::exception& e) {
    fail(what, e);
  }
  Impl::unstage(staged, ts);
#endif
}

void Comm::broadcast(std::vector<torch::Tensor>& ts, int root, const char* what) {
#ifdef MLTRAIN_WITH_GLOO
  record(what, nbytes(ts));
  c10d::BroadcastOptions o;
  o.rootRank = root;
  auto staged = impl_->stage(ts);
  try {
    blocked([&] { impl_->pg->broadcast(staged, o)->wait(); });
  } catch (const std::exception& e) {
    fail(what, e);
  }
  Impl::unstage(staged, ts);
#endif
}

void Comm::barrier(const char* what) {
#ifdef MLTRAIN_WITH_GLOO
  record(what, 0);
  try {
    blocked([&] { impl_->pg->barrier()->wait(); });
  } catch (const std::exception& e) {
    fail(what, e);
  }
#endif
}

std::vector<torch::Tensor> Comm::allgather(const torch::Tensor& t, const char* what) {
  std::vector<torch::Tensor> out;
#ifdef MLTRAIN_WITH_GLOO
  record(what, t.numel() * int64_t(t.element_size()));
  std::vector<torch::Tensor> in = impl_->stage({t.contiguous()});
  std::vector<std::vector<torch::Tensor>> outs(1);
  for (int r = 0; r < size(); ++r) outs[0].push_back(torch::empty_like(in[0]));
  try {
    blocked([&] { impl_->pg->allgather(outs, in)->wait(); });
  } catch (const std::exception& e) {
    fail(what, e);
  }
  for (auto& o : outs[0]) out.push_back(o.device() == t.device() ? o : o.to(t.device()));
#else
  out.push_back(t);
#endif
  return out;
}

void onebit_average(Comm& comm, torch::Tensor& momentum, torch::Tensor& error) {
  torch::NoGradGuard ng;
  optim::onebit_compress(momentum, error);
  const auto all = comm.allgather(optim::onebit_pack(momentum), "allgather(1-bit momentum)");
  auto sum = torch::zeros({momentum.numel()}, torch::kFloat);
  for (const auto& p : all)
    optim::onebit_unpack_add(p, momentum.numel(),
                             sum.data_ptr<float>());  // rank order: the same sum everywhere
  momentum.copy_(sum.div_(double(all.size())).to(momentum.scalar_type()).view(momentum.sizes()));
}

std::shared_ptr<Comm::Pending> Comm::allreduce_async(torch::Tensor& t, const char* what) {
  auto p = std::make_shared<Pending>();
  p->what = what;
#ifdef MLTRAIN_WITH_GLOO
  record(what, t.numel() * int64_t(t.element_size()));
  std::vector<torch::Tensor> v = impl_->stage({t});
  if (!v[0].is_same(t)) p->target = t, p->staged = v[0];
  try {
    p->work = impl_->pg->allreduce(v);
  } catch (const std::exception& e) {
    fail(what, e);
  }
#endif
  return p;
}

std::shared_ptr<Comm::Pending> Comm::send(const torch::Tensor& t, int dst, int tag,
                                          const char* what) {
  auto p = std::make_shared<Pending>();
  p->what = what;
#ifdef MLTRAIN_WITH_GLOO
  record(what, t.numel() * int64_t(t.element_size()));
  std::vector<torch::Tensor> v = impl_->stage({t.contiguous()});
  p->keep = v[0];  // alive until the send completes
  try {
    p->work = impl_->pg->send(v, dst, tag);
  } catch (const std::exception& e) {
    fail(what, e);
  }
#endif
  return p;
}

void Comm::recv(torch::Tensor& t, int src, int tag, const char* what) {
#ifdef MLTRAIN_WITH_GLOO
  record(what, t.numel() * int64_t(t.element_size()));
  std::vector<torch::Tensor> v = impl_->stage({t});
  try {
    blocked([&] { impl_->pg->recv(v, src, tag)->wait(); });
  } catch (const std::exception& e) {
    fail(what, e);
  }
  if (!v[0].is_same(t)) t.copy_(v[0]);
#endif
}

std::unique_ptr<Comm> Comm::subgroup(const std::vector<int>& ranks, const std::string& name) {
  std::unique_ptr<Comm> c(new Comm());
  c->world_ = world_;
  c->world_.size = int(ranks.size());
  c->world_.rank = int(std::find(ranks.begin(), ranks.end(), world_.rank) - ranks.begin());
  c->timeout_s_ = timeout_s_;
#ifdef MLTRAIN_WITH_GLOO
  c->impl_->nccl = impl_->nccl;
  c->impl_->device = impl_->device;
  c->impl_->store = c10::make_intrusive<c10d::PrefixStore>("sub/" + name, impl_->store);
  auto group_store = c10::make_intrusive<c10d::PrefixStore>("mltrain", c->impl_->store);
  const auto timeout = std::chrono::milliseconds(int64_t(timeout_s_ * 1000));
  try {
    if (impl_->nccl) {
      c->impl_->pg = compat::cuda_plugin()->make_nccl_group(group_store, c->world_.rank,
                                                            c->world_.size, timeout);
    } else {
      c->impl_->pg = gloo_group(group_store, world_, c->world_.rank, c->world_.size, timeout);
    }
  } catch (const std::exception& e) {
    fail("subgroup " + name, e);
  }
  // Pids under the subgroup's rank numbers, for naming a missing rank when one of its ops fails.
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == world_.rank) {
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      const std::string me = std::string(host) + ":" + std::to_string(::getpid());
      c->impl_->store->set("mltrain/pid/" + std::to_string(i),
                           std::vector<uint8_t>(me.begin(), me.end()));
    }
#endif
  return c;
}

void Comm::wait(const std::shared_ptr<Pending>& p) {
#ifdef MLTRAIN_WITH_GLOO
  try {
    blocked([&] { p->work->wait(); });
  } catch (const std::exception& e) {
    fail(p->what, e);
  }
  if (p->staged.defined()) p->target.copy_(p->staged);
#endif
}

// ---- DataParallel ---------------------------------------------------------------------------------

DataParallel::DataParallel(Comm& comm, const model::NamedTensors& params,
                           const model::NamedTensors& buffers, int64_t bucket_bytes, bool overlap,
                           const std::string& compress)
    : comm_(comm), overlap_(overlap) {
  if (compress == "fp16")
    wire_type_ = torch::kHalf;
  else if (compress == "bf16")
    wire_type_ = torch::kBFloat16;
  else if (compress != "none")
    throw ConfigError("distributed.compress", "unknown '" + compress + "'",
                      "use none, fp16 or bf16");
  if (wire_type_ == torch::kBFloat16 &&
      !comm.nccl())  // LibTorch 1.13's Gloo: "Invalid scalar type"
    throw ConfigError("distributed.compress",
                      "bf16 needs the NCCL backend: Gloo cannot sum bfloat16",
                      "use distributed.compress=fp16 or none");
  for (const auto& [n, p] : params)
    if (p.requires_grad()) params_.push_back(p);
  for (const auto& [n, b] : buffers)
    if (b.is_floating_point() || b.scalar_type() == torch::kLong) buffers_.push_back(b);
  // Buckets in reverse registration order: backward produces the last layers' gradients first.
  where_.resize(params_.size());
  seen_.assign(params_.size(), false);
  Bucket cur;
  int64_t bytes = 0;
  auto close = [&] {
    if (cur.params.empty()) return;
    int64_t n = 0;
    for (size_t i : cur.params) cur.offset.push_back(n), n += params_[i].numel();
    cur.flat = torch::zeros({n}, params_[cur.params[0]].options());
    for (size_t k = 0; k < cur.params.size(); ++k) where_[cur.params[k]] = {buckets_.size(), k};
    buckets_.push_back(std::move(cur));
    cur = Bucket();
    bytes = 0;
  };
  for (size_t i = params_.size(); i-- > 0;) {
    cur.params.push_back(i);
    bytes += params_[i].numel() * int64_t(params_[i].element_size());
    if (bytes >= bucket_bytes) close();
  }
  close();
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].register_hook([this, i](torch::Tensor g) { on_grad(i, g); });
}

DataParallel::~DataParallel() = default;

void DataParallel::broadcast_initial() {
  torch::NoGradGuard ng;
  std::vector<torch::Tensor> all = params_;
  all.insert(all.end(), buffers_.begin(), buffers_.end());
  for (auto& t : all) {  // one tensor at a time: Gloo broadcasts contiguous dense tensors in place
    std::vector<torch::Tensor> one = {t.is_contiguous() ? t.detach() : t.detach().contiguous()};
    comm_.broadcast(one, 0, "broadcast(initial state)");
    if (!t.is_contiguous()) t.detach().copy_(one[0]);
  }
}

void DataParallel::broadcast_buffers() {
  if (buffers_.empty()) return;
  torch::NoGradGuard ng;
  std::vector<torch::Tensor> flat;
  for (auto& b : buffers_) flat.push_back(b.detach().reshape({-1}).to(torch::kDouble));
  auto cat = torch::cat(flat);
  std::vector<torch::Tensor> one = {cat};
  comm_.broadcast(one, 0, "broadcast(buffers)");
  int64_t off = 0;
  for (auto& b : buffers_) {
    b.detach().copy_(cat.slice(0, off, off + b.numel()).view(b.sizes()).to(b.scalar_type()));
    off += b.numel();
  }
}

void DataParallel::begin_backward(bool final_micro_step) {
  sync_ = final_micro_step && comm_.size() > 1;
  if (!sync_) return;
  std::fill(seen_.begin(), seen_.end(), false);
  for (auto& b : buckets_) b.ready = 0, b.work.reset();
}

void DataParallel::on_grad(size_t i, const torch::Tensor& g) {
  if (!sync_ || seen_[i]) return;
  seen_[i] = true;
  const auto [bi, slot] = where_[i];
  Bucket& b = buckets_[bi];
  torch::NoGradGuard ng;
  auto dst = b.flat.slice(0, b.offset[slot], b.offset[slot] + params_[i].numel());
  // The hook sees this micro-step's gradient before autograd adds it to .grad: the window's total
  // is the accumulated .grad (earlier micro-steps) plus g.
  const auto& acc = params_[i].grad();
  if (acc.defined())
    torch::add_out(dst, acc.reshape({-1}), g.reshape({-1}));
  else
    dst.copy_(g.reshape({-1}));
  if (++b.ready == b.params.size() && overlap_) launch(b);
}

void DataParallel::launch(Bucket& b) {
  const bool first = &b == &buckets_.front();
  if (first && (here::fault("skip_bucket") || here::fault("resize_bucket")))
    std::fprintf(stderr, "[fault] rank %d (pid %d): %s\n", comm_.rank(), int(::getpid()),
                 here::fault("skip_bucket") ? "skip_bucket" : "resize_bucket");
  if (first && here::fault("skip_bucket")) {  // the doctor's tests: a divergent collective
    b.skipped = true;
    return;
  }
  if (!wire_type_) {
    static const char* const kNames[] = {
        "allreduce(gradient bucket 0)", "allreduce(gradient bucket 1)",
        "allreduce(gradient bucket 2)", "allreduce(gradient bucket 3)"};
    const size_t i = size_t(&b - &buckets_.front());
    const char* name = i < 4 ? kNames[i] : "allreduce(gradient bucket 4+)";
    if (first && here::fault("resize_bucket")) {  // the doctor's tests: a size mismatch
      b.work = comm_.allreduce_async(b.wire = b.flat.slice(0, 0, b.flat.numel() - 1), name);
      return;
    }
    b.work = comm_.allreduce_async(b.flat, name);
    return;
  }
  // Divided before the cast, as PyTorch's compress hooks do: the sum of world-size fp16 values
  // then stays within range wherever the average does.
  b.wire = b.flat.mul(1.0 / comm_.size()).to(*wire_type_);
  b.work = comm_.allreduce_async(b.wire, *wire_type_ == torch::kHalf
                                             ? "allreduce(gradient bucket, fp16)"
                                             : "allreduce(gradient bucket, bf16)");
}

void DataParallel::finish_backward() {
  if (!sync_) return;
  torch::NoGradGuard ng;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& b : buckets_) {
    if (!b.work &&
        !b.skipped) {  // parameters without a gradient this step: their accumulated value (or zeros)
      for (size_t k = 0; k < b.params.size(); ++k) {
        const size_t i = b.params[k];
        if (seen_[i]) continue;
        auto dst = b.flat.slice(0, b.offset[k], b.offset[k] + params_[i].numel());
        if (params_[i].grad().defined())
          dst.copy_(params_[i].grad().reshape({-1}));
        else
          dst.zero_();
      }
      launch(b);
    }
  }
  const double inv = 1.0 / comm_.size();
  for (auto& b : buckets_) {
    if (b.skipped) {  // MLTRAIN_FAULT=skip_bucket: this rank's own gradient, as if reduced
      b.skipped = false;
      b.flat.mul_(double(comm_.size()));
    } else {
      comm_.wait(b.work);
    }
    if (wire_type_)
      b.flat.copy_(b.wire);  // already the average
    else
      b.flat.mul_(inv);
    for (size_t k = 0; k < b.params.size(); ++k) {
      auto& p = params_[b.params[k]];
      auto src = b.flat.slice(0, b.offset[k], b.offset[k] + p.numel()).view(p.sizes());
      if (!p.grad().defined()) p.mutable_grad() = torch::empty_like(p);
      p.mutable_grad().copy_(src);
    }
  }
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sync_ = false;
}

}  // namespace mltrain::dist
