#pragma once
// Pruners of `mltrain tune`: decide from intermediate values (reported at each evaluation) whether
// a running trial should stop. Resources are counted in reports: the k-th report of a trial is
// resource k (k = 1, 2, ...), whatever the step numbers say, so rungs mean "evaluations".
//   none
//   median / percentile: stop when the trial's best value so far is worse than the given
//       percentile of the other trials' values at the same report (after n_startup_trials
//       finished trials and n_warmup_steps reports)
//   asha (asynchronous successive halving, Li et al. 2020): rungs at min_resource * eta^k; a trial
//       reaching a rung continues only when it is in the top 1/eta of the trials seen there
//   hyperband: trials spread over brackets (asha with min_resource * eta^b); each bracket
//       compares its own trials only
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mltrain/config/study.hpp"

namespace mltrain::tune {

// The schema's defaults (config/study.hpp declares each pruner setting once).
inline const config::PrunerSettings& pruner_defaults() {
  static const config::PrunerSettings d;
  return d;
}

struct PrunerOptions {
  std::string name = pruner_defaults().name;
  int n_startup_trials = static_cast<int>(pruner_defaults().n_startup_trials);
  int n_warmup_steps = static_cast<int>(pruner_defaults().n_warmup_steps);
  double percentile = pruner_defaults().percentile;
  int min_resource = static_cast<int>(pruner_defaults().min_resource);
  // hyperband: the largest resource (reports) a trial can use; 0: 27 * min_resource
  int max_resource = static_cast<int>(pruner_defaults().max_resource);
  int reduction_factor = static_cast<int>(pruner_defaults().reduction_factor);
};

struct TrialCurve {
  int number = 0;
  bool finished = false;       // COMPLETE or PRUNED
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
