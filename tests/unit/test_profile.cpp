// Profile and checklist rules: the diagnosis table, the checklist thresholds, the operator
// profiler's counts, self/total times and Chrome trace, and the phase clock inside the trainer.
#include <catch2/catch.hpp>
#include <torch/torch.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mltrain/core/compat.hpp"
#include "mltrain/dist/nccl_check.hpp"
#include "mltrain/train/checklist.hpp"
#include "mltrain/train/fuse.hpp"
#include "mltrain/train/op_profiler.hpp"
#include "mltrain/train/profile.hpp"

using namespace mltrain;
using namespace mltrain::train;

static nlohmann::json measure_with(double data, double allreduce, double other, std::vector<double> rss = {100, 100, 100, 100}) {
  const double compute = 1.0 - data - allreduce - other;
  return {{"samples_per_s", 1000.0},
          {"phase_share",
           {{"data", data}, {"h2d_copy", 0.0}, {"forward", compute / 2}, {"backward", compute / 2},
            {"optimizer", 0.0}, {"allreduce", allreduce}, {"other", other}}},
          {"loader", {{"workers", 1}, {"supply_samples_per_s", 900.0}, {"cpu_utilisation", 0.97}}},
          {"memory", {{"rss_per_step_mib", rss}, {"rss_growth_mib", rss.back() - rss.front()}, {"page_faults_per_step", 0.0}}}};
}

TEST_CASE("diagnosis: accept/reject table", "[profile]") {
  struct Row {
    double data, comm, other;
    const char* verdict;
  };
  for (const Row& r : {Row{0.40, 0.0, 0.0, "data-bound"}, Row{0.15, 0.0, 0.0, "data-bound"}, Row{0.14, 0.0, 0.0, "compute-bound"},
                       Row{0.05, 0.30, 0.0, "communication-bound"}, Row{0.05, 0.24, 0.0, "compute-bound"},
                       Row{0.05, 0.0, 0.30, "host-overhead-bound"}, Row{0.20, 0.30, 0.30, "data-bound"},
                       Row{0.0, 0.0, 0.0, "compute-bound"}}) {
    INFO(r.data << " " << r.comm << " " << r.other);
    const auto d = diagnose(measure_with(r.data, r.comm, r.other));
    CHECK(d["verdict"] == r.verdict);
    CHECK(!d["evidence"].empty());
    CHECK(!d["advice"].empty());
  }
  // data-bound evidence names the loader's rate against the model's
  const auto d = diagnose(measure_with(0.5, 0, 0));
  CHECK(d["evidence"].dump().find("900 samples/s") != std::string::npos);
  // stair-step memory: rising every step by > 32 MiB in total is reported; flat or noisy is not
  CHECK(diagnose(measure_with(0.0, 0, 0, {100, 120, 140, 160}))["memory"].is_string());
  CHECK_FALSE(diagnose(measure_with(0.0, 0, 0, {100, 140, 130, 160})).contains("memory"));
  CHECK_FALSE(diagnose(measure_with(0.0, 0, 0, {100, 101, 102, 103})).contains("memory"));
}

