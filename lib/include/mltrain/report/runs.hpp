#pragma once
// Looking at finished and running runs: `mltrain runs [DIR]` (a table) and `mltrain report RUN...`
// (one self-contained HTML page: inline SVG and CSS, no external requests).
//
//   for (auto& r : find_runs("runs")) ...          // every <name>/v<N> under runs/
//   std::cout << runs_table(find_runs("runs"));
//   write_file_atomic("report.html", html_report({"runs/a/v0", "runs/b/v0"}));
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

namespace mltrain::report {

struct RunInfo {
  std::filesystem::path dir;
  std::string name;    // <name>/v<N>
  std::string state;   // running | finished | failed | interrupted | stale | unknown
  std::string detail;  // "interrupted at step 120 (signal 15)", failure message, ...
  int64_t step = 0;
  // The run's own monitored metric (checkpoint.monitor: accuracy for classifiers, else the loss,
  // or what the config names: perplexity, r2, ...), its best evaluation and that step.
  std::string metric;
  bool maximize = false;
  double best = NAN;  // NaN: no evaluation yet
  int64_t best_step = -1;
  std::string best_text() const;  // "accuracy 91.20%", "loss 0.3412", "-"
  double seconds = 0;             // training time so far
  int checkpoints = 0;
};

RunInfo read_run(const std::filesystem::path& dir);
// DIR itself when it is a run folder, else every <name>/v<N> below it, sorted by name.
std::vector<RunInfo> find_runs(const std::filesystem::path& root);
std::string runs_table(const std::vector<RunInfo>& runs);
// sections: extra HTML fragments placed after the runs table (`mltrain report` passes one per
// tune study: its summary and history / importance / parallel-coordinates plots).
std::string html_report(const std::vector<std::filesystem::path>& run_dirs,
                        const std::vector<std::string>& sections = {});

}  // namespace mltrain::report
