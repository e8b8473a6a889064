#include "mltrain/dist/heartbeat.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace mltrain::dist {

const char* where_name(Phase w) {
  switch (w) {
    case Phase::kSetup:
      return "set-up";
    case Phase::kData:
      return "data";
    case Phase::kCopy:
      return "h2d copy";
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kAllreduce:
      return "all-reduce";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kEvaluation:
      return "evaluation";
    case Phase::kCheckpoint:
      return "checkpoint";
    case Phase::kOther:
    case Phase::kCount:
      return "other";
  }
  return "other";
}

namespace here {
namespace {
std::atomic<int> g_where{int(Phase::kSetup)};
std::atomic<uint64_t> g_progress{0};
std::atomic<int64_t> g_step{0};
std::atomic<double> g_step_med{0}, g_busy_med{0};
std::atomic<int> g_seen{0};
// The window: written by the training thread alone.
std::array<double, kWindow> g_steps{}, g_busy{};
int g_next = 0, g_count = 0;

double median(std::array<double, kWindow> v, int n) {
  std::nth_element(v.begin(), v.begin() + n / 2, v.begin() + n);
  return v[size_t(n / 2)];
}
}  // namespace

namespace {
int g_rank = -1;
struct Fault {
  std::string kind, phase;  // kind: silent, stop, kill, slow, skip_bucket, resize_bucket
  int rank = -1;
  int64_t step = -1;
  double slow_s = -1;  // slow: the sleep per forward, fixed at the first slowed step
  bool cgroup_done = false;
};
Fault& fault_state() {
  static Fault* f = [] {
    auto* x = new Fault;
    const char* env = std::getenv("MLTRAIN_FAULT");
    const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    if (!env || (restart && std::string(restart) != "0")) return x;
    const std::string v = env;
    const auto a = v.find(':'), b = v.find(':', a == std::string::npos ? a : a + 1);
    if (a == std::string::npos || b == std::string::npos) return x;
    std::string kind = v.substr(0, a);
    if (const auto dot = kind.find('.'); dot != std::string::npos)
      x->phase = kind.substr(dot + 1), kind.resize(dot);
    x->kind = kind;
    x->rank = std::atoi(v.c_str() + a + 1);
    x->step = std::atoll(v.c_str() + b + 1);
    return x;
  }();
  return *f;
}

// On entering `w`: the armed fault of this rank, in its step and phase.
void inject(Phase w) {
  Fault& f = fault_state();
  if (f.kind.empty() || f.rank != g_rank) return;
  const int64_t now = g_step.load(std::memory_order_relaxed) + 1;  // the step under way
  if (f.kind == "slow") {
    if (now < f.step || w != Phase::kForward) return;
    if (const char* cg = std::getenv("MLTRAIN_FAULT_CGROUP")) {
      if (!f.cgroup_done) {
        f.cgroup_done = true;
        std::FILE* out = std::fopen((std::string(cg) + "/cgroup.procs").c_str(), "w");
        if (out) std::fprintf(out, "%d\n", int(::getpid())), std::fclose(out);
        std::fprintf(stderr, "[fault] rank %d at step %lld: into the CPU quota of %s\n", g_rank,
                     static_cast<long long>(now), cg);
      }
      return;
    }
    if (f.slow_s < 0) f.slow_s = g_busy_med.load(std::memory_order_relaxed);
    std::this_thread::sleep_for(std::chrono::duration<double>(f.slow_s));
    return;
  }
  if (now != f.step || f.phase != where_name(w)) return;
  std::fprintf(stderr, "[fault] rank %d (pid %d) at step %lld in %s: %s\n", g_rank, int(::getpid()),
               static_cast<long long>(now), where_name(w), f.kind.c_str());
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // long enough to be published
  if (f.kind == "kill") ::raise(SIGKILL);
  if (f.kind == "stop") ::raise(SIGSTOP);
  if (f.kind == "silent" || f.kind == "stop")
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}
}  // namespace

void set_rank(int rank) { g_rank = rank; }
bool fault(const char* kind) {
  const Fault& f = fault_state();
  return f.kind == kind && f.rank == g_rank && g_step.load(std::memory_order_relaxed) + 1 == f.step;
}

void enter(Phase w) {
  if (w == Phase::kData && g_count == 0) w = Phase::kSetup;  // no step done yet in this process
  g_where.store(int(w), std::memory_order_relaxed);
  inject(w);
}
void tick() { g_progress.fetch_add(1, std::memory_order_relaxed); }
void step_done(int64_t step, double step_s, double busy_s) {
  g_steps[size_t(g_next)] = step_s;
  g_busy[size_t(g_next)] = busy_s;
  g_next = (g_next + 1) % kWindow;
  g_count = std::min(g_count + 1, kWindow);
  g_step_med.store(median(g_steps, g_count), std::memory_order_relaxed);
  g_busy_med.store(median(g_busy, g_count), std::memory_order_relaxed);
  g_seen.store(g_count, std::memory_order_relaxed);
  g_step.store(step, std::memory_order_relaxed);
  tick();
}
Phase where() { return Phase(g_where.load(std::memory_order_relaxed)); }
uint64_t progress() { return g_progress.load(std::memory_order_relaxed); }
int64_t step() { return g_step.load(std::memory_order_relaxed); }
double step_median_s() { return g_step_med.load(std::memory_order_relaxed); }
double busy_median_s() { return g_busy_med.load(std::memory_order_relaxed); }
int steps_seen() { return g_seen.load(std::memory_order_relaxed); }
void reset() {
  g_where = int(Phase::kSetup);
  g_progress = 0;
  g_step = 0;
  g_step_med = g_busy_med = 0;
  g_seen = 0;
  g_next = g_count = 0;
}
}  // namespace here

