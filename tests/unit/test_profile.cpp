// `mltrain profile`: the diagnosis table and the operator profiler.
#include <catch2/catch.hpp>
#include <torch/torch.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mltrain/runtime/compat.hpp"
#include "mltrain/profile/op_profiler.hpp"
#include "mltrain/profile/profile.hpp"

using namespace mltrain;
using namespace mltrain::profile;

static Measure measure_with(double data, double allreduce, double other,
                            std::vector<double> rss = {100, 100, 100, 100}) {
  const double compute = 1.0 - data - allreduce - other;
  Measure m;
  m.samples_per_s = 1000.0;
  // data, h2d_copy, forward, backward, optimizer, allreduce, other (Phase order, core/phase.hpp)
  m.phase_share = {data, 0.0, compute / 2, compute / 2, 0.0, allreduce, other};
  m.loader.workers = 1;
  m.loader.supply_samples_per_s = 900.0;
  m.loader.cpu_utilisation = 0.97;
  m.memory.rss_per_step_mib = rss;
  m.memory.rss_growth_mib = rss.back() - rss.front();
  m.memory.page_faults_per_step = 0.0;
  return m;
}

TEST_CASE("diagnosis: accept/reject table", "[profile]") {
  struct Row {
    double data, comm, other;
    const char* verdict;
  };
  for (const Row& r :
       {Row{0.40, 0.0, 0.0, "data-bound"}, Row{0.15, 0.0, 0.0, "data-bound"},
        Row{0.14, 0.0, 0.0, "compute-bound"}, Row{0.05, 0.30, 0.0, "communication-bound"},
        Row{0.05, 0.24, 0.0, "compute-bound"}, Row{0.05, 0.0, 0.30, "host-overhead-bound"},
        Row{0.20, 0.30, 0.30, "data-bound"}, Row{0.0, 0.0, 0.0, "compute-bound"}}) {
    INFO(r.data << " " << r.comm << " " << r.other);
    const auto d = diagnose(measure_with(r.data, r.comm, r.other));
    CHECK(d.verdict == r.verdict);
    CHECK(!d.evidence.empty());
    CHECK(!d.advice.empty());
  }
  // data-bound evidence names the loader's rate against the model's
  const auto d = diagnose(measure_with(0.5, 0, 0));
  CHECK(d.to_json()["evidence"].dump().find("900 samples/s") != std::string::npos);
  // stair-step memory: rising every step by > 32 MiB in total is reported; flat or noisy is not
  CHECK(diagnose(measure_with(0.0, 0, 0, {100, 120, 140, 160})).memory.has_value());
  CHECK_FALSE(diagnose(measure_with(0.0, 0, 0, {100, 140, 130, 160})).memory.has_value());
  CHECK_FALSE(diagnose(measure_with(0.0, 0, 0, {100, 101, 102, 103})).memory.has_value());
}

