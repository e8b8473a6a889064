#pragma once
// Standard test functions for the tuner benchmark (scripts/bench/tune/), evaluated in-process by a
// study whose objective is `function: NAME` (no training, no child process).
//   branin      x1 in [-5, 10], x2 in [0, 15]          minimum 0.397887 (three global minima)
//   hartmann6   x1..x6 in [0, 1]                        minimum -3.32237
//   rosenbrock4 x1..x4 in [-5, 10]                      minimum 0 at (1, 1, 1, 1)
//   styblinski_tang4 x1..x4 in [-5, 5]                  minimum -156.66466 at xi = -2.903534
//                    (2^4 local minima: the parallel-suggestion benchmark's fourth problem)
//   mixed5      optimizer in {sgd, adam, rmsprop}, lr in [1e-5, 1] (log), layers in 1..8, width in
//               16..1024 (int, log), dropout in [0, 0.5] step 0.05   minimum 0 at (adam, 1e-3, 3,
//               256, 0.15): a categorical/integer/log space (Optuna comparison, issue #46)
// Learning curves for the pruning benchmark (one value per step, 27 steps, minimised; the same
// formulas are in scripts/bench/tune/curves.py for Optuna):
//   curves_parallel  x1..x4 in [0, 1]: final(x) + exp(-t / 6); curves never cross (but for noise)
//   curves_crossing  lr in [1e-4, 1] (log), x1, x2 in [0, 1]: a large lr converges fast to a high
//                    floor, a small one slowly to a low floor, so early leaders lose in the end
// Both add a deterministic noise of amplitude 0.01 (a function of x and t).
// Two objectives (Zitzler, Deb & Thiele 2000), x1..x5 in [0, 1], both minimised:
//   zdt1  f1 = x1, f2 = g (1 - sqrt(f1 / g)), g = 1 + 9 mean(x2..x5): a convex front at g = 1
//   zdt2  the same with f2 = g (1 - (f1 / g)^2): a concave front
#include <string>
#include <vector>

#include "mltrain/tune/space.hpp"

namespace mltrain::tune {

struct TestFunction {
  std::string name;
  Space space;
  double minimum;
  double (*f)(const std::vector<double>&);
  int steps = 0;  // > 0: a learning curve, curve(x, t) for t = 1..steps (f is its last value)
  double (*curve)(const std::vector<double>&, int t) = nullptr;
  // > 1 objectives (f is the first): all of them, minimised, named f1, f2, ...
  int n_objectives = 1;
  std::vector<double> (*fm)(const std::vector<double>&) = nullptr;
};

const TestFunction* find_test_function(const std::string& name);  // nullptr when unknown
std::vector<std::string> test_function_names();

}  // namespace mltrain::tune
