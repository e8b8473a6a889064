#include "mltrain/tune/functions.hpp"

#include <cmath>

namespace mltrain::tune {
namespace {

double branin(const std::vector<double>& x) {
  const double a = 1, b = 5.1 / (4 * M_PI * M_PI), c = 5 / M_PI, r = 6, s = 10, t = 1 / (8 * M_PI);
  const double u = x[1] - b * x[0] * x[0] + c * x[0] - r;
  return a * u * u + s * (1 - t) * std::cos(x[0]) + s;
}

double hartmann6(const std::vector<double>& x) {
  static const double alpha[4] = {1.0, 1.2, 3.0, 3.2};
  static const double A[4][6] = {{10, 3, 17, 3.5, 1.7, 8},
                                 {0.05, 10, 17, 0.1, 8, 14},
                                 {3, 3.5, 1.7, 10, 17, 8},
                                 {17, 8, 0.05, 10, 0.1, 14}};
  static const double P[4][6] = {{1312, 1696, 5569, 124, 8283, 5886},
                                 {2329, 4135, 8307, 3736, 1004, 9991},
                                 {2348, 1451, 3522, 2883, 3047, 6650},
                                 {4047, 8828, 8732, 5743, 1091, 381}};
  double s = 0;
  for (int i = 0; i < 4; ++i) {
    double e = 0;
    for (int j = 0; j < 6; ++j)
      e += A[i][j] * (x[size_t(j)] - P[i][j] * 1e-4) * (x[size_t(j)] - P[i][j] * 1e-4);
    s += alpha[i] * std::exp(-e);
  }
  return -s;
}

double rosenbrock(const std::vector<double>& x) {
  double s = 0;
  for (size_t i = 0; i + 1 < x.size(); ++i)
    s += 100 * (x[i + 1] - x[i] * x[i]) * (x[i + 1] - x[i] * x[i]) + (1 - x[i]) * (1 - x[i]);
  return s;
}

double styblinski_tang(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += 0.5 * (v * v * v * v - 16 * v * v + 5 * v);
  return s;
}

// A mixed space as a training's (x = optimizer index, lr, layers, width, dropout): each optimizer
// has its own best learning rate and floor, learning rate and width interact, dropout is on a
// 0.05 grid. Minimum 0 at adam, lr 1e-3, 3 layers, width 256, dropout 0.15.
double mixed5(const std::vector<double>& x) {
  static const double floor_of[3] = {0.3, 0.0, 0.15}, best_log_lr[3] = {-1.0, -3.0, -2.5};
  const auto c = size_t(x[0]);
  const double a = std::log10(x[1]) - best_log_lr[c], l = x[2] - 3.0, w = std::log2(x[3]) - 8.0,
               d = x[4] - 0.15;
  return floor_of[c] + 0.25 * a * a + 0.05 * a * w + 0.08 * w * w + 0.03 * l * l + 4.0 * d * d;
}

constexpr int kCurveSteps = 27;

double curve_noise(const std::vector<double>& x, int t) {
  double h = 0;
  for (size_t i = 0; i < x.size(); ++i) h += double(i + 1) * x[i];
  return 0.01 * std::sin(1000.0 * h + 7.3 * t);
}

double parallel_curve(const std::vector<double>& x, int t) {
  static const double c[4] = {0.2, 0.7, 0.4, 0.6};
  double final_value = 0.1;
  for (size_t i = 0; i < 4; ++i) final_value += (x[i] - c[i]) * (x[i] - c[i]);
  return final_value + std::exp(-t / 6.0) + curve_noise(x, t);
}

double crossing_curve(const std::vector<double>& x, int t) {
  const double lr = x[0], rate = 10.0 * lr, e = std::log10(lr) + 3.0;
  const double floor_value =
      0.1 + 0.15 * e * e + (x[1] - 0.3) * (x[1] - 0.3) + (x[2] - 0.6) * (x[2] - 0.6);
  return floor_value + (2.5 - floor_value) * std::exp(-rate * t) + curve_noise(x, t);
}

double zdt_g(const std::vector<double>& x) {
  double s = 0;
  for (size_t i = 1; i < x.size(); ++i) s += x[i];
  return 1.0 + 9.0 * s / double(x.size() - 1);
}
std::vector<double> zdt1(const std::vector<double>& x) {
  const double g = zdt_g(x);
  return {x[0], g * (1.0 - std::sqrt(x[0] / g))};
}
std::vector<double> zdt2(const std::vector<double>& x) {
  const double g = zdt_g(x);
  return {x[0], g * (1.0 - (x[0] / g) * (x[0] / g))};
}
double first_of_zdt(const std::vector<double>& x) { return x[0]; }

double parallel_final(const std::vector<double>& x) { return parallel_curve(x, kCurveSteps); }
double crossing_final(const std::vector<double>& x) { return crossing_curve(x, kCurveSteps); }

std::vector<TestFunction> make_all() {
  std::vector<TestFunction> v;
  v.push_back({"branin",
               {Param::floating("x1", -5, 10), Param::floating("x2", 0, 15)},
               0.397887357729739,
               branin});
  Space h;
  for (int i = 1; i <= 6; ++i) h.push_back(Param::floating("x" + std::to_string(i), 0, 1));
  v.push_back({"hartmann6", h, -3.32236801141551, hartmann6});
  Space r;
  for (int i = 1; i <= 4; ++i) r.push_back(Param::floating("x" + std::to_string(i), -5, 10));
  v.push_back({"rosenbrock4", r, 0.0, rosenbrock});
  Space st;
  for (int i = 1; i <= 4; ++i) st.push_back(Param::floating("x" + std::to_string(i), -5, 5));
  v.push_back({"styblinski_tang4", st, -156.66466281508556, styblinski_tang});
  v.push_back({"mixed5",
               {Param::categorical("optimizer", {"sgd", "adam", "rmsprop"}),
                Param::floating("lr", 1e-5, 1, /*log=*/true), Param::integer("layers", 1, 8),
                Param::integer("width", 16, 1024, /*log=*/true),
                Param::floating("dropout", 0, 0.5, /*log=*/false, /*step=*/0.05)},
               0.0,
               mixed5});
  Space z;
  for (int i = 1; i <= 5; ++i) z.push_back(Param::floating("x" + std::to_string(i), 0, 1));
  v.push_back({"zdt1", z, 0.0, first_of_zdt, 0, nullptr, 2, zdt1});
  v.push_back({"zdt2", z, 0.0, first_of_zdt, 0, nullptr, 2, zdt2});
  Space pc;
  for (int i = 1; i <= 4; ++i) pc.push_back(Param::floating("x" + std::to_string(i), 0, 1));
  // Minima: the noise-free optimum less the noise's amplitude (a lower bound for regret).
  v.push_back({"curves_parallel", pc, 0.1 + std::exp(-kCurveSteps / 6.0) - 0.01, parallel_final,
               kCurveSteps, parallel_curve});
  v.push_back({"curves_crossing",
               {Param::floating("lr", 1e-4, 1, /*log=*/true), Param::floating("x1", 0, 1),
                Param::floating("x2", 0, 1)},
               0.0,
               crossing_final,
               kCurveSteps,
               crossing_curve});
  return v;
}

const std::vector<TestFunction>& all() {
  static const auto v = make_all();
  return v;
}

}  // namespace

const TestFunction* find_test_function(const std::string& name) {
  for (const auto& f : all())
    if (f.name == name) return &f;
  return nullptr;
}

std::vector<std::string> test_function_names() {
  std::vector<std::string> n;
  for (const auto& f : all()) n.push_back(f.name);
  return n;
}

}  // namespace mltrain::tune