TEST_CASE("operator profiler: counts, nesting and a readable Chrome trace", "[profile]") {
  torch::NoGradGuard ng;
  auto a = torch::randn({64, 64}), w = torch::randn({32, 64}), b = torch::randn({32});
  OpProfiler prof({});
  prof.start();
  for (int i = 0; i < 3; ++i) torch::mm(a, a);
  for (int i = 0; i < 2; ++i) torch::matmul(a, a);  // matmul -> mm: a parent with a child
  prof.stop();
  torch::mm(a, a);  // after stop: not counted
  std::map<std::string, OpStat> by;
  for (const auto& s : prof.top(1000)) by[s.name] = s;
  REQUIRE(by.count("aten::mm"));
  CHECK(by["aten::mm"].calls == 5);  // 3 direct + 2 inside matmul
  REQUIRE(by.count("aten::matmul"));
  CHECK(by["aten::matmul"].calls == 2);
  CHECK(by["aten::matmul"].self_us <
        by["aten::matmul"].total_us);  // its mm is a child, not self time
  for (const auto& [n, s] : by) CHECK(s.self_us <= s.total_us + 1e-6);

  const auto path = std::filesystem::temp_directory_path() / "mltrain_test_trace.json.gz";
  const int64_t n = prof.write_chrome_trace_gz(path.string(), 1 << 20);
  CHECK(n == prof.total_calls());
  gzFile f = gzopen(path.c_str(), "rb");
  REQUIRE(f);
  std::string text;
  char buf[4096];
  int k;
  while ((k = gzread(f, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(k));
  gzclose(f);
  const auto trace = nlohmann::json::parse(text);
  int complete = 0;
  for (const auto& e : trace["traceEvents"]) complete += e["ph"] == "X";
  CHECK(complete == n);
  // the cap holds: a tiny budget keeps the file valid JSON with fewer events
  CHECK(prof.write_chrome_trace_gz(path.string(), 300) < n);

  // dtype census under bf16 autocast: the matmul runs in bf16
  OpProfiler census({true, 100});
  census.start();
  {
    compat::AutocastGuard guard(true, at::kBFloat16, /*cuda=*/false);
    torch::nn::functional::linear(a, w, b);
  }
  census.stop();
  const auto dt = census.dtypes();
  REQUIRE(dt.count("aten::addmm"));
  CHECK(dt.at("aten::addmm").count("bf16") == 1);
}

TEST_CASE("profile table: a long operator name keeps its end", "[profile]") {
  ProfileReport r;
  r.active = 1;
  r.profiler_overhead = ProfileReport::Overhead{10, 11, {10, 10}};
  for (const char* name :
       {"aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "aten::mm"})
    r.operators.push_back({name, 1, 1, 1, 0.1});
  const std::string text = r.to_text();
  CHECK(text.find("  aten::_scaled_dot_pr...ash_attention_for_cpu ") != std::string::npos);
  CHECK(text.find("  aten::_scaled_dot_pr...tion_for_cpu_backward ") != std::string::npos);
  CHECK(text.find("  aten::mm ") != std::string::npos);
}

TEST_CASE("profile --fix: proposals per verdict, and the keep rule", "[profile][fix]") {
  config::ExperimentConfig cfg;
  cfg.model.name = "cnn";
  cfg.model.channels_last = false;
  auto has = [](const std::vector<FixProposal>& ps, const std::string& key,
                const std::string& value) {
    for (const auto& p : ps)
      if (p.key == key && p.value == value) return true;
    return false;
  };
  // Data-bound with one worker on two cores: more workers, deeper prefetch, passive OpenMP
  // waiting, one intra-op thread fewer.
  auto starved = measure_with(0.6, 0, 0.05);
  starved.loader.prefetch = 2;
  const auto data = propose_fixes(cfg, starved, diagnose(starved), 2, false);
  CHECK(has(data, "data.workers", "2"));
  CHECK(has(data, "data.prefetch", "4"));
  CHECK(has(data, "OMP_WAIT_POLICY", "passive"));
  CHECK(has(data, "runtime.threads", "1"));
  CHECK_FALSE(has(data, "amp.enabled", "true"));
  // Compute-bound: layouts and bf16 only where they apply.
  auto busy = measure_with(0.01, 0, 0.01);
  const auto plain = propose_fixes(cfg, busy, diagnose(busy), 2, false);
  CHECK(has(plain, "model.channels_last", "true"));
  CHECK_FALSE(has(plain, "amp.enabled", "true"));  // no native bf16
  CHECK(has(propose_fixes(cfg, busy, diagnose(busy), 2, true), "amp.enabled", "true"));
  cfg.model.channels_last = true;
  cfg.amp.enabled = true;
  CHECK(propose_fixes(cfg, busy, diagnose(busy), 2, true).empty());  // nothing left to try
  cfg.model.name = "mlp";
  cfg.runtime.kernel_route = "native";
  CHECK(has(propose_fixes(cfg, busy, diagnose(busy), 2, true), "runtime.kernel_route", "onednn"));
  // Host overhead: a larger batch; page faults under the system allocator: retain.
  auto host = measure_with(0.01, 0, 0.5);
  host.memory.page_faults_per_step = 5000;
  cfg.runtime.allocator = "system";
  cfg.data.batch_size = 64;
  const auto h = propose_fixes(cfg, host, diagnose(host), 2, true);
  CHECK(has(h, "data.batch_size", "128"));
  CHECK(has(h, "runtime.allocator", "retain"));

  // Memory-bound on a GPU: activation checkpointing for models with blocks.
  auto full = measure_with(0.01, 0, 0.01);
  full.memory.cuda = true;
  full.memory.cuda_total_mib = 1000;
  full.memory.cuda_peak_allocated_mib = 950;
  cfg.model.name = "gpt";
  CHECK(has(propose_fixes(cfg, full, diagnose(full), 2, true), "memory.checkpoint", "blocks"));
  full.memory.cuda_peak_allocated_mib = 500;
  CHECK_FALSE(
      has(propose_fixes(cfg, full, diagnose(full), 2, true), "memory.checkpoint", "blocks"));

  // fp16 underflow seen in the measured steps is advice of its own.
  auto fp16 = measure_with(0.01, 0, 0.01);
  fp16.grad_underflow = 0.05;
  bool said = false;
  for (const auto& a : diagnose(fp16).advice)
    said |= a.find("fp16 gradients: 5.0%") != std::string::npos;
  CHECK(said);
  CHECK(Measure::from_json(fp16.to_json()).grad_underflow == Approx(0.05));
  CHECK(Measure::from_json(busy.to_json()).grad_underflow == -1);

  // Kept only when every round beats every baseline round.
  CHECK(proven_faster({100, 104, 102}, {105, 110, 108}));
  CHECK_FALSE(proven_faster({100, 104, 102}, {103, 130, 140}));  // one round inside the noise
  CHECK_FALSE(proven_faster({100, 104, 102}, {90, 95, 99}));
  CHECK_FALSE(proven_faster({}, {1}));
}
