// The experiment config reader: YAML text, then (after a NUL byte) key=value overrides, one a line.
// Accepted configs must print (`--print-config`) to YAML that reads back to the same bytes.
#include "fuzz_support.hpp"
#include "mltrain/config/experiment.hpp"

#include <sstream>
#include <vector>

using namespace mltrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  std::vector<std::string> overrides;
  if (nul != std::string::npos) {
    std::istringstream rest(in.substr(nul + 1));
    for (std::string line; std::getline(rest, line);) overrides.push_back(line);
  }
  const std::string path = fuzz::put("config.yaml", in.substr(0, nul));
  config::ExperimentConfig cfg;
  if (!fuzz::accepts([&] { cfg = config::load_experiment(path, overrides); })) return 0;
  const std::string printed = config::to_yaml(cfg);
  const std::string again_path = fuzz::put("printed.yaml", printed);
  config::ExperimentConfig again;
  fuzz::require(fuzz::accepts([&] { again = config::load_experiment(again_path, {}); }),
                "a printed config reads back");
  fuzz::require(config::to_yaml(again) == printed, "a printed config prints the same bytes");
  return 0;
}
