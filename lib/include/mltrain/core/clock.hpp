#pragma once
// Intervals on the steady clock, in seconds (every timer of the engine: steps, evaluations,
// rendezvous deadlines, checklist items).
//   const auto t0 = SteadyClock::now(); ...; double s = seconds_since(t0);
#include <chrono>

namespace mltrain {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

}  // namespace mltrain
