#include "mltrain/landscape/landscape.hpp"

#include "mltrain/train/pipeline.hpp"

#include <spdlog/spdlog.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "mltrain/config/format.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/runtime/runtime.hpp"
#include "mltrain/core/svg.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/model/model.hpp"

namespace fs = std::filesystem;

namespace mltrain::landscape {
using train::load_trained_model;
using train::plain_loader_options;
namespace {}  // namespace

LandscapeResult compute_landscape(const fs::path& where, const LandscapeOptions& opt) {
  auto tm = load_trained_model(where, "landscape");
  const auto& cfg = tm.cfg;
  auto& splits = tm.splits;
  auto& model = tm.model;
  torch::NoGradGuard no_grad;
  model->set_training(false);

  // Fixed real batches from the training split (no augmentation, fixed order).
  data::LoaderOptions lo =
      plain_loader_options(cfg, opt.batch_size, /*shuffle=*/true, /*drop_last=*/true);
  lo.seed = opt.seed;
  data::Loader loader(splits.train, lo);
  loader.start_epoch(0);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  data::Batch b;
  while (static_cast<int64_t>(batches.size()) < opt.batches && loader.next(b))
    batches.emplace_back(b.x.clone(), b.y.clone());

  // Filter-normalised directions (Li et al. 2018, section 4): per output filter, scale the random
  // direction to the norm of that filter of the weights; zero for 1-D tensors.
  const auto theta = model->named_parameters();
  std::vector<torch::Tensor> base, d1, d2;
  torch::manual_seed(opt.seed);
  for (const auto& [name, p] : theta) {
    base.push_back(p.detach().clone());
    for (auto* d : {&d1, &d2}) {
      auto r = torch::randn_like(p);
      if (p.dim() <= 1) {
        r.zero_();
      } else {
        auto rf = r.flatten(1), pf = p.detach().flatten(1);
        rf.mul_(pf.norm(2, {1}, true) / (rf.norm(2, {1}, true) + 1e-10));
      }
      d->push_back(r);
    }
  }
  auto set_point = [&](double a, double c) {
    for (size_t i = 0; i < theta.size(); ++i)
      theta[i].second.copy_(base[i] + d1[i] * a + d2[i] * c);
  };
  auto measure = [&](double& loss, double& acc) {
    double l = 0;
    int64_t correct = 0, n = 0;
    for (const auto& [x, y] : batches) {
      auto logits = model->forward(x);
      l += torch::nn::functional::cross_entropy(
               logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
               .item<double>();
      correct += logits.argmax(1).eq(y).sum().item<int64_t>();
      n += y.size(0);
    }
    loss = l / n;
    acc = double(correct) / n;
  };

  LandscapeResult r;
  r.checkpoint = tm.checkpoint.string();
  for (int64_t i = 0; i < opt.points; ++i) {
    const double a = opt.points == 1 ? 0 : -opt.range + 2 * opt.range * i / (opt.points - 1);
    set_point(a, 0);
    double l, acc;
    measure(l, acc);
    r.alphas.push_back(a), r.loss_1d.push_back(l), r.acc_1d.push_back(acc);
  }
  for (int64_t i = 0; i < opt.grid; ++i)
    r.grid_axis.push_back(opt.grid == 1 ? 0 : -opt.range + 2 * opt.range * i / (opt.grid - 1));
  for (double c : r.grid_axis)
    for (double a : r.grid_axis) {
      set_point(a, c);
      double l, acc;
      measure(l, acc);
      r.loss_2d.push_back(l);
    }
  set_point(0, 0);
  double acc0;
  measure(r.center_loss, acc0);
  summarize(r, opt);
  return r;
}

void summarize(LandscapeResult& r, const LandscapeOptions& opt) {
  double worst = r.center_loss;
  for (size_t i = 0; i < r.alphas.size(); ++i)
    if (std::abs(r.alphas[i]) <= opt.sharpness_radius + 1e-12)
      worst = std::max(worst, r.loss_1d[i]);
  for (size_t bi = 0; bi < r.grid_axis.size(); ++bi)
    for (size_t ai = 0; ai < r.grid_axis.size(); ++ai)
      if (std::hypot(r.grid_axis[ai], r.grid_axis[bi]) <= opt.sharpness_radius + 1e-12)
        worst = std::max(worst, r.loss_2d[bi * r.grid_axis.size() + ai]);
  r.sharpness = 100 * (worst - r.center_loss) / (1 + r.center_loss);
  const double h =
      2 * opt.range / std::max<int64_t>(1, opt.points - 1);  // central difference at alpha = 0
  const size_t mid = r.alphas.size() / 2;
  if (r.alphas.size() >= 3 && r.alphas.size() % 2 == 1)
    r.curvature = (r.loss_1d[mid - 1] - 2 * r.loss_1d[mid] + r.loss_1d[mid + 1]) / (h * h);
}

void write_landscape(const LandscapeResult& r, const fs::path& out) {
  fs::create_directories(out);
  std::string c1 = "alpha,loss,accuracy\n";
  for (size_t i = 0; i < r.alphas.size(); ++i)
    c1 += config::format_double(r.alphas[i]) + "," + config::format_double(r.loss_1d[i]) + "," +
          config::format_double(r.acc_1d[i]) + "\n";
  write_file_atomic((out / "landscape_1d.csv").string(), c1);
  std::string c2 = "alpha,beta,loss\n";
  const size_t g = r.grid_axis.size();
  for (size_t bi = 0; bi < g; ++bi)
    for (size_t ai = 0; ai < g; ++ai)
      c2 += config::format_double(r.grid_axis[ai]) + "," + config::format_double(r.grid_axis[bi]) +
            "," + config::format_double(r.loss_2d[bi * g + ai]) + "\n";
  write_file_atomic((out / "landscape_2d.csv").string(), c2);
  SvgChart chart("loss along a filter-normalised direction (sharpness " +
                     config::format_double(std::round(r.sharpness * 100) / 100) + ")",
                 "alpha", "training loss");
  chart.add_series("loss", r.alphas, r.loss_1d);
  write_file_atomic((out / "landscape_1d.svg").string(), chart.render());
  write_file_atomic((out / "landscape_2d.svg").string(),
                    svg_heatmap("loss over two filter-normalised directions", r.grid_axis,
                                r.grid_axis, r.loss_2d, "alpha", "beta"));
  nlohmann::json j = {
      {"checkpoint", r.checkpoint},
      {"center_loss", r.center_loss},
      {"sharpness", r.sharpness},
      {"sharpness_definition",
       "100 * (max loss within the radius - center loss) / (1 + center loss), Keskar et al. 2017"},
      {"curvature_1d", r.curvature}};
  write_file_atomic((out / "landscape.json").string(), j.dump(2) + "\n");
}

}  // namespace mltrain::landscape
