#pragma once
// Pipeline parallelism's pure parts: the order in which one stage runs its micro-batches' forward
// and backward passes, and the cut of a model's units into stages balanced by measured time. The
// trainer's stage engine (train/stages.hpp) executes these; the tests check them on their own.
//
//   auto ops = pipe_schedule(PipeKind::k1F1B, /*stages=*/4, /*stage=*/1, /*microbatches=*/8);
//   for (auto op : ops) op.forward ? run_forward(op.micro) : run_backward(op.micro);
//   auto bounds = balance_stages({3.0, 1.0, 1.0, 1.0, 2.0}, 2);  // {0, 2, 5}: unit ranges
#include <cstdint>
#include <string>
#include <vector>

namespace mltrain::dist {

enum class PipeKind { kGPipe, k1F1B };
PipeKind pipe_kind(const std::string& name);  // "gpipe" | "1f1b"

struct PipeOp {
  bool forward = true;
  int64_t micro = 0;
  bool operator==(const PipeOp& o) const { return forward == o.forward && micro == o.micro; }
};

// One stage's ops for one batch. GPipe (Huang et al. 2019): every forward, then every backward in
// reverse. 1F1B (PipeDream-Flush, Narayanan et al. 2021): stages-stage-1 warm-up forwards, then
// one forward and one backward alternately, then the remaining backwards; a stage holds at most
// stages-stage activations instead of M. Both give the same gradients.
std::vector<PipeOp> pipe_schedule(PipeKind kind, int64_t stages, int64_t stage,
                                  int64_t microbatches);

// The most micro-batches' activations the schedule holds at once on that stage.
int64_t pipe_in_flight(const std::vector<PipeOp>& ops);

// Contiguous, non-empty unit ranges for `stages` stages minimising the slowest stage's summed
// time (exact, by dynamic programming): bounds[s]..bounds[s+1] are stage s's units.
std::vector<int64_t> balance_stages(const std::vector<double>& unit_seconds, int64_t stages);

// The bubble of a synchronous schedule with equal stages: (S - 1) / (M + S - 1).
inline double theoretical_bubble(int64_t stages, int64_t microbatches) {
  return double(stages - 1) / double(microbatches + stages - 1);
}
// distributed.pipeline.microbatches: auto — the fewest micro-batches M whose theoretical bubble
// (S-1)/(M+S-1) is at most `target`, capped at `batch` (a micro-batch holds at least one sample).
inline int64_t microbatches_for_bubble(int64_t stages, double target, int64_t batch) {
  int64_t m = 1;
  while (m < batch && theoretical_bubble(stages, m) > target) ++m;
  return m;
}

}  // namespace mltrain::dist
