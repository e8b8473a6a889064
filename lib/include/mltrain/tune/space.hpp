#pragma once
// The search space of `mltrain tune`: float (uniform or log), int (step, log) and categorical
// parameters. Samplers work in a unit cube: each numeric parameter maps to [0, 1] (in log space
// when log), a categorical one is its choice index. Values in trials are doubles: the number
// itself for float/int, the index for categorical.
//
//   Param p = Param::floating("optim.lr", 1e-4, 1e-1, /*log=*/true);
//   double x = p.from_unit(0.5);        // 3.16e-3
//   nlohmann::json v = p.to_json(x);    // what the trial receives
#include <nlohmann/json.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace mltrain::tune {

struct Param {
  enum class Kind { Float, Int, Categorical };
  Kind kind = Kind::Float;
  std::string name;
  double low = 0, high = 1;
  bool log = false;
  double step = 0;                      // float: 0 (continuous) or a grid step; int: >= 1
  std::vector<nlohmann::json> choices;  // categorical
  std::vector<double> grid;  // explicit values for the grid sampler (float/int; optional)

  static Param floating(std::string name, double low, double high, bool log = false,
                        double step = 0);
  static Param integer(std::string name, int64_t low, int64_t high, bool log = false,
                       int64_t step = 1);
  static Param categorical(std::string name, std::vector<nlohmann::json> choices);

  bool numeric() const { return kind != Kind::Categorical; }
  size_t n_choices() const { return choices.size(); }
  double to_unit(double x) const;    // numeric only
  double from_unit(double u) const;  // clamps, then snaps to step / integers
  double snap(double x) const;       // to the nearest legal value
  double sample(
      std::mt19937_64& rng) const;  // uniform (log-uniform when log) over the legal values
  nlohmann::json to_json(double x) const;
  double from_json(const nlohmann::json& v) const;  // throws std::invalid_argument when not legal
  std::vector<double> grid_values() const;          // for the grid sampler
};

using Space = std::vector<Param>;

nlohmann::json params_json(const Space& s, const std::vector<double>& x);
std::vector<double> params_from_json(const Space& s, const nlohmann::json& j);

}  // namespace mltrain::tune
