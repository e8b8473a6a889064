#pragma once
// Loss-landscape slices around trained weights (Li et al. 2018, "Visualizing the Loss Landscape
// of Neural Nets"): random Gaussian directions, filter-normalised so each filter of the direction
// has the norm of the matching filter of the weights; directions for 1-D tensors (biases,
// BatchNorm) are zero, as in the paper. Loss is measured in eval mode on fixed real batches.
//
//   LandscapeOptions o;  o.points = 21;  o.grid = 11;
//   auto r = compute_landscape("runs/x/v0", o);   // run folder or checkpoints/step_<N>
//   write_landscape(r, "runs/x/v0/landscape");    // CSV + SVG + landscape.json
#include <filesystem>
#include <string>
#include <vector>

namespace mltrain::landscape {

struct LandscapeOptions {
  int64_t points = 21;  // 1-D slice samples over [-range, range]
  int64_t grid = 11;    // 2-D slice: grid x grid samples
  double range = 1.0;
  int64_t batches = 4, batch_size = 256;
  uint64_t seed = 0;
  double sharpness_radius = 0.25;  // in filter-normalised units
};

struct LandscapeResult {
  std::string checkpoint;
  std::vector<double> alphas, loss_1d, acc_1d;
  std::vector<double> grid_axis;  // the same axis for alpha and beta
  std::vector<double> loss_2d;    // row-major [beta][alpha]
  double center_loss = 0;
  double sharpness =
      0;  // Keskar et al. 2017: 100 * (max loss within radius - center) / (1 + center)
  double curvature = 0;  // second derivative of the 1-D slice at 0 (central difference)
};

LandscapeResult compute_landscape(const std::filesystem::path& run_or_checkpoint,
                                  const LandscapeOptions& opt);
// Sharpness and curvature from r's sampled losses (alphas, loss_1d, grid_axis, loss_2d,
// center_loss): what compute_landscape does after measuring, exposed for tests.
void summarize(LandscapeResult& r, const LandscapeOptions& opt);
void write_landscape(const LandscapeResult& r, const std::filesystem::path& out_dir);

}  // namespace mltrain::landscape
