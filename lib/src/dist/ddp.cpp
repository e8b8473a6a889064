#include "mltrain/dist/ddp.hpp"

#include <spdlog/spdlog.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
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
#ifdef MLTRAIN_WITH_NCCL_PG
#include "nccl_group.hpp"
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
#ifdef MLTRAIN_WITH_NCCL_PG
  return true;
#else
  return false;
#endif
}

struct Comm::Impl {
#ifdef MLTRAIN_WITH_GLOO
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<compat::C10dGroup> pg;
#endif
  torch::Device device = torch::kCPU;  // where the group's tensors must live
  bool nccl = false;
  std::thread watchdog;  // distributed.hang_timeout: Comm::watch()
  std::mutex watch_mu;
  std::condition_variable watch_cv;
  bool stop_watch = false;
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
Comm::~Comm() {
  if (impl_->watchdog.joinable()) {
    {
      std::lock_guard<std::mutex> l(impl_->watch_mu);
      impl_->stop_watch = true;
    }
    impl_->watch_cv.notify_all();
    impl_->watchdog.join();
  }
#ifdef MLTRAIN_WITH_NCCL_PG
  if (impl_->nccl && impl_->pg) detail::shutdown_nccl_group(impl_->pg);
#endif
}

#ifdef MLTRAIN_WITH_GLOO
// The rendezvous store, following the launcher: torchrun's own TCPStore, a FileStore on one node,
// else a TCPStore served by rank 0. *kind names it for the log.
static c10::intrusive_ptr<c10d::Store> make_store(const World& w, const CommOptions& o,
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
    const fs::path dir = o.store_dir.empty() ? fs::temp_directory_path() : fs::path(o.store_dir);
    const fs::path path = dir / ("mltrain-store-" + w.run_id + "-" + std::to_string(w.size));
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
  if (nccl && !nccl_group_compiled())
    throw ConfigError("distributed.backend",
                      "nccl is not available in this build (no CUDA LibTorch with nccl.h)",
                      "use distributed.backend=gloo, or build with -DMLTRAIN_WITH_CUDA=ON against "
                      "a CUDA LibTorch");
  if (nccl && !o.device.is_cuda())
    throw ConfigError("distributed.backend",
                      "nccl moves CUDA tensors only, and this run trains on the CPU",
                      "set runtime.device=cuda, or distributed.backend=gloo");
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
  c->impl_->store = make_store(w, o, timeout, &store_kind);
  c->impl_->store->setTimeout(timeout);
  auto group_store = c10::make_intrusive<c10d::PrefixStore>("mltrain", c->impl_->store);
  try {
    if (nccl) {
#ifdef MLTRAIN_WITH_NCCL_PG
      // A collective that outlives the timeout raises in wait() (blocking wait) instead of the
      // watchdog aborting the process, so the failure path below names the missing ranks.
      ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 0);
      ::setenv("NCCL_BLOCKING_WAIT", "1", 0);  // its name before LibTorch 2.2
      c->impl_->pg = detail::make_nccl_group(group_store, w.rank, w.size, timeout);
#endif
    } else {
      c->impl_->pg = gloo_group(group_store, w, w.rank, w.size, timeout);
    }
  } catch (const std::exception& e) {
    throw RuntimeError("distributed",
                       std::string("rank ") + std::to_string(w.rank) + " could not join the " +
                           (nccl ? "NCCL" : "Gloo") + " group: " + e.what(),
                       "check that every rank started and MASTER_ADDR/MASTER_PORT match");
  }
  // Who is who, for naming the missing ranks when a collective fails.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = std::string(host) + ":" + std::to_string(::getpid());
  c->impl_->store->set("mltrain/pid/" + std::to_string(w.rank),
                       std::vector<uint8_t>(me.begin(), me.end()));
  spdlog::info("[dist] rank {}/{} (local {}/{}, node {}/{}, {}) joined {} over {}", w.rank, w.size,
               w.local_rank, w.local_size, w.node_rank, w.nodes, w.source,
               nccl ? "NCCL on " + c->impl_->device.str() : std::string("Gloo"), store_kind);
  if (o.hang_timeout_s > 0 && w.size > 1) {
    Comm* self = c.get();
    c->impl_->watchdog = std::thread([self, h = o.hang_timeout_s] { self->watch(h); });
  }
  return c;
#endif
}

bool Comm::nccl() const { return impl_->nccl; }

void Comm::record(const char* op, int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  std::ostringstream o;
  o << "#" << ++seq_ << " " << op << " " << bytes << " B";
  ring_.push_back(o.str());
  if (ring_.size() > 32) ring_.pop_front();
  bytes_ += bytes;
}

std::string Comm::recent() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string s;
  for (const auto& r : ring_) s += "  " + r + "\n";
  return s;
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
      if (hp.substr(0, colon) == host && pid > 0 && process_gone(pid))
        gone += (gone.empty() ? "rank " : ", rank ") + std::to_string(r) + " (pid " +
                std::to_string(pid) + ")";
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

namespace {
std::string heartbeat_key(int rank) { return "mltrain/heartbeat/" + std::to_string(rank); }
}  // namespace

