// landscape::summarize: sharpness (Keskar et al. 2017) and the 1-D curvature on losses sampled from
// a quadratic with known curvature, where both have closed forms.
#include <catch2/catch.hpp>

#include <cmath>

#include "mltrain/landscape/landscape.hpp"

using namespace mltrain::landscape;

TEST_CASE(
    "landscape: on L = 1 + k (a^2 + b^2) the curvature is 2k and the sharpness "
    "100 k r^2 / 2 at the widest sampled radius r within the sharpness radius",
    "[landscape]") {
  for (const double k : {0.5, 3.0}) {
    LandscapeOptions o;
    o.points = 21, o.grid = 11, o.range = 1.0, o.sharpness_radius = 0.25;
    LandscapeResult r;
    auto loss = [&](double a, double b) { return 1 + k * (a * a + b * b); };
    for (int64_t i = 0; i < o.points; ++i) {
      const double a = -1 + 2.0 * double(i) / double(o.points - 1);  // step 0.1
      r.alphas.push_back(a);
      r.loss_1d.push_back(loss(a, 0));
    }
    for (int64_t i = 0; i < o.grid; ++i) r.grid_axis.push_back(-1 + 2.0 * double(i) / 10);  // 0.2
    for (double b : r.grid_axis)
      for (double a : r.grid_axis) r.loss_2d.push_back(loss(a, b));
    r.center_loss = loss(0, 0);
    summarize(r, o);
    CHECK(r.curvature == Approx(2 * k).epsilon(1e-9));  // central differences are exact here
    // Within radius 0.25: the 1-D slice reaches |a| = 0.2, the grid (0.2, 0) but not (0.2, 0.2).
    CHECK(r.sharpness == Approx(100 * k * 0.04 / 2).epsilon(1e-9));
  }
}
