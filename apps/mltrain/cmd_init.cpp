// `mltrain init DATA_PATH [-o config.yaml]`: a config that trains on the data as it is.
#include <iostream>

#include "commands.hpp"
#include "mltrain/init/init.hpp"

namespace mltrain::cli {

void setup_init(CLI::App& app, Action& run) {
  auto o = std::make_shared<init::InitOptions>();
  auto* sub = app.add_subcommand(
      "init",
      "look at a data set and write a commented config that trains on it: mltrain init DATA_PATH "
      "[-o config.yaml]");
  sub->add_option("data", o->data,
                  "an image folder (DATA/<class>/ or DATA/train + DATA/test), a .csv table, a "
                  "token folder (train.bin, val.bin) or file, a folder of IDX/.npy images and "
                  "labels, or a chunk set")
      ->required();
  sub->add_option("-o,--output", o->out, "the config to write")->capture_default_str();
  sub->add_flag("--force", o->force, "overwrite the output if it exists");
  sub->add_option("--model", o->model,
                  "a torch.export program (.pt2) to train instead of the proposed model "
                  "(model.name: exported)");
  sub->callback([o, &run] {
    run = [o] {
      std::cout << init::init_config(*o).to_text();
      return 0;
    };
  });
}

}  // namespace mltrain::cli
