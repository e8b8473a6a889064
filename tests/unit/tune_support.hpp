#pragma once
// Shared by the tune tests (test_tune.cpp: journal, pruners, Pareto, study files;
// test_tune_samplers.cpp; test_tune_driver.cpp): temp folders, shell commands, small files.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "temp_dir.hpp"

namespace fs = std::filesystem;

inline const std::string kBin = MLTRAIN_BIN;

inline fs::path tmpdir(const std::string& name) {
  return mltrain::testing::fresh_temp_dir("tune_" + name);
}

// n points uniform in the unit cube (3-D, drawn in order from rng) and f at each.
template <class F>
void unit_cube_data(std::mt19937_64& rng, int n, F f, std::vector<std::vector<double>>& X,
                    std::vector<double>& y) {
  std::uniform_real_distribution<double> U(0, 1);
  for (int i = 0; i < n; ++i) {
    X.push_back({U(rng), U(rng), U(rng)});
    y.push_back(f(X.back()));
  }
}

inline int sh(const std::string& cmd) {
  const int s = std::system(cmd.c_str());
  return WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
}

inline void write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }
