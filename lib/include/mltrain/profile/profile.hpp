#pragma once
// `mltrain profile`: runs the real training configuration for wait + warmup + active steps and
// reports where the step time goes, per phase and per operator, with a diagnosis.
//
//   ProfileOptions po;  po.active = 30;
//   ProfileReport r = profile_config(cfg, po);  // phases, operators, diagnosis, sweep
//   std::cout << r.to_text();                   // or r.to_json()
//
// Two passes over the same steps: the first with only the phase clock (the step time the user
// gets), the second with the operator profiler too; their ratio is the profiler's overhead.
#include <nlohmann/json.hpp>

#include <array>
#include <map>
#include <optional>
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
  bool fix = false;                    // --fix: prove the diagnosis's proposals, write fixed.yaml
  int64_t fix_rounds = 3;              // interleaved rounds of baseline + every proposal
  std::vector<std::string> overrides;  // the command line's, re-applied per sweep value
  std::string config_path;
  std::string apply;  // with sweep: write the resolved config with the fastest value here
};

// One measured pass: what the trainer's own steps took, per phase, and what the loader and memory
// did meanwhile. Phases are indexed by Phase (core/phase.hpp: data, h2d_copy, forward, backward, optimizer,
// allreduce, other).
struct Measure {
  static constexpr size_t kPhases = 7;
  int64_t steps = 0, batch_size = 0, accumulate = 1;
  double step_ms = 0, samples_per_s = 0;
  double grad_underflow = -1;  // fp16: the largest sampled underflow share of a measured step
  std::array<double, kPhases> phase_ms{}, phase_share{};
  struct Loader {
    int64_t workers = 0, prefetch = 0;
    double supply_samples_per_s = 0;  // the loader alone, same options and augmentation
    double cpu_utilisation = 0;       // of its threads while training
  } loader;
  struct Memory {
    double rss_mib = 0, rss_growth_mib = 0, peak_rss_mib = 0, page_faults_per_step = 0;
    std::vector<double> rss_per_step_mib;
    bool cuda = false;
    double cuda_allocated_mib = 0, cuda_reserved_mib = 0, cuda_peak_allocated_mib = 0,
           cuda_allocated_before_mib = 0, cuda_total_mib = 0;
  } memory;

  double share(const char* phase) const;  // by phase_name (core/phase.hpp)
  nlohmann::json to_json() const;
  // The child process of an environment-variable sweep reports its pass as JSON; this reads it.
  static Measure from_json(const nlohmann::json& j);
};

// The verdict with its evidence and what to change.
struct Diagnosis {
  std::string verdict;  // data-bound | communication-bound | host-overhead-bound | compute-bound
  std::vector<std::string> evidence, advice;
  std::optional<std::string> memory;  // stair-step RSS growth, when seen
  nlohmann::json to_json() const;
};

// The diagnosis rules, separately testable: given phase shares and the loader/model rates, the
// verdict and its evidence.
Diagnosis diagnose(const Measure& measure);

// A concrete change the diagnosis suggests trying: a config key or an environment variable (upper
// case: measured in a child process) and its value.
struct FixProposal {
  std::string key, value, why;
  bool operator==(const FixProposal& o) const { return key == o.key && value == o.value; }
};
// Pure (tested as a table): the proposals for this config, measure and verdict on a machine with
// `cores` cores; `bf16_native`: the CPU runs bf16 matmuls natively (AVX-512 BF16 / AMX) or CUDA.
std::vector<FixProposal> propose_fixes(const config::ExperimentConfig& cfg, const Measure& m,
                                       const Diagnosis& d, int cores, bool bf16_native);
// The keep rule of --fix: every round of the proposal faster than every round of the baseline
// (their ranges do not overlap), so a gain inside the run-to-run noise is never kept.
bool proven_faster(const std::vector<double>& baseline, const std::vector<double>& candidate);

struct ProfileReport {
  std::string config, model, device;
  int64_t wait = 0, warmup = 0, active = 0;
  nlohmann::json runtime;  // runtime::describe(): threads, route, allocator, versions
  Measure measure;
  Diagnosis diagnosis;
  struct Overhead {
    double step_ms_without = 0, step_ms_with = 0;
    std::array<double, 2> step_ms_without_passes{};  // passes 1 and 3
    double ratio() const { return step_ms_with / step_ms_without; }
  };
  std::optional<Overhead> profiler_overhead;
  struct Operator {
    std::string name;
    double calls_per_step = 0, self_ms_per_step = 0, total_ms_per_step = 0, self_share = 0;
  };
  std::vector<Operator> operators;
  // model.name: exported: the program's nodes named by the module that ran them
  // ("layer3.1.conv2: aten::conv2d"), by forward time (total); graph_nodes_backward: the autograd
  // functions each node's operators made, by the same names.
  std::vector<Operator> graph_nodes;
  std::vector<Operator> graph_nodes_backward;  // their autograd backward, by the same names
  double operator_calls_per_step = 0;
  struct Trace {
    std::string path;
    int64_t events = 0, bytes = 0;
    bool truncated = false;
  };
  std::optional<Trace> trace;
  struct SweepRow {
    std::string value;
    Measure measure;
    std::string verdict;
  };
  struct Sweep {
    std::string key, best;
    std::string applied;  // ProfileOptions::apply, once written
    std::vector<SweepRow> rows;
    double best_samples_per_s = 0, speedup_vs_first = 1;
  };
  std::optional<Sweep> sweep;
  struct FixRow {
    FixProposal proposal;
    std::vector<double> samples_per_s;  // one per round
    double median = 0, gain = 0;        // gain: median / baseline median - 1
    bool kept = false;
  };
  struct Fix {
    std::vector<double> baseline;           // samples/s per round
    double baseline_median = 0, noise = 0;  // noise: (max - min) / median of the baseline
    std::vector<FixRow> rows;               // the proposals, then the kept ones combined
    std::vector<std::string> kept;          // KEY=value, as written to fixed.yaml
    std::string fixed_yaml;
  };
  std::optional<Fix> fix;
  // amp.enabled: the output dtype of every named module in one forward under autocast, so the
  // fp32 islands (amp.fp32_modules) and what autocast lowers are visible side by side.
  std::map<std::string, std::string> autocast_dtypes;
  std::vector<std::string> fp32_islands;

  nlohmann::json to_json() const;  // what out_dir/profile.json holds
  std::string to_text() const;     // what out_dir/report.txt holds
  std::string phases_svg() const;  // stacked phase bars, one per measured pass and sweep value
};

// Everything measured (written to out_dir/{profile.json, report.txt, phases.svg} when set).
ProfileReport profile_config(const config::ExperimentConfig& cfg, const ProfileOptions& opt);

}  // namespace mltrain::profile
