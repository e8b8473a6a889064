#pragma once
// What a study leaves behind (written after every `mltrain tune` run and by `mltrain tune report`):
//   trials.csv, trials.jsonl   one row per trial: number, state, value, params, duration, reason
//   best.yaml                  trial.train: the full resolved config of the best trial, runnable by
//                              `mltrain train best.yaml` as is (run.name <study>_best); otherwise the
//                              best parameters
//   importance.json            per parameter: PED-ANOVA-style importance (how differently the top
//                              trials are distributed from all trials, Pearson divergence of the
//                              two densities, normalised to sum 1) and the field guide's correlation
//                              sensitivity (Spearman rank correlation with the objective)
//   history.svg, importance.svg, parallel.svg
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "mltrain/tune/study.hpp"

namespace mltrain::tune {

nlohmann::json write_study_outputs(const StudyConfig& cfg, const std::vector<TrialState>& trials);
// The importance table alone (exposed for tests): values as reported, complete trials only.
nlohmann::json parameter_importance(const Space& space, const std::vector<TrialState>& trials,
                                    bool maximize);
// Rebuilds the settings a study folder was run with (its study.yaml, read through the schema).
StudyConfig study_config_from_folder(const std::string& study_dir);
std::string study_text(const nlohmann::json& summary);
// An HTML section for `mltrain report`: the study's summary, best trial, trials table head, and its
// history, importance and parallel-coordinates SVGs (regenerated from the journal).
std::string study_html(const std::string& study_dir);

std::string svg_bars(const std::string& title, const std::vector<std::string>& labels,
                     const std::vector<double>& values);
std::string svg_parallel(const std::string& title, const Space& space,
                         const std::vector<TrialState>& trials, bool maximize,
                         const std::string& metric);

}  // namespace mltrain::tune
