#include "mltrain/tune/space.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace mltrain::tune {

Param Param::floating(std::string name, double low, double high, bool log, double step) {
  Param p;
  p.kind = Kind::Float, p.name = std::move(name), p.low = low, p.high = high, p.log = log,
  p.step = step;
  return p;
}
Param Param::integer(std::string name, int64_t low, int64_t high, bool log, int64_t step) {
  Param p;
  p.kind = Kind::Int, p.name = std::move(name), p.low = double(low), p.high = double(high),
  p.log = log, p.step = double(step);
  return p;
}
Param Param::categorical(std::string name, std::vector<nlohmann::json> choices) {
  Param p;
  p.kind = Kind::Categorical, p.name = std::move(name), p.choices = std::move(choices), p.low = 0,
  p.high = double(p.choices.size() - 1);
  return p;
}

double Param::to_unit(double x) const {
  if (high == low) return 0.5;
  if (log) return (std::log(x) - std::log(low)) / (std::log(high) - std::log(low));
  return (x - low) / (high - low);
}

double Param::snap(double x) const {
  x = std::clamp(x, low, high);
  if (kind == Kind::Categorical) return std::clamp(std::round(x), 0.0, high);
  if (step > 0) {
    const double k = std::round((x - low) / step);
    x = std::min(low + k * step, high);
    if (x > high - 1e-12 * std::fabs(high)) x = low + std::floor((high - low) / step + 1e-9) * step;
  }
  if (kind == Kind::Int) x = std::round(x);
  return x;
}

double Param::from_unit(double u) const {
  u = std::clamp(u, 0.0, 1.0);
  const double x =
      log ? std::exp(std::log(low) + u * (std::log(high) - std::log(low))) : low + u * (high - low);
  return snap(x);
}

double Param::sample(std::mt19937_64& rng) const {
  std::uniform_real_distribution<double> U(0.0, 1.0);
  if (kind == Kind::Categorical) return std::min(std::floor(U(rng) * double(choices.size())), high);
  if (kind == Kind::Int && !log) {  // every integer on the step grid equally likely
    const int64_t n = int64_t(std::floor((high - low) / step + 1e-9)) + 1;
    return low + double(std::min<int64_t>(int64_t(U(rng) * double(n)), n - 1)) * step;
  }
  if (kind ==
      Kind::
          Int) {  // log-uniform over [low - 0.5, high + 0.5], rounded (each integer its log share)
    const double a = std::log(std::max(low - 0.5, 1e-12)), b = std::log(high + 0.5);
    return snap(std::exp(a + U(rng) * (b - a)));
  }
  return from_unit(U(rng));
}

nlohmann::json Param::to_json(double x) const {
  switch (kind) {
    case Kind::Categorical:
      return choices.at(size_t(std::clamp(std::round(x), 0.0, high)));
    case Kind::Int:
      return int64_t(std::llround(x));
    default:
      return x;
  }
}

double Param::from_json(const nlohmann::json& v) const {
  if (kind == Kind::Categorical) {
    for (size_t i = 0; i < choices.size(); ++i)
      if (choices[i] == v) return double(i);
    throw std::invalid_argument(name + ": " + v.dump() + " is not one of the choices");
  }
  if (!v.is_number()) throw std::invalid_argument(name + ": " + v.dump() + " is not a number");
  const double x = v.get<double>();
  if (x < low - 1e-12 * std::fabs(low) || x > high + 1e-12 * std::fabs(high))
    throw std::invalid_argument(name + ": " + v.dump() + " is outside [" + std::to_string(low) +
                                ", " + std::to_string(high) + "]");
  return x;
}

std::vector<double> Param::grid_values() const {
  if (!grid.empty()) return grid;
  std::vector<double> v;
  if (kind == Kind::Categorical) {
    for (size_t i = 0; i < choices.size(); ++i) v.push_back(double(i));
  } else if (step > 0) {
    for (double x = low; x <= high + 1e-9 * std::max(1.0, std::fabs(high)); x += step)
      v.push_back(snap(x));
  }
  return v;  // empty: a continuous parameter without a grid (the grid sampler rejects it)
}

nlohmann::json params_json(const Space& s, const std::vector<double>& x) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t i = 0; i < s.size(); ++i) j[s[i].name] = s[i].to_json(x[i]);
  return j;
}

std::vector<double> params_from_json(const Space& s, const nlohmann::json& j) {
  std::vector<double> x;
  for (const auto& p : s) {
    if (!j.contains(p.name)) throw std::invalid_argument("missing parameter " + p.name);
    x.push_back(p.from_json(j.at(p.name)));
  }
  return x;
}

}  // namespace mltrain::tune
