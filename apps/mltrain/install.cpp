#include "install.hpp"

#include <fstream>
#include <system_error>

#include "mltrain/core/process.hpp"

#ifndef MLTRAIN_SOURCE_DIR
#define MLTRAIN_SOURCE_DIR ""
#endif

namespace mltrain::cli {
namespace fs = std::filesystem;
namespace {

fs::path exe_dir() { return fs::path(self_exe()).parent_path(); }

// The wheel's site-packages when this binary is site-packages/mltrain/bin/mltrain, else empty.
fs::path wheel_site() {
  const fs::path pkg = exe_dir().parent_path();
  if (pkg.filename() != "mltrain" || !fs::exists(pkg / "_launch.py")) return {};
  return pkg.parent_path();
}

}  // namespace

std::string package_line() {
  const fs::path site = wheel_site();
  if (site.empty()) return "build tree (" + self_exe() + ")";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(site, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("mltrain-", 0) != 0 || e.path().extension() != ".dist-info") continue;
    std::ifstream wheel(e.path() / "WHEEL");
    std::string line, tag;
    while (std::getline(wheel, line))
      if (line.rfind("Tag: ", 0) == 0) tag = line.substr(5);
    return "wheel " + e.path().stem().string() + (tag.empty() ? "" : " (" + tag + ")") + " in " +
           site.string();
  }
  return "wheel in " + site.string() + " (no mltrain-*.dist-info beside it: not installed by pip)";
}

fs::path examples_dir() {
  for (const fs::path& d :
       {exe_dir().parent_path() / "share" / "configs", fs::path(MLTRAIN_SOURCE_DIR) / "configs"})
    if (!d.empty() && fs::is_directory(d) && fs::exists(d / "fashion_mnist_cnn.yaml")) return d;
  return {};
}

}  // namespace mltrain::cli
