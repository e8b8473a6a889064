#include "mltrain/dist/pipe_schedule.hpp"

#include <algorithm>
#include <limits>

#include "mltrain/core/error.hpp"

namespace mltrain::dist {

PipeKind pipe_kind(const std::string& name) {
  if (name == "gpipe") return PipeKind::kGPipe;
  if (name == "1f1b") return PipeKind::k1F1B;
  throw ConfigError("distributed.pipeline.schedule", "unknown '" + name + "'", "use gpipe or 1f1b");
}

std::vector<PipeOp> pipe_schedule(PipeKind kind, int64_t stages, int64_t stage,
                                  int64_t microbatches) {
  std::vector<PipeOp> ops;
  const int64_t m = microbatches;
  if (kind == PipeKind::kGPipe) {
    for (int64_t i = 0; i < m; ++i) ops.push_back({true, i});
    for (int64_t i = m; i-- > 0;) ops.push_back({false, i});
    return ops;
  }
  const int64_t warmup = std::min(stages - stage - 1, m);
  int64_t f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({true, f});
  while (f < m) {  // steady state: one forward, one backward
    ops.push_back({true, f++});
    ops.push_back({false, b++});
  }
  while (b < m) ops.push_back({false, b++});
  return ops;
}

int64_t pipe_in_flight(const std::vector<PipeOp>& ops) {
  int64_t now = 0, most = 0;
  for (const auto& op : ops) most = std::max(most, now += op.forward ? 1 : -1);
  return most;
}

std::vector<int64_t> balance_stages(const std::vector<double>& t, int64_t stages) {
  const int64_t n = int64_t(t.size());
  if (stages < 1 || stages > n)
    throw ConfigError("distributed.pipeline.stages",
                      std::to_string(stages) + " stages for a model of " + std::to_string(n) +
                          " units (layers or blocks)",
                      "use at most " + std::to_string(n) + " stages, or a deeper model");
  std::vector<double> prefix(size_t(n) + 1, 0);
  for (int64_t i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + t[size_t(i)];
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][i]: the slowest stage when the first i units form s stages; cut[s][i]: where the
  // last of them starts.
  std::vector<std::vector<double>> best(size_t(stages) + 1,
                                        std::vector<double>(size_t(n) + 1, inf));
  std::vector<std::vector<int64_t>> cut(size_t(stages) + 1, std::vector<int64_t>(size_t(n) + 1));
  best[0][0] = 0;
  for (int64_t s = 1; s <= stages; ++s)
    for (int64_t i = s; i <= n; ++i)
      for (int64_t j = s - 1; j < i; ++j) {
        const double v =
            std::max(best[size_t(s) - 1][size_t(j)], prefix[size_t(i)] - prefix[size_t(j)]);
        if (v < best[size_t(s)][size_t(i)])
          best[size_t(s)][size_t(i)] = v, cut[size_t(s)][size_t(i)] = j;
      }
  std::vector<int64_t> bounds(size_t(stages) + 1, n);
  for (int64_t s = stages, i = n; s > 0; --s) {
    bounds[size_t(s)] = i;
    i = cut[size_t(s)][size_t(i)];
    bounds[size_t(s) - 1] = i;
  }
  return bounds;
}

}  // namespace mltrain::dist
