// `mltrain profile`.
#include "cli_support.hpp"

TEST_CASE("profile: the plain CNN is compute-bound, with operators, a trace and the overhead",
          "[cli][profile]") {
  const auto d = tmpdir("profile_cnn");
  auto r =
      run("profile " + kSrc +
          "/configs/fashion_mnist_cnn.yaml --wait 2 --warmup 3 --active 12 --out " + d.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(slurp(d / "profile.json"));
  CHECK(j["diagnosis"]["verdict"] == "compute-bound");
  CHECK(j["measure"]["phase_share"]["data"].get<double>() < 0.15);
  CHECK(j["profiler_overhead"]["ratio"].get<double>() > 0);
  REQUIRE(j["operators"].size() >= 5);
  bool conv = false;
  for (const auto& op : j["operators"])
    conv |= op["name"].get<std::string>().find("conv") != std::string::npos;
  CHECK(conv);
  double share = 0;
  for (const auto& [k, v] : j["measure"]["phase_share"].items()) share += v.get<double>();
  CHECK(share == Approx(1.0).margin(0.05));  // the phases account for the step
  const auto trace = nlohmann::json::parse(gunzip(d / "trace.json.gz"));  // a valid Chrome trace
  CHECK(trace["traceEvents"].size() > 100);
  CHECK(slurp(d / "phases.svg").find("<svg") == 0);
  CHECK(r.out.find("diagnosis: compute-bound") != std::string::npos);
}

TEST_CASE("profile: a starved loader is data-bound with evidence; --sweep measures each value",
          "[cli][profile]") {
  const auto d = tmpdir("profile_starved");
  // Starved by construction, so the verdict holds on a loaded machine too: a 16-unit MLP on one
  // thread against one worker augmenting 512-sample batches (~20x the compute per batch).
  auto r = run(
      "profile " + kSrc +
      "/configs/starved_loader.yaml model.hidden=[16] data.batch_size=512 "
      "runtime.threads=1 --no-ops --wait 2 --warmup 3 --active 20 --sweep data.workers=0,1 --out " +
      d.string() + " --apply " + (d / "tuned.yaml").string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(slurp(d / "profile.json"));
  CHECK(j["diagnosis"]["verdict"] == "data-bound");
  CHECK(j["measure"]["phase_share"]["data"].get<double>() >= 0.15);
  CHECK(j["diagnosis"]["evidence"].size() >= 2);
  REQUIRE(j["sweep"]["rows"].size() == 2);
  CHECK((j["sweep"]["best"] == "0" || j["sweep"]["best"] == "1"));
  CHECK(r.out.find("sweep data.workers:") != std::string::npos);
  // --apply: the config with the fastest value, resolved, in a new file that trains as it is.
  CHECK(j["sweep"]["applied"] == (d / "tuned.yaml").string());
  const std::string tuned = slurp(d / "tuned.yaml");
  CHECK_THAT(tuned, Catch::Contains("with data.workers=" + j["sweep"]["best"].get<std::string>()));
  CHECK_THAT(tuned, Catch::Contains("workers: " + j["sweep"]["best"].get<std::string>()));
  CHECK(run("config check " + (d / "tuned.yaml").string()).code == 0);
  CHECK(
      run("profile " + kSrc + "/configs/starved_loader.yaml --sweep data.workers --no-ops").code ==
      2);
  const auto no_sweep = run("profile " + kSrc + "/configs/starved_loader.yaml --apply x.yaml");
  CHECK(no_sweep.code == 2);
  CHECK_THAT(no_sweep.out, Catch::Contains("--apply: needs --sweep"));
  const auto over = run("profile " + kSrc +
                        "/configs/starved_loader.yaml --sweep data.workers=0,1 "
                        "--apply " +
                        kSrc + "/configs/starved_loader.yaml");
  CHECK(over.code == 2);
  CHECK_THAT(over.out, Catch::Contains("would overwrite"));
}

// Every kept row must have each round faster than each baseline round; rows not kept never reach
// fixed.yaml.
static void check_fix_is_proven(const nlohmann::json& fix, const std::string& fixed) {
  const auto base = fix["baseline_samples_per_s"].get<std::vector<double>>();
  REQUIRE(base.size() >= 2);
  const double base_max = *std::max_element(base.begin(), base.end());
  for (const auto& row : fix["proposals"]) {
    INFO(row.dump());
    const auto s = row["samples_per_s"].get<std::vector<double>>();
    REQUIRE_FALSE(s.empty());
    if (row["kept"].get<bool>() && row["key"].get<std::string>().find(' ') == std::string::npos)
      CHECK(*std::min_element(s.begin(), s.end()) > base_max);
    const std::string change =
        row["key"].get<std::string>() + "=" + row["value"].get<std::string>();
    bool listed = false;
    for (const auto& k : fix["kept"]) listed |= k.get<std::string>() == change;
    if (!listed) CHECK(fixed.find("# " + change + "\n") == std::string::npos);
  }
}

TEST_CASE("profile --fix: proves a faster setting for the starved loader, writes fixed.yaml",
          "[cli][profile][fix]") {
  const auto d = tmpdir("profile_fix_starved");
  // Each batch also waits 20 ms, as from slow storage: one worker supplies at most 6 400 samples/s
  // and a second one doubles that, a margin this machine's run-to-run noise (measured 17-66 % on
  // 15-step windows of the CPU-bound form) cannot hide.
  ::setenv("MLTRAIN_TEST_LOADER_DELAY_MS", "20", 1);
  auto r = run("profile " + kSrc +
               "/configs/starved_loader.yaml --no-ops --wait 2 --warmup 3 --active 15 --fix "
               "--out " +
               d.string());
  ::unsetenv("MLTRAIN_TEST_LOADER_DELAY_MS");
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(slurp(d / "profile.json"));
  CHECK(j["diagnosis"]["verdict"] == "data-bound");
  const auto& fix = j["fix"];
  REQUIRE(fix["proposals"].size() >= 3);
  REQUIRE(fix["kept"].size() >= 1);  // at least one setting proven faster in every round
  const std::string fixed = slurp(d / "fixed.yaml");
  check_fix_is_proven(fix, fixed);
  for (const auto& k : fix["kept"]) CHECK(fixed.find(k.get<std::string>()) != std::string::npos);
  CHECK(fixed.find("workers: 2") != std::string::npos);  // the change the delay makes necessary
  CHECK_THAT(r.out, Catch::Contains("fix (--fix:") && Catch::Contains("kept"));
  // fixed.yaml is a config mltrain reads.
  CHECK(run("config check " + (d / "fixed.yaml").string()).code == 0);
}

TEST_CASE("profile --fix on the main job changes nothing it cannot prove", "[cli][profile][fix]") {
  const auto d = tmpdir("profile_fix_cnn");
  auto r = run("profile " + kSrc +
               "/configs/fashion_mnist_cnn.yaml --no-ops --wait 2 --warmup 2 --active 8 --fix "
               "--fix-rounds 3 --out " +
               d.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(slurp(d / "profile.json"));
  const std::string fixed = slurp(d / "fixed.yaml");
  check_fix_is_proven(j["fix"], fixed);
  if (j["fix"]["kept"].empty()) CHECK_THAT(fixed, Catch::Contains("# no change proven"));
  CHECK(run("config check " + (d / "fixed.yaml").string()).code == 0);
  CHECK(run("profile " + kSrc + "/configs/fashion_mnist_cnn.yaml --fix --fix-rounds 1").code == 2);
}
