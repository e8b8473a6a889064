#include <iostream>

#include "commands.hpp"
#include "mltrain/quant/quantize.hpp"

namespace mltrain::cli {

void setup_quantize(CLI::App& app, Action& run) {
  struct Opts {
    std::string where;
    quant::QuantizeOptions qo;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("quantize", "post-training static int8 (first cut: the cnn): mltrain quantize RUN_DIR|CHECKPOINT "
                                             "[--calib-batches N] [--observer minmax|moving_average_minmax|percentile|entropy]");
  sub->add_option("run", o->where, "run folder or checkpoint folder")->required();
  sub->add_option("--calib-batches", o->qo.calib_batches, "training batches of 128 for calibration")->capture_default_str();
  sub->add_option("--observer", o->qo.observer, "activation range observer")
      ->check(CLI::IsMember({"minmax", "moving_average_minmax", "percentile", "entropy"}))
      ->capture_default_str();
  sub->add_option("--engine", o->qo.engine, "quantized kernels: auto | onednn | qnnpack")
      ->check(CLI::IsMember({"auto", "onednn", "qnnpack"}))
      ->capture_default_str();
  sub->add_option("-o,--output", o->qo.out_dir, "output folder (default: <run>/quantized)");
  sub->add_flag("--json", o->json, "print the JSON report");
  sub->callback([o, &run] {
    run = [o] {
      const auto r = quant::quantize_run(o->where, o->qo);
      std::cout << (o->json ? r.dump(2) + "\n" : quant::quantize_text(r));
      return 0;
    };
  });
}

}  // namespace mltrain::cli
