#pragma once
// Where this mltrain was installed from, for --version and `mltrain config example`: a pip wheel
// (site-packages/mltrain/bin/mltrain, packaging/install.cmake) or a build tree (build/apps/mltrain).
//
//   std::cout << mltrain::cli::package_line();   // "wheel mltrain-0.1.0 (py3-none-...) in /venv/..."
//   const auto dir = mltrain::cli::examples_dir();  // the example configs, empty if none
#include <filesystem>
#include <string>

namespace mltrain::cli {
std::string package_line();
std::filesystem::path examples_dir();
}  // namespace mltrain::cli
