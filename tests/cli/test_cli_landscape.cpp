// `mltrain landscape`.
#include "cli_support.hpp"

TEST_CASE("landscape: slices of a trained run; bad paths exit 3", "[cli][landscape]") {
  auto d = tmpdir("landscape");
  auto args = small_run(d, "ls");
  args.push_back("train.duration=20u");
  REQUIRE(run(join(args, 1)).code == 0);
  auto r = run("landscape " + (d / "ls/v0").string() +
               " --points 5 --grid 3 --batches 1 --batch-size 64");
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("sharpness"));
  const auto csv = slurp(d / "ls/v0/landscape/landscape_1d.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 6);
  CHECK_THAT(csv, Catch::Contains("\n0,"));  // the trained point itself
  const auto grid = slurp(d / "ls/v0/landscape/landscape_2d.csv");
  CHECK(std::count(grid.begin(), grid.end(), '\n') == 10);
  CHECK_THAT(slurp(d / "ls/v0/landscape/landscape_2d.svg"), Catch::Contains("<rect"));
  // The centre is the trained weights: on batches covering the whole (3,000-sample) training
  // split its loss is the run's training-split loss as `mltrain evaluate` computes it.
  REQUIRE(run("landscape " + (d / "ls/v0").string() +
              " --points 3 --grid 1 --batches 1 --batch-size 3000")
              .code == 0);
  const auto land =
      nlohmann::json::parse(slurp(d / "ls/v0/landscape/landscape.json")).at("center_loss");
  const auto ev = run("evaluate " + (d / "ls/v0").string() + " --split train --json");
  INFO(ev.out);
  REQUIRE(ev.code == 0);
  const double train_loss = json_of(ev.out).at("metrics").at("loss").get<double>();
  CHECK(land.get<double>() == Approx(train_loss).epsilon(1e-5));
  CHECK(run("landscape " + (d / "nothing").string()).code == 3);
  fs::resize_file(d / "ls/v0/checkpoints/step_20/model.safetensors", 10);
  auto bad = run("landscape " + (d / "ls/v0/checkpoints/step_20").string());
  CHECK(bad.code == 3);
  CHECK_THAT(bad.out, Catch::Contains("damaged checkpoint"));
}
