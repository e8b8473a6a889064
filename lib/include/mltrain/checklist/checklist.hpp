#pragma once
// `mltrain checklist`: the field guide's optimisation checklist, measured on this node and, given a
// config, on this pipeline. Every item is PASS / WARN / FAIL / SKIP with the measured value, the
// expected one, why it matters and how to fix it; SKIP always says why.
//
//   ChecklistOptions o;  o.level = "quick";  o.cfg = &cfg;   // cfg may be null
//   auto j = run_checklist(o);        // {"items": [...], "counts": {...}, "seconds": ...}
//   std::cout << checklist_text(j);   // exit non-zero when j["counts"]["FAIL"] > 0
#include <nlohmann/json.hpp>

#include <string>

#include "mltrain/config/experiment.hpp"

namespace mltrain::checklist {

struct ChecklistOptions {
  std::string level = "quick";                    // quick (< 30 s) | full
  const config::ExperimentConfig* cfg = nullptr;  // the pipeline to check; null: node only
  std::string config_path;
};

nlohmann::json run_checklist(const ChecklistOptions& opt);
std::string checklist_text(const nlohmann::json& report);

// The threshold rules, separately testable. Each returns {"status", "expected"}.
nlohmann::json judge_gemm(double gflops);
nlohmann::json judge_threads(int threads, int cores);
nlohmann::json judge_disk(double free_bytes, double needed_bytes);
nlohmann::json judge_swappiness(int value);

}  // namespace mltrain::checklist
