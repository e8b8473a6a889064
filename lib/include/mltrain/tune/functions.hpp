#pragma once
// Standard test functions for the tuner benchmark (scripts/bench/tune/), evaluated in-process by a
// study whose objective is `function: NAME` (no training, no child process).
//   branin      x1 in [-5, 10], x2 in [0, 15]          minimum 0.397887 (three global minima)
//   hartmann6   x1..x6 in [0, 1]                        minimum -3.32237
//   rosenbrock4 x1..x4 in [-5, 10]                      minimum 0 at (1, 1, 1, 1)
#include <string>
#include <vector>

#include "mltrain/tune/space.hpp"

namespace mltrain::tune {

struct TestFunction {
  std::string name;
  Space space;
  double minimum;
  double (*f)(const std::vector<double>&);
};

const TestFunction* find_test_function(const std::string& name);  // nullptr when unknown
std::vector<std::string> test_function_names();

}  // namespace mltrain::tune
