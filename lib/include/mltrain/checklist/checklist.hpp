#pragma once
// `mltrain checklist`: the field guide's optimisation checklist, measured on this node and, given a
// config, on this pipeline. Every item is PASS / WARN / FAIL / SKIP with the measured value, the
// expected one, why it matters and how to fix it; SKIP always says why.
//
//   ChecklistOptions o;  o.level = "quick";  o.cfg = &cfg;   // cfg may be null
//   ChecklistReport r = run_checklist(o);
//   std::cout << r.to_text();          // or r.to_json(); exit 4 when r.failed()
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "mltrain/config/experiment.hpp"

namespace mltrain::checklist {

struct ChecklistOptions {
  std::string level = "quick";                    // quick (< 30 s) | full
  const config::ExperimentConfig* cfg = nullptr;  // the pipeline to check; null: node only
  std::string config_path;
};

// One checklist item. SKIP items carry their reason in `fix`.
struct ChecklistItem {
  std::string id, area, status, measured, expected, why, fix;  // status: PASS | WARN | FAIL | SKIP
  nlohmann::json value;  // the measured numbers, by name (gflops, faults_per_step, ...)
};

struct ChecklistReport {
  std::vector<ChecklistItem> items;  // in area order: data, compute, system, gpu
  std::string level, config, device;
  double seconds = 0;

  void add(ChecklistItem it) { items.push_back(std::move(it)); }
  void skip(const std::string& id, const std::string& area, const std::string& reason,
            const std::string& why);
  std::map<std::string, int> counts() const;  // PASS, WARN, FAIL, SKIP
  bool failed() const { return counts().at("FAIL") > 0; }
  nlohmann::json to_json() const;
  std::string to_text() const;
};

ChecklistReport run_checklist(const ChecklistOptions& opt);

// The threshold rules, separately testable. Each returns {"status", "expected"}.
nlohmann::json judge_gemm(double gflops);
nlohmann::json judge_threads(int threads, int cores);
nlohmann::json judge_disk(double free_bytes, double needed_bytes);
nlohmann::json judge_swappiness(int value);

}  // namespace mltrain::checklist
