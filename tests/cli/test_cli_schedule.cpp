// `mltrain schedule`.
#include "cli_support.hpp"

TEST_CASE("schedule: CSV of every step and an SVG, without training", "[cli][schedule]") {
  auto d = tmpdir("schedule");
  auto r = run("schedule " + kSrc +
               "/configs/fashion_mnist_cnn.yaml schedule.warmup=100u train.duration=1000u --csv " +
               (d / "lr.csv").string() + " --svg " + (d / "lr.svg").string());
  REQUIRE(r.code == 0);
  const auto csv = slurp(d / "lr.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 1001);
  CHECK(csv.rfind("step,lr\n0,0\n1,1e-05\n", 0) ==
        0);  // linear warm-up from 0 to 0.001 over 100 steps
  CHECK_THAT(slurp(d / "lr.svg"), Catch::Contains("<polyline"));
  CHECK(run("schedule " + kSrc + "/configs/fashion_mnist_cnn.yaml schedule.name=wobbly").code == 2);
}
