#pragma once
// Learning-rate schedules as pure functions of the step, so a resumed run cannot drift (the
// recursive updates of PyTorch's schedulers accumulate rounding and misbehave on resume:
// pytorch #49630, #65342). Issue #3 extends the set; the trainer only calls this.
//
//   double lr = scheduled_lr(cfg.optim, /*step=*/t, /*total_steps=*/T);
#include <cstdint>

#include "mltrain/config/experiment.hpp"

namespace mltrain::optim {

// constant: lr. cosine: CosineAnnealingLR's closed form with T_max = total_steps,
// eta_min + (lr - eta_min) * (1 + cos(pi * t / T)) / 2, held at eta_min after T.
double scheduled_lr(const config::OptimConfig& cfg, int64_t step, int64_t total_steps);

}  // namespace mltrain::optim
