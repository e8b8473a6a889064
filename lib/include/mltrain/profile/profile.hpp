#pragma once
// `mltrain profile`: runs the real training configuration for wait + warmup + active steps and
// reports where the step time goes, per phase and per operator, with a diagnosis.
//
//   ProfileOptions po;  po.active = 30;
//   auto report = profile_config(cfg, po);      // JSON: phases, ops, diagnosis, sweep
//   std::cout << profile_text(report);
//
// Two passes over the same steps: the first with only the phase clock (the step time the user
// gets), the second with the operator profiler too; their ratio is the profiler's overhead.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "mltrain/config/experiment.hpp"

namespace mltrain::profile {

struct ProfileOptions {
  int64_t wait = 5, warmup = 10, active = 30;  // steps: skipped, profiled then discarded, measured
  size_t top = 15;                             // operators in the table
  bool ops = true;                             // second pass with the operator profiler
  std::string out_dir;                 // profile.json, phases.svg, trace.json.gz, report.txt
  size_t trace_cap_bytes = 32u << 20;  // uncompressed Chrome trace cap
  std::string sweep;                   // "data.workers=0,1,2": one phase pass per value
  std::vector<std::string> overrides;  // the command line's, re-applied per sweep value
  std::string config_path;
};

// Everything measured, as JSON (written to out_dir/profile.json when out_dir is set).
nlohmann::json profile_config(const config::ExperimentConfig& cfg, const ProfileOptions& opt);

// The diagnosis rules, separately testable: given phase shares (data, h2d_copy, forward,
// backward, optimizer, allreduce, other) and the loader/model rates, the verdict and its evidence.
nlohmann::json diagnose(const nlohmann::json& measure);

std::string profile_text(const nlohmann::json& report);
std::string phases_svg(const nlohmann::json& report);

}  // namespace mltrain::profile
