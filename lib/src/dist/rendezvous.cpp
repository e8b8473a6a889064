#include "mltrain/dist/rendezvous.hpp"
#include "mltrain/core/clock.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "mltrain/core/error.hpp"

#ifdef MLTRAIN_WITH_GLOO
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

namespace mltrain::dist {

NodeRange parse_nnodes(const std::string& text) {
  auto number = [&](const std::string& s) {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos)
      throw ConfigError("--nnodes", "'" + text + "' is not N or MIN:MAX",
                        "give a node count (--nnodes 4) or a range (--nnodes 2:4)");
    return std::atoi(s.c_str());
  };
  NodeRange r;
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    r.min = r.max = number(text);
  } else {
    r.min = number(text.substr(0, colon));
    r.max = number(text.substr(colon + 1));
    r.elastic = true;
  }
  if (r.min < 1) throw ConfigError("--nnodes", "needs at least 1 node, got '" + text + "'");
  if (r.min > r.max)
    throw ConfigError("--nnodes",
                      "MIN " + std::to_string(r.min) + " is above MAX " + std::to_string(r.max),
                      "write the smaller count first: --nnodes " + std::to_string(r.max) + ":" +
                          std::to_string(r.min));
  return r;
}

#ifdef MLTRAIN_WITH_GLOO

namespace {
using Clock = std::chrono::steady_clock;
std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
std::string key(int round, const char* what) {
  return "rdzv/round" + std::to_string(round) + "/" + what;
}
void pause() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }  // store polling

// Whether this host's port is taken already (another launcher serves there): then this launcher
// connects without trying to serve, so c10d does not log its failed bind on every node.
bool port_taken(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(uint16_t(port));
  const bool taken =
      ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return taken;
}
}  // namespace

struct Rendezvous::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
  bool serving = false;
  int get_int(const std::string& k) {
    return store->check({k}) ? std::atoi(text(store->get(k)).c_str()) : -1;
  }
  int open_round() { return get_int("rdzv/open"); }
  bool done() { return store->check({"rdzv/done"}); }
};

Rendezvous::Rendezvous(const RendezvousOptions& o) : impl_(std::make_unique<Impl>()), o_(o) {
  c10d::TCPStoreOptions so;
  so.port = uint16_t(o.port);
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(60);
  // The first launcher to bind the port serves the store; the others (and every launcher on other
  // hosts, whose bind fails or whose address is not the endpoint) connect to it, retrying while
  // the server is not up yet.
  const auto t0 = Clock::now();
  std::string last;
  for (bool tried_server = port_taken(o.port);;) {
    try {
      so.isServer = !tried_server;
      tried_server = true;
      impl_->store = c10::make_intrusive<c10d::TCPStore>(o.host, so);
      impl_->serving = so.isServer;
      break;
    } catch (const std::exception& e) {
      last = e.what();
      if (!so.isServer) pause();
    }
    if (o.cancelled && o.cancelled())
      throw RuntimeError("launch", "stopped by a signal while waiting for the rendezvous store");
    if (seconds_since(t0) > o.join_timeout_s)
      throw RuntimeError("launch",
                         "no rendezvous store at " + o.host + ":" + std::to_string(o.port) +
                             " after " + std::to_string(int(o.join_timeout_s)) + " s: " + last,
                         "start a launcher on the --master-addr host, or check the address");
  }
  // The store belongs to one run: the first launcher names it; another run's launcher is refused.
  const std::string owner = text(impl_->store->compareSet("rdzv/run_id", {}, bytes(o.run_id)));
  if (owner != o.run_id)
    throw ConfigError("--rdzv-id",
                      "the rendezvous at " + o.host + ":" + std::to_string(o.port) +
                          " belongs to run '" + owner + "', this launcher is run '" + o.run_id +
                          "'",
                      "give every node of one job the same --rdzv-id, and another job another "
                      "--master-port");
  impl_->store->compareSet("rdzv/open", {}, bytes("0"));
  if (impl_->serving)
    std::fprintf(stderr, "[launch] rendezvous store serving at %s:%d (run %s, %d..%d nodes)\n",
                 o.host.c_str(), o.port, o.run_id.c_str(), o.min_nodes, o.max_nodes);
}