// "issued where step progress step_s busy_s steps\n" then "seq bytes name\n" per recent op.
std::string encode_beat(const Beat& b) {
  std::ostringstream o;
  o.precision(6);
  o << b.issued << " " << int(b.where) << " " << b.step << " " << b.progress << " " << b.step_s
    << " " << b.busy_s << " " << b.steps << "\n";
  for (const auto& op : b.recent) o << op.seq << " " << op.bytes << " " << op.name << "\n";
  return o.str();
}

Beat decode_beat(const std::string& text) {
  Beat b;
  std::istringstream in(text);
  std::string head;
  if (!std::getline(in, head)) return b;
  std::istringstream h(head);
  int where = 0;
  if (!(h >> b.issued >> where >> b.step >> b.progress >> b.step_s >> b.busy_s >> b.steps))
    return Beat{};
  b.where = where >= 0 && where < int(Phase::kCount) ? Phase(where) : Phase::kOther;
  for (std::string line; std::getline(in, line);) {
    std::istringstream l(line);
    Op op;
    if (!(l >> op.seq >> op.bytes)) continue;
    std::getline(l >> std::ws, op.name);
    b.recent.push_back(op);
  }
  return b;
}

int find_hung(const std::vector<Beat>& beats, double timeout_s) {
  if (beats.size() < 2 || timeout_s <= 0) return -1;
  uint64_t most = 0;
  for (const auto& b : beats) most = std::max(most, b.issued);
  int hung = -1;
  for (size_t r = 0; r < beats.size(); ++r) {
    const auto& b = beats[r];
    const bool slow_phase =
        b.where == Phase::kSetup || b.where == Phase::kCheckpoint || b.step == 0;
    const double limit = slow_phase ? std::max(timeout_s, kSlowPhaseS) : timeout_s;
    // Level with the front, still moving, or not yet at its first collective (still loading its
    // data or model: the collective timeout covers a rank that never gets there).
    if (b.issued >= most || b.idle_s < limit || b.issued == 0) continue;
    if (hung < 0 || b.issued < beats[size_t(hung)].issued) hung = int(r);
  }
  return hung;
}

uint64_t find_stuck(const std::vector<Beat>& beats, double timeout_s) {
  if (beats.size() < 2 || timeout_s <= 0) return 0;
  for (const auto& b : beats)
    if (b.issued == 0 || b.issued != beats[0].issued || b.idle_s < timeout_s || b.step <= 0 ||
        b.where == Phase::kSetup || b.where == Phase::kCheckpoint)
      return 0;
  return beats[0].issued;
}

double auto_hang_timeout(const std::vector<Beat>& beats) {
  double slowest = 0;
  for (const auto& b : beats) slowest = std::max(slowest, b.step_s);
  return std::max(2 * slowest, 7.0);
}

std::optional<Mismatch> find_mismatch(const std::vector<Beat>& beats) {
  // seq -> the ops the ranks issued under it, with their ranks
  std::map<uint64_t, std::vector<std::pair<int, const Op*>>> by_seq;
  for (size_t r = 0; r < beats.size(); ++r)
    for (const auto& op : beats[r].recent) by_seq[op.seq].push_back({int(r), &op});
  for (const auto& [seq, ops] : by_seq) {
    if (ops.size() < 2) continue;
    // Group the ranks by what they issued; the group of the lowest rank comes first.
    std::vector<std::vector<std::pair<int, const Op*>>> groups;
    for (const auto& e : ops) {
      auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& grp) {
        return grp[0].second->name == e.second->name && grp[0].second->bytes == e.second->bytes;
      });
      if (g == groups.end())
        groups.push_back({e});
      else
        g->push_back(e);
    }
    if (groups.size() < 2) continue;
    size_t ref = 0;  // the largest group; ties keep the lowest rank's
    for (size_t g = 1; g < groups.size(); ++g)
      if (groups[g].size() > groups[ref].size()) ref = g;
    const size_t odd = ref == 0 ? 1 : 0;
    Mismatch m;
    m.rank = groups[odd][0].first;
    m.op = *groups[odd][0].second;
    m.other = groups[ref][0].first;
    m.other_op = *groups[ref][0].second;
    m.beat = beats[size_t(m.rank)];
    return m;
  }
  return std::nullopt;
}

std::optional<Straggler> find_straggler(const std::vector<Beat>& beats, double ratio,
                                        double floor_s) {
  std::vector<int> full;
  for (size_t r = 0; r < beats.size(); ++r)
    if (beats[r].steps >= here::kWindow && beats[r].busy_s > 0) full.push_back(int(r));
  if (full.size() < 2) return std::nullopt;
  std::optional<Straggler> worst;
  for (const int r : full) {
    std::vector<double> others;
    for (const int o : full)
      if (o != r) others.push_back(beats[size_t(o)].busy_s);
    std::sort(others.begin(), others.end());
    const size_t n = others.size();
    const double med = n % 2 ? others[n / 2] : (others[n / 2 - 1] + others[n / 2]) / 2;
    const double mine = beats[size_t(r)].busy_s;
    if (mine > ratio * med && mine - med > floor_s &&
        (!worst || mine / med > worst->busy_s / worst->others_s))
      worst = Straggler{r, mine, med};
  }
  return worst;
}

}  // namespace mltrain::dist
