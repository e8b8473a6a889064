#include "mltrain/optim/schedule.hpp"

#include <algorithm>
#include <cmath>

namespace mltrain::optim {

double scheduled_lr(const config::OptimConfig& o, int64_t step, int64_t total_steps) {
  if (o.schedule == "cosine") {
    const double t = static_cast<double>(std::min(step, total_steps)) / static_cast<double>(std::max<int64_t>(1, total_steps));
    return o.eta_min + (o.lr - o.eta_min) * (1 + std::cos(M_PI * t)) / 2;
  }
  return o.lr;
}

}  // namespace mltrain::optim
