// mltrain: thin front over the engine. The only place that catches errors and maps them to exit
// codes (core/error.hpp's kExitCodeDocs, which --help prints): 128+N after a clean stop on signal N
// is how bash reports signal deaths, so parent scripts can tell.
#include <c10/util/Exception.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "install.hpp"
#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/runtime/runtime.hpp"
#include "mltrain/core/signals.hpp"

#ifndef MLTRAIN_VERSION
#define MLTRAIN_VERSION "0.1.0"
#endif
#ifndef MLTRAIN_CUDA_BUILD
#define MLTRAIN_CUDA_BUILD ""
#endif
#ifndef MLTRAIN_BUILD_OPTIONS
#define MLTRAIN_BUILD_OPTIONS ""
#endif

static void print_version() {
  namespace compat = mltrain::compat;
  const auto k = mltrain::runtime::kernels();
  const int gpus = compat::cuda_device_count();
  std::cout << "mltrain " << MLTRAIN_VERSION << "\n"
            << "package: " << mltrain::cli::package_line() << "\n"
            << "LibTorch " << compat::torch_version() << " (" << mltrain::runtime::libtorch_path()
            << ")\n"
            << "CUDA compiled in: "
            << (compat::cuda_built() ? std::string("yes (") + MLTRAIN_CUDA_BUILD + ")" : "no")
            << "; GPUs visible: " << gpus
            << (gpus == 0 ? " (runtime.device=auto trains on the CPU)" : "") << "\n"
            << "CUDA libraries: " << compat::cuda_plugin_status()
            << "; libtorch_cuda.so in this process: "
            << (compat::cuda_libraries_mapped() ? "yes" : "no") << "\n"
            << "kernels: BLAS " << k["blas"].get<std::string>() << ", oneDNN "
            << k["onednn"].get<std::string>() << ", CPU capability "
            << k["cpu_capability"].get<std::string>() << ", native bf16 "
            << (k["bf16"].get<bool>() ? "yes" : "no (bf16 autocast would be slower than fp32)")
            << "\n"
            << "build: " << MLTRAIN_BUILD_OPTIONS << "\n"
            << "runtime defaults: threads=auto (" << mltrain::runtime::usable_cores()
            << " usable cores), allocator=retain, kernel_route=onednn\n";
}

// Prints the failure and, under torchrun, leaves it in TORCHELASTIC_ERROR_FILE as well: torchrun's
// failure summary then shows this message instead of "<N/A>".
static int fail(const std::string& message, int code) {
  std::cerr << "error: " << message << "\n";
  if (const char* path = std::getenv("TORCHELASTIC_ERROR_FILE"); path && *path) {
    std::ofstream f(path);
    f << nlohmann::json{{"message", "mltrain: " + message}, {"timestamp", std::time(nullptr)}}
             .dump()
      << "\n";
  }
  return code;
}

int main(int argc, char** argv) {
  mltrain::install_crash_reporter();
  // Logs go to stderr, so stdout carries only results (`--json` reports, `config schema`, ...).
  // (The default logger keeps its identity and lifetime; only its sink changes.)
  spdlog::default_logger()->sinks() = {std::make_shared<spdlog::sinks::stderr_color_sink_mt>()};
  spdlog::set_pattern("%H:%M:%S %^%l%$ %v");
  // Before any LibTorch call: ATen caches its CUDA hooks when first asked (runtime/cuda_plugin.hpp).
  mltrain::compat::cuda_plugin();
  CLI::App app{"mltrain: a training orchestrator on LibTorch.\n" + mltrain::exit_codes_text()};
  app.set_help_all_flag("--help-all", "help for every subcommand");
  bool version = false;
  app.add_flag("--version", version, "print mltrain, LibTorch and build options");
  mltrain::cli::Action run;
  mltrain::cli::setup_init(app, run);
  mltrain::cli::setup_train(app, run);
  mltrain::cli::setup_evaluate(app, run);
  mltrain::cli::setup_predict(app, run);
  mltrain::cli::setup_config(app, run);
  mltrain::cli::setup_data(app, run);
  mltrain::cli::setup_schedule(app, run);
  mltrain::cli::setup_landscape(app, run);
  mltrain::cli::setup_profile(app, run);
  mltrain::cli::setup_checklist(app, run);
  mltrain::cli::setup_runs(app, run);
  mltrain::cli::setup_report(app, run);
  mltrain::cli::setup_fuse(app, run);
  mltrain::cli::setup_quantize(app, run);
  mltrain::cli::setup_tune(app, run);
  mltrain::cli::setup_track(app, run);
  mltrain::cli::setup_launch(app, run);
  mltrain::cli::setup_slurm(app, run);
  mltrain::cli::setup_completion(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "error: " << e.what() << "\n  fix: see `mltrain --help`\n";
    return mltrain::kExitUsage;
  }
  if (version) {
    print_version();
    return 0;
  }
  if (!run) {
    std::cerr << app.help() << "error: name a subcommand\n";
    return mltrain::kExitUsage;
  }
  // scripts/dev/check_docs.py: every documented command line must parse; nothing runs.
  if (const char* parse_only = std::getenv("MLTRAIN_PARSE_ONLY"); parse_only && *parse_only == '1')
    return 0;
  try {
    return run();
  } catch (const mltrain::Interrupted& e) {
    spdlog::warn("{}; checkpoint written, exiting with {}", e.what(),
                 mltrain::kExitSignalBase + e.signal());
    return mltrain::kExitSignalBase + e.signal();
  } catch (const mltrain::Error& e) {
    return fail(e.what(), e.exit_code());
  } catch (const c10::OutOfMemoryError& e) {  // outside the trainer's own recovery
    return fail(std::string("out of memory: ") + e.what_without_backtrace() +
                    "\n  fix: raise runtime.memory_budget, set data.batch_size=auto (with "
                    "train.global_batch), or memory.checkpoint=blocks",
                mltrain::kExitRuntime);
  } catch (const c10::Error& e) {
    return fail(std::string("LibTorch: ") + e.what_without_backtrace(), mltrain::kExitRuntime);
  } catch (const std::exception& e) {
    return fail(e.what(), mltrain::kExitRuntime);
  }
}
