#pragma once
// Where a training process is: one enum for the two readers of that fact. The trainer marks each
// moment once (train::Trainer::enter), and the mark feeds both the profiler's phase clock (how a
// step's wall time splits, `mltrain profile`) and the hang doctor's heartbeat (what a silent rank
// was doing, dist/heartbeat.hpp).
//
//   trainer.enter(Phase::kForward);   // the clock charges what ran since the last mark to the
//                                     // phase it leaves; the doctor now says "in forward"
#include <cstddef>

namespace mltrain {

enum class Phase : int {
  // A step's phases: the profiler's clock keeps one sum each (profile.json's keys, in this order).
  kData,
  kCopy,  // host-to-device copy of the batch
  kForward,
  kBackward,
  kOptimizer,
  kAllreduce,
  kOther,  // logging, observers, evaluation and checkpoints between steps
  // Outside a step: the doctor names them; the clock charges their time to kOther.
  kSetup,  // before this process's first step: loading data and model, joining the group
  kEvaluation,
  kCheckpoint,
  kCount
};

// The phases the clock sums (kData .. kOther).
constexpr std::size_t kStepPhases = static_cast<std::size_t>(Phase::kOther) + 1;

// The profiler's key for a step phase ("data", "h2d_copy", ...); "other" for the rest.
inline const char* phase_name(Phase p) {
  static constexpr const char* names[kStepPhases] = {
      "data", "h2d_copy", "forward", "backward", "optimizer", "allreduce", "other"};
  const auto i = static_cast<std::size_t>(p);
  return i < kStepPhases ? names[i] : "other";
}

}  // namespace mltrain
