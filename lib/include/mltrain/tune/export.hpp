#pragma once
// A study folder in other tools' formats.
//
//   tune::export_optuna_journal("runs/tune/fashion_mnist_mlp", "study.log");
//   # Python: optuna.load_study(study_name="fashion_mnist_mlp",
//   #           storage=JournalStorage(JournalFileBackend("study.log")))
//
// Optuna's JournalStorage file (optuna/storages/journal, format of Optuna 3.x to 5.0): one JSON
// operation per line, replayed in order. The export writes CREATE_STUDY (its directions),
// the objectives' names as the study's "study:metric_names" system attribute (what
// optuna-dashboard labels its plots with), then one CREATE_TRIAL per trial carrying its whole
// state: params in Optuna's internal representation with their distributions, state, value or
// values, intermediate values, start and end times, mltrain's trial attributes as user attrs.
#include <string>

namespace mltrain::tune {

struct ExportReport {
  std::string study_name;
  int trials = 0;
};

// Writes `out` (replaced if it exists). Throws ConfigError when `study_dir` is not a study folder.
ExportReport export_optuna_journal(const std::string& study_dir, const std::string& out);

}  // namespace mltrain::tune
