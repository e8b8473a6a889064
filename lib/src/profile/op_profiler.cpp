#include "mltrain/profile/op_profiler.hpp"

#include <ATen/record_function.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "mltrain/core/error.hpp"

namespace mltrain::profile {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Frame {
  int64_t start, child;
  int id;
  bool scope = false;        // a charged user scope (Options::backward_scopes)
  bool ends_parent = false;  // a backward function under the synthetic scope just below it
};
struct TraceEvent {
  int id;
  int64_t start, dur;
};
struct Stat {
  int64_t calls = 0, self = 0, total = 0;
};
struct ThreadBuf {
  int tid = 0;
  std::vector<Frame> stack;
  std::vector<TraceEvent> events;
  std::unordered_map<int, Stat> stats;
  std::unordered_map<int, std::map<std::string, int64_t>> dtypes;
  std::vector<int> scopes;                     // the open charged user scopes, innermost last
  std::unordered_map<int64_t, int> seq_scope;  // a forward op's sequence number -> its scope
};

// Callbacks are plain function pointers, so the recorder's state is process-wide.
struct Recorder {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadBuf>> bufs;
  std::vector<std::string> names;
  std::unordered_map<std::string, int> ids;
  std::atomic<uint64_t> generation{1};
  std::atomic<size_t> events{0};
  size_t max_events = 0;
  bool record_dtypes = false;
  std::string backward_prefix;  // user scopes whose backward is charged to "<scope> (backward)"
  int64_t t0 = 0;
  int next_tid = 0;
};
Recorder& rec() {
  static Recorder r;
  return r;
}

thread_local std::shared_ptr<ThreadBuf> tl_buf;
thread_local uint64_t tl_generation = 0;
thread_local std::unordered_map<const char*, int> tl_ids;  // op names are static strings
// User scopes' names are not static, so they are cached by content: without it each call took the
// recorder's lock (an exported MobileNetV3's 191 node scopes a step: 36 % profiler overhead).
thread_local std::unordered_map<std::string, int> tl_user_ids;
// A charged user scope's id -> the id of its "(backward)" name; -1: not a charged scope.
thread_local std::unordered_map<int, int> tl_backward_ids;

ThreadBuf& buf() {
  auto& r = rec();
  const uint64_t g = r.generation.load(std::memory_order_relaxed);
  if (!tl_buf || tl_generation != g) {
    auto b = std::make_shared<ThreadBuf>();
    std::lock_guard<std::mutex> lock(r.mu);
    b->tid = ++r.next_tid;
    r.bufs.push_back(b);
    tl_buf = b;
    tl_generation = g;
  }
  return *tl_buf;
}

int name_id(const at::RecordFunction& fn) {
  const char* n = fn.name();
  const bool user = fn.scope() == at::RecordScope::USER_SCOPE;  // user strings are not static
  if (!user) {
    auto it = tl_ids.find(n);
    if (it != tl_ids.end()) return it->second;
  } else if (auto it = tl_user_ids.find(n); it != tl_user_ids.end()) {
    return it->second;
  }
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  auto [it, inserted] = r.ids.emplace(n, static_cast<int>(r.names.size()));
  if (inserted) r.names.emplace_back(n);
  if (!user)
    tl_ids[n] = it->second;
  else
    tl_user_ids.emplace(n, it->second);  // ids are never reused: the cache stays right
  return it->second;
}

const char* dtype_label(const at::RecordFunction& fn) {
  bool half = false, bf16 = false, f32 = false, f64 = false;
  for (const auto& v : fn.inputs()) {
    if (!v.isTensor()) continue;
    const auto& t = v.toTensor();
    if (!t.defined()) continue;
    switch (t.scalar_type()) {
      case at::kHalf:
        half = true;
        break;
      case at::kBFloat16:
        bf16 = true;
        break;
      case at::kFloat:
        f32 = true;
        break;
      case at::kDouble:
        f64 = true;
        break;
      default:
        break;
    }
  }
  if (bf16) return f32 ? "bf16+fp32" : "bf16";
  if (half) return f32 ? "fp16+fp32" : "fp16";
  if (f32) return "fp32";
  if (f64) return "fp64";
  return "other";
}

// The id of scope `id`'s backward name, or -1 when `id` is not a charged user scope.
int backward_id(int id) {
  if (auto it = tl_backward_ids.find(id); it != tl_backward_ids.end()) return it->second;
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  const std::string& n = r.names[static_cast<size_t>(id)];
  int out = -1;
  if (!r.backward_prefix.empty() && n.rfind(r.backward_prefix, 0) == 0) {
    const std::string bw = n + " (backward)";
    auto [it, inserted] = r.ids.emplace(bw, static_cast<int>(r.names.size()));
    if (inserted) r.names.push_back(bw);
    out = it->second;
  }
  tl_backward_ids.emplace(id, out);
  return out;
}

// The backward of what ran under a charged user scope: autograd gives a node the sequence number
// the forward operator that made it saw (RecordFunction::seqNr on both sides), so the backward
// function's time is charged to that scope's "(backward)" row. CPU autograd runs the backward on
// the thread that called it, the forward's thread, so the table is per thread.
std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  auto& b = buf();
  const int id = name_id(fn);
  const int64_t now = now_ns();
  bool scope = false, ends_parent = false;
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    const int bw = rec().backward_prefix.empty() ? -1 : backward_id(id);
    if (bw >= 0) b.scopes.push_back(bw), scope = true;
  } else if (fn.scope() == at::RecordScope::FUNCTION) {
    if (!b.scopes.empty() && fn.seqNr() >= 0) {
      if (b.seq_scope.size() > (1u << 20)) b.seq_scope.clear();  // forwards never differentiated
      b.seq_scope[fn.seqNr()] = b.scopes.back();                 // the node-making op is last
    }
  } else if (fn.seqNr() >= 0 && !b.seq_scope.empty()) {  // BACKWARD_FUNCTION
    if (auto it = b.seq_scope.find(fn.seqNr()); it != b.seq_scope.end()) {
      b.stack.push_back({now, 0, it->second});
      b.seq_scope.erase(it);
      ends_parent = true;
    }
  }
  b.stack.push_back({now, 0, id, scope, ends_parent});
  if (rec().record_dtypes) ++b.dtypes[id][dtype_label(fn)];
  return nullptr;
}

