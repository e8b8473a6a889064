#pragma once
// Operator-level profiler on LibTorch's RecordFunction callbacks (the hooks torch.profiler's CPU
// side is built on), so it works the same on LibTorch 1.13 and 2.x without Kineto: per-operator
// call counts, self and total CPU time, a Chrome trace (opens in Perfetto), and optionally the
// dtypes each operator saw (autocast coverage for `mltrain checklist`).
//
//   OpProfiler prof({.record_dtypes = false});
//   prof.start();  ...run steps...  prof.stop();
//   for (auto& op : prof.top(20)) ...;
//   prof.write_chrome_trace_gz("trace.json.gz", 32 << 20);
//
// Times are host CPU time between an op's entry and exit. On CUDA the kernels run asynchronously,
// so there they measure launch cost; the phase clock (trainer.hpp) gives synchronised GPU time.
// One profiler may be active per process.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mltrain::profile {

struct OpStat {
  std::string name;
  int64_t calls = 0;
  double self_us = 0, total_us = 0;
};

class OpProfiler {
 public:
  struct Options {
    bool record_dtypes = false;  // note the floating dtypes of each op's tensor inputs
    size_t max_events = 500000;  // trace events kept (stats continue past it)
    // User scopes named with this prefix (an exported program's nodes, model::kNodeScope) also
    // get the backward of what ran under them: a row "<scope> (backward)" holding the autograd
    // functions of the nodes their operators made. Empty: off.
    std::string backward_scopes{};
  };
  explicit OpProfiler(Options o);
  ~OpProfiler();
  void start();
  void stop();
  void clear();  // drop what was recorded so far (end of a warm-up)

  std::vector<OpStat> top(size_t n) const;  // by self time
  int64_t total_calls() const;
  double total_self_us() const;
  bool truncated() const;
  // op name -> {"bf16": calls, "fp32": calls, ...}; only with record_dtypes.
  std::map<std::string, std::map<std::string, int64_t>> dtypes() const;
  // Gzipped Chrome trace; stops adding events once the uncompressed JSON reaches cap_bytes.
  // Returns the number of events written.
  int64_t write_chrome_trace_gz(const std::string& path, size_t cap_bytes) const;

 private:
  Options opt_;
  uint64_t handle_ = 0;
  bool active_ = false;
};

}  // namespace mltrain::profile