Rendezvous::~Rendezvous() = default;

bool Rendezvous::serving() const { return impl_->serving; }

Round Rendezvous::next_round() {
  Impl& im = *impl_;
  const auto start = Clock::now();
  for (;;) {
    if (im.done()) return Round{0, 0, 0, true};
    // The open round, or the one after it when the open one is already closed (running): then
    // this node waits there, and the running nodes see it waiting.
    int r = im.open_round();
    if (im.store->check({key(r, "size")})) ++r;
    const int idx = int(im.store->add(key(r, "joined"), 1)) - 1;
    auto quorum_at = Clock::time_point::max();
    for (;;) {
      if (im.store->check({key(r, "size")})) {
        const int n = im.get_int(key(r, "size"));
        if (idx < n) return Round{r, idx, n, false};
        break;  // closed without this node: on to the next round
      }
      if (im.done()) return Round{0, 0, 0, true};
      if (o_.cancelled && o_.cancelled()) return Round{r, 0, 0, false, true};
      // Only the open round may close: a newcomer waiting at the next one cannot start a world
      // of its own while the current one runs.
      if (im.open_round() == r) {
        const int joined = int(im.store->add(key(r, "joined"), 0));
        if (joined >= o_.min_nodes && quorum_at == Clock::time_point::max())
          quorum_at = Clock::now();
        if (joined >= o_.max_nodes ||
            (joined >= o_.min_nodes && seconds_since(quorum_at) >= o_.last_call_s))
          im.store->compareSet(key(r, "size"), {},
                               bytes(std::to_string(std::min(joined, o_.max_nodes))));
      } else if (im.open_round() > r) {
        break;  // the nodes moved on past this round
      }
      if (seconds_since(start) > o_.join_timeout_s)
        throw RuntimeError("launch",
                           "fewer than " + std::to_string(o_.min_nodes) + " nodes joined round " +
                               std::to_string(r) + " in " + std::to_string(int(o_.join_timeout_s)) +
                               " s",
                           "start more nodes, or lower MIN in --nnodes MIN:MAX");
      pause();
    }
  }
}

bool Rendezvous::superseded(int round) { return impl_->open_round() > round; }

int Rendezvous::waiting(int round) { return int(impl_->store->add(key(round + 1, "joined"), 0)); }

void Rendezvous::open_next(int round) {
  impl_->store->compareSet("rdzv/open", bytes(std::to_string(round)),
                           bytes(std::to_string(round + 1)));
}

void Rendezvous::finish(int round, int nnodes, double wait_s) {
  Impl& im = *impl_;
  im.store->set("rdzv/done", bytes("1"));
  im.store->add(key(round, "finished"), 1);
  const auto t0 = Clock::now();
  while (im.serving && im.store->add(key(round, "finished"), 0) < nnodes &&
         seconds_since(t0) < wait_s)
    pause();
}

#else

struct Rendezvous::Impl {};
Rendezvous::Rendezvous(const RendezvousOptions& o) : o_(o) {
  throw ConfigError("--nnodes",
                    "an elastic range needs c10d, and this mltrain was built without it",
                    "rebuild with libgloo-dev installed (scripts/install-deps.sh)");
}
Rendezvous::~Rendezvous() = default;
bool Rendezvous::serving() const { return false; }
Round Rendezvous::next_round() { return {}; }
bool Rendezvous::superseded(int) { return false; }
int Rendezvous::waiting(int) { return 0; }
void Rendezvous::open_next(int) {}
void Rendezvous::finish(int, int, double) {}

#endif

}  // namespace mltrain::dist
