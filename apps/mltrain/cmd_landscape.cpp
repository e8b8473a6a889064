#include <iostream>

#include "commands.hpp"
#include "mltrain/landscape/landscape.hpp"

namespace mltrain::cli {

void setup_landscape(CLI::App& app, Action& run) {
  struct Opts {
    std::string path, out;
    landscape::LandscapeOptions o;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand(
      "landscape", "1-D and 2-D loss slices around a trained model (Li et al. 2018), CSV + SVG");
  sub->add_option("path", o->path, "run folder (runs/<name>/v<N>) or a checkpoint folder")
      ->required();
  sub->add_option("-o,--output", o->out, "output folder (default: <run>/landscape)");
  sub->add_option("--points", o->o.points, "1-D samples");
  sub->add_option("--grid", o->o.grid, "2-D samples per axis");
  sub->add_option("--range", o->o.range, "slice half-width in filter-normalised units");
  sub->add_option("--batches", o->o.batches, "training batches the loss is measured on");
  sub->add_option("--batch-size", o->o.batch_size, "samples per batch");
  sub->add_option("--seed", o->o.seed, "seed of the random directions");
  sub->callback([&run, o] {
    run = [o] {
      auto r = landscape::compute_landscape(o->path, o->o);
      std::filesystem::path out = o->out;
      if (out.empty()) {
        std::filesystem::path p = r.checkpoint;
        out = p.parent_path().parent_path() / "landscape";
      }
      landscape::write_landscape(r, out);
      std::cout << "center loss " << r.center_loss << ", sharpness " << r.sharpness << " (radius "
                << o->o.sharpness_radius << "), curvature " << r.curvature << "\nwrote "
                << out.string() << "/{landscape_1d,landscape_2d}.{csv,svg}, landscape.json\n";
      return 0;
    };
  });
}

}  // namespace mltrain::cli