// The watchdog: every fifth of the timeout (50 ms .. 1 s) publish this rank's collective count
// and last collective when it changed, read the others', and stop the group when one is hung.
void Comm::watch(double hang_timeout_s) {
#ifdef MLTRAIN_WITH_GLOO
  using Clock = std::chrono::steady_clock;
  Impl& im = *impl_;
  const auto period =
      std::chrono::milliseconds(std::clamp<int64_t>(int64_t(hang_timeout_s * 200), 50, 1000));
  const int n = world_.size, me = world_.rank;
  std::vector<uint64_t> seen(size_t(n), 0);
  std::vector<std::string> last(static_cast<size_t>(n));
  std::vector<Clock::time_point> moved(size_t(n), Clock::now());
  uint64_t published = UINT64_MAX;
  std::unique_lock<std::mutex> lock(im.watch_mu);
  while (!im.watch_cv.wait_for(lock, period, [&] { return im.stop_watch; })) {
    lock.unlock();  // the destructor may stop the watch while the store is slow to answer
    struct Relock {
      std::unique_lock<std::mutex>& l;
      ~Relock() { l.lock(); }
    } relock{lock};
    try {
      uint64_t issued = 0;
      std::string op = "none yet";
      {
        std::lock_guard<std::mutex> l(mu_);
        issued = seq_;
        if (!ring_.empty()) op = ring_.back();
      }
      if (issued != published) {
        const std::string v = std::to_string(issued) + "\n" + op;
        im.store->set(heartbeat_key(me), std::vector<uint8_t>(v.begin(), v.end()));
        published = issued;
      }
      const auto now = Clock::now();
      std::vector<Beat> beats(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        uint64_t s = issued;
        std::string o = op;
        if (r != me) {
          s = 0, o = "none yet";
          if (im.store->check({heartbeat_key(r)})) {
            const auto v = im.store->get(heartbeat_key(r));
            const std::string text(v.begin(), v.end());
            const auto nl = text.find('\n');
            s = std::strtoull(text.c_str(), nullptr, 10);
            if (nl != std::string::npos) o = text.substr(nl + 1);
          }
        }
        if (s != seen[size_t(r)]) seen[size_t(r)] = s, moved[size_t(r)] = now;
        last[size_t(r)] = o;
        beats[size_t(r)] = {s, std::chrono::duration<double>(now - moved[size_t(r)]).count()};
      }
      const int hung = find_hung(beats, hang_timeout_s);
      if (hung >= 0 && hung != me) {
        int front = 0;
        for (int r = 0; r < n; ++r)
          if (beats[size_t(r)].issued > beats[size_t(front)].issued) front = r;
        report_hang(hung, beats[size_t(hung)].idle_s, last[size_t(hung)], last[size_t(front)],
                    hang_timeout_s);
      }
    } catch (const std::exception&) {
      return;  // the store is gone (its host exited): the collectives' own failure path reports
    }
  }
#else
  (void)hang_timeout_s;
#endif
}

// Names the hung rank (host and pid from the rendezvous, its last collective from its heartbeat)
// and ends this process: the main thread is blocked in a collective the hung rank never joins,
// so only an exit lets the launcher see a failure and restart the group.
void Comm::report_hang(int hung, double idle_s, const std::string& hung_op,
                       const std::string& front_op, double hang_timeout_s) {
  std::string who = "pid unknown";
#ifdef MLTRAIN_WITH_GLOO
  try {
    const auto key = "mltrain/pid/" + std::to_string(hung);
    if (impl_->store->check({key})) {
      const auto v = impl_->store->get(key);
      who = std::string(v.begin(), v.end());
      const auto colon = who.rfind(':');
      if (colon != std::string::npos)
        who = "host " + who.substr(0, colon) + ", pid " + who.substr(colon + 1);
    }
  } catch (const std::exception&) {
  }
#endif
  char idle[32];
  std::snprintf(idle, sizeof idle, "%.1f", idle_s);
  const std::string what = "rank " + std::to_string(hung) + " (" + who +
                           ") has made no progress for " + idle + " s (hang_timeout " +
                           std::to_string(int(hang_timeout_s)) +
                           " s) while the others wait; its last collective: " + hung_op +
                           "; the others are at: " + front_op;
  spdlog::error("[dist] rank {}: {}", world_.rank, what);
  spdlog::default_logger()->flush();
  std::fprintf(stderr,
               "error: distributed: %s\n  fix: the launcher restarts the group from the latest "
               "checkpoint (--max-restarts); if it recurs, attach a debugger to that pid (gdb -p) "
               "or raise distributed.hang_timeout above the longest checkpoint write\n",
               what.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(1);
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
    impl_->pg->allreduce(staged)->wait();
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
    impl_->pg->broadcast(staged, o)->wait();
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
    impl_->pg->barrier()->wait();
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
    impl_->pg->allgather(outs, in)->wait();
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
    impl_->pg->recv(v, src, tag)->wait();
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
#ifdef MLTRAIN_WITH_NCCL_PG
      c->impl_->pg = detail::make_nccl_group(group_store, c->world_.rank, c->world_.size, timeout);
#endif
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
    p->work->wait();
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
  if (!wire_type_) {
    b.work = comm_.allreduce_async(b.flat, "allreduce(gradient bucket)");
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
    if (!b.work) {  // parameters without a gradient this step: their accumulated value (or zeros)
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
    comm_.wait(b.work);
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