void close_frame(ThreadBuf& b, int64_t now);

void on_exit(const at::RecordFunction&, at::ObserverContext*) {
  auto& b = buf();
  if (b.stack.empty()) return;  // entered before the profiler started
  const int64_t now = now_ns();
  const bool ends_parent = b.stack.back().ends_parent;
  close_frame(b, now);
  if (ends_parent && !b.stack.empty()) close_frame(b, now);
}

void close_frame(ThreadBuf& b, int64_t now) {
  const Frame f = b.stack.back();
  b.stack.pop_back();
  if (f.scope && !b.scopes.empty()) b.scopes.pop_back();
  const int64_t dur = now - f.start;
  if (!b.stack.empty()) b.stack.back().child += dur;
  auto& s = b.stats[f.id];
  ++s.calls;
  s.self += dur - f.child;
  s.total += dur;
  auto& r = rec();
  if (r.events.load(std::memory_order_relaxed) < r.max_events) {
    r.events.fetch_add(1, std::memory_order_relaxed);
    b.events.push_back({f.id, f.start, dur});
  }
}

}  // namespace

OpProfiler::OpProfiler(Options o) : opt_(o) {}
OpProfiler::~OpProfiler() { stop(); }

void OpProfiler::start() {
  if (active_) return;
  clear();
  auto& r = rec();
  r.max_events = opt_.max_events;
  r.record_dtypes = opt_.record_dtypes;
  r.backward_prefix = opt_.backward_scopes;
  r.t0 = now_ns();
  auto cb = at::RecordFunctionCallback(&on_enter, &on_exit)
                .needsInputs(opt_.record_dtypes)
                .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                         at::RecordScope::USER_SCOPE});
  handle_ = at::addGlobalCallback(cb);
  active_ = true;
}

void OpProfiler::stop() {
  if (!active_) return;
  at::removeCallback(handle_);
  active_ = false;
}

void OpProfiler::clear() {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  r.bufs.clear();
  r.events = 0;
  r.generation.fetch_add(1);
  r.t0 = now_ns();
}

std::vector<OpStat> OpProfiler::top(size_t n) const {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  std::unordered_map<int, Stat> all;
  for (const auto& b : r.bufs)
    for (const auto& [id, s] : b->stats) {
      auto& a = all[id];
      a.calls += s.calls;
      a.self += s.self;
      a.total += s.total;
    }
  std::vector<OpStat> out;
  for (const auto& [id, s] : all)
    out.push_back({r.names[static_cast<size_t>(id)], s.calls, s.self / 1e3, s.total / 1e3});
  std::sort(out.begin(), out.end(),
            [](const OpStat& a, const OpStat& b) { return a.self_us > b.self_us; });
  if (out.size() > n) out.resize(n);
  return out;
}

int64_t OpProfiler::total_calls() const {
  int64_t c = 0;
  for (const auto& s : top(SIZE_MAX)) c += s.calls;
  return c;
}
double OpProfiler::total_self_us() const {
  double t = 0;
  for (const auto& s : top(SIZE_MAX)) t += s.self_us;
  return t;
}
bool OpProfiler::truncated() const { return rec().events.load() >= opt_.max_events; }

std::map<std::string, std::map<std::string, int64_t>> OpProfiler::dtypes() const {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  std::map<std::string, std::map<std::string, int64_t>> out;
  for (const auto& b : r.bufs)
    for (const auto& [id, m] : b->dtypes)
      for (const auto& [k, v] : m) out[r.names[static_cast<size_t>(id)]][k] += v;
  return out;
}

static std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    o += c;
  }
  return o + "\"";
}

int64_t OpProfiler::write_chrome_trace_gz(const std::string& path, size_t cap_bytes) const {
  auto& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  gzFile f = gzopen(tmp.c_str(), "wb6");
  if (!f)
    throw RuntimeError(path, "cannot write the trace", "check the folder exists and is writable");
  size_t bytes = 0;
  int64_t written = 0;
  auto put = [&](const std::string& s) {
    gzwrite(f, s.data(), static_cast<unsigned>(s.size()));
    bytes += s.size();
  };
  put("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"mltrain "
      "profile\"},\"traceEvents\":[\n");
  bool first = true;
  for (const auto& b : r.bufs) {
    std::string meta =
        std::string(first ? "" : ",\n") +
        "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(b->tid) +
        ",\"args\":{\"name\":\"thread " + std::to_string(b->tid) + "\"}}";
    put(meta);
    first = false;
    for (const auto& e : b->events) {
      if (bytes >= cap_bytes) break;
      char line[128];
      std::snprintf(line, sizeof line,
                    ",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", b->tid,
                    (e.start - r.t0) / 1e3, e.dur / 1e3);
      put(",\n{\"name\":" + json_string(r.names[static_cast<size_t>(e.id)]) + line);
      ++written;
    }
  }
  put("\n]}\n");
  if (gzclose(f) != Z_OK)
    throw RuntimeError(path, "writing the trace failed", "check free disk space");
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw RuntimeError(path, "cannot move the trace into place");
  return written;
}

}  // namespace mltrain::profile