TEST_CASE("checklist thresholds", "[checklist]") {
  CHECK(judge_gemm(5)["status"] == "FAIL");  // the reference BLAS
  CHECK(judge_gemm(60)["status"] == "WARN");  // OpenBLAS-class
  CHECK(judge_gemm(200)["status"] == "PASS");
  CHECK(judge_threads(1, 2)["status"] == "PASS");
  CHECK(judge_threads(2, 2)["status"] == "PASS");
  CHECK(judge_threads(3, 2)["status"] == "FAIL");
  CHECK(judge_threads(1, 8)["status"] == "WARN");
  CHECK(judge_disk(10e9, 1e9)["status"] == "PASS");
  CHECK(judge_disk(1.5e9, 1e9)["status"] == "WARN");
  CHECK(judge_disk(0.5e9, 1e9)["status"] == "FAIL");
  CHECK(judge_swappiness(1)["status"] == "PASS");
  CHECK(judge_swappiness(60)["status"] == "WARN");
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
  CHECK(by["aten::matmul"].self_us < by["aten::matmul"].total_us);  // its mm is a child, not self time
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

// The checklist runs the NCCL helper as a child with a timeout. A stand-in helper placed beside
// this test binary checks the parent's side: a report, a hang, a crash without a report.
TEST_CASE("NCCL probe: report parsed, hang killed at the timeout, crash reported", "[checklist]") {
  namespace fs = std::filesystem;
  const fs::path helper = fs::read_symlink("/proc/self/exe").parent_path() / "mltrain_nccl_check";
  REQUIRE_FALSE(fs::exists(helper));  // never a real helper in a CPU build's test folder
  auto write = [&](const std::string& body) {
    std::ofstream(helper) << "#!/bin/sh\n" << body << "\n";
    fs::permissions(helper, fs::perms::owner_all);
  };
  write("echo '{\"ok\":true,\"version\":\"2.28.9\",\"world\":1,\"bytes\":268435456,\"seconds\":0.001,\"algbw_gbps\":268.4,"
        "\"busbw_gbps\":0,\"error\":\"\"}'");
  CHECK(dist::nccl_compiled());
  auto r = dist::nccl_allreduce_check(268435456, 3, 10);
  INFO(r.error);
  CHECK(r.ok);
  CHECK(r.version == "2.28.9");
  CHECK(r.algbw_gbps == Approx(268.4));
  write("sleep 30");
  const auto t0 = std::chrono::steady_clock::now();
  r = dist::nccl_allreduce_check(1024, 1, 1.0);
  CHECK_FALSE(r.ok);
  CHECK(r.error.find("did not finish within 1 s") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  write("kill -SEGV $$");
  r = dist::nccl_allreduce_check(1024, 1, 10);
  CHECK_FALSE(r.ok);
  CHECK(r.error.find("status 139") != std::string::npos);
  fs::remove(helper);
  CHECK_FALSE(dist::nccl_compiled());
}

// BN folding algebra against the unfused modules in eval mode, with non-trivial statistics.
TEST_CASE("fold_batchnorm equals conv+BN and linear+BN in eval mode", "[fuse]") {
  torch::manual_seed(3);
  torch::NoGradGuard ng;
  for (bool with_bias : {false, true}) {
    torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).padding(1).bias(with_bias));
    torch::nn::BatchNorm2d bn(8);
    bn->weight.uniform_(0.5, 2.0);
    bn->bias.normal_();
    bn->running_mean.normal_();
    bn->running_var.uniform_(0.1, 3.0);
    bn->eval();
    auto x = torch::randn({4, 3, 9, 9});
    const auto want = bn(conv(x));
    auto [w, b] = train::fold_batchnorm(conv->weight, with_bias ? conv->bias : torch::Tensor(), bn->weight, bn->bias,
                                        bn->running_mean, bn->running_var, 1e-5);
    const auto got = torch::conv2d(x, w, b, 1, 1);
    CHECK((got - want).abs().max().item<double>() < 1e-5);
    // and the per-channel rule by hand for one channel: s = gamma / sqrt(var + eps)
    const double s0 = bn->weight[0].item<double>() / std::sqrt(bn->running_var[0].item<double>() + 1e-5);
    CHECK(w[0][0][0][0].item<double>() == Approx(conv->weight[0][0][0][0].item<double>() * s0).epsilon(1e-6));
  }
  torch::nn::Linear lin(6, 5);
  torch::nn::BatchNorm1d bn1(5);
  bn1->running_mean.normal_();
  bn1->running_var.uniform_(0.2, 2.0);
  bn1->weight.uniform_(0.5, 1.5);
  bn1->eval();
  auto x = torch::randn({7, 6});
  auto [w, b] = train::fold_batchnorm(lin->weight, lin->bias, bn1->weight, bn1->bias, bn1->running_mean, bn1->running_var, 1e-5);
  CHECK((torch::linear(x, w, b) - bn1(lin(x))).abs().max().item<double>() < 1e-5);
}
