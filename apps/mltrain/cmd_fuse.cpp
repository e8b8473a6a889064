#include <iostream>

#include "commands.hpp"
#include "mltrain/deploy/fuse.hpp"

namespace mltrain::cli {

void setup_fuse(CLI::App& app, Action& run) {
  struct Opts {
    std::string where;
    deploy::FuseOptions fo;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand(
      "fuse",
      "fold BatchNorm into the preceding conv/linear layers for inference, with proof: "
      "mltrain fuse RUN_DIR|CHECKPOINT [-o OUT]");
  sub->add_option("run", o->where,
                  "run folder (its latest intact checkpoint) or a checkpoint folder")
      ->required();
  sub->add_option("-o,--output", o->fo.out_dir, "output folder (default: <run>/fused)");
  sub->add_option("--batches", o->fo.batches, "test batches of 128 to compare outputs on")
      ->capture_default_str();
  sub->add_flag("--json", o->json, "print the JSON report");
  sub->callback([o, &run] {
    run = [o] {
      const auto r = deploy::fuse_run(o->where, o->fo);
      std::cout << (o->json ? r.to_json().dump(2) + "\n" : r.to_text());
      return 0;
    };
  });
}

}  // namespace mltrain::cli
