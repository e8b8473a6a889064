// `mltrain checklist`: threshold tables and the NCCL helper's parent side.
#include <catch2/catch.hpp>
#include <torch/torch.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mltrain/checklist/checklist.hpp"
#include "mltrain/runtime/compat.hpp"
#include "mltrain/dist/nccl_check.hpp"

using namespace mltrain;
using namespace mltrain::checklist;

TEST_CASE("checklist thresholds", "[checklist]") {
  CHECK(judge_gemm(5)["status"] == "FAIL");   // the reference BLAS
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
  write(
      "echo "
      "'{\"ok\":true,\"version\":\"2.28.9\",\"world\":1,\"bytes\":268435456,\"seconds\":0.001,"
      "\"algbw_gbps\":268.4,"
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
