#pragma once
// One temp-folder helper for every test binary: a fresh, empty folder per name under the system
// temp dir (removed first, so a rerun never sees an earlier run's files).
//
//   const auto d = mltrain::testing::fresh_temp_dir("engine_ck");   // /tmp/mltrain_test_engine_ck/
#include <filesystem>
#include <string>

namespace mltrain::testing {

inline std::filesystem::path fresh_temp_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("mltrain_test_" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace mltrain::testing
