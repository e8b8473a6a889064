#pragma once
// Pruners of `mltrain tune`: decide from intermediate values (reported at each evaluation) whether
// a running trial should stop. Resources are counted in reports (the k-th report of a trial is
// resource k, whatever the step numbers say).
//   none
//   median / percentile P: the reference is the complete trials (pruned ones never: a trial that
//       was stopped says nothing about how far a good one goes), after n_startup_trials of them
//       and n_warmup_steps reports. Its "good finishers" are those whose final value lies within
//       percentile P / 2 of the finals (at least two). A trial is pruned when its best value so
//       far is worse than every good finisher's value at the same report by more than half the
//       reports' noise (the residual sd of the complete curves' latter halves around a
//       quadratic): it can no longer follow any curve that ended well. Where curves keep their
//       order this prunes about as Optuna's median/percentile rule does (the percentile of every
//       complete trial at that step);
//       where they cross (a slow start, the best end) the good finishers' own slow starts set the
//       bar. Measured against Optuna in scripts/bench/tune/curves.py.
//   asha (asynchronous successive halving, Li et al. 2020): rungs at min_resource * eta^j reports
//       past the first (the first report is the starting line; Optuna counts steps from 0 the
//       same way); a trial reaching a rung continues only when it is in the top 1/eta of the
//       trials seen there. Set max_resource to a trial's evaluations and the last one is never
//       judged (a trial stopped at its end saves nothing and is lost as a complete result).
//   hyperband: trials spread over brackets (asha with min_resource * eta^b); each bracket
//       compares its own trials only
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mltrain/config/study.hpp"

namespace mltrain::tune {

// The study file's pruner settings, declared once in config/study.hpp (hyperband's max_resource:
// the largest resource, in reports, a trial can use; 0: 27 * min_resource).
using PrunerOptions = config::PrunerSettings;

struct TrialCurve {
  int number = 0;
  bool finished = false;       // COMPLETE or PRUNED
  bool complete = false;       // COMPLETE
  std::vector<double> values;  // minimisation sense, one per report
};

class Pruner {
 public:
  virtual ~Pruner() = default;
  virtual bool should_prune(const TrialCurve& me, const std::vector<TrialCurve>& others) const = 0;
};

std::unique_ptr<Pruner> make_pruner(
    const PrunerOptions& o);  // std::invalid_argument for an unknown name
int hyperband_bracket(const PrunerOptions& o, int trial_number);

}  // namespace mltrain::tune
