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
      d.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(slurp(d / "profile.json"));
  CHECK(j["diagnosis"]["verdict"] == "data-bound");
  CHECK(j["measure"]["phase_share"]["data"].get<double>() >= 0.15);
  CHECK(j["diagnosis"]["evidence"].size() >= 2);
  REQUIRE(j["sweep"]["rows"].size() == 2);
  CHECK((j["sweep"]["best"] == "0" || j["sweep"]["best"] == "1"));
  CHECK(r.out.find("sweep data.workers:") != std::string::npos);
  CHECK(
      run("profile " + kSrc + "/configs/starved_loader.yaml --sweep data.workers --no-ops").code ==
      2);
}
