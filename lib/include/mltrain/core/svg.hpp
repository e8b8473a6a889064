#pragma once
// Self-contained SVG line charts (no external fonts, scripts or requests), for `mltrain schedule
// --svg`, loss-landscape slices and reports.
//
//   SvgChart c("learning rate", "step", "lr");
//   c.add_series("cosine", xs, ys);
//   write_file_atomic("lr.svg", c.render());
#include <string>
#include <vector>

namespace mltrain {

class SvgChart {
 public:
  SvgChart(std::string title, std::string x_label, std::string y_label)
      : title_(std::move(title)), x_label_(std::move(x_label)), y_label_(std::move(y_label)) {}
  void add_series(std::string name, std::vector<double> x, std::vector<double> y);
  std::string render(int width = 720, int height = 400) const;

 private:
  struct Series {
    std::string name;
    std::vector<double> x, y;
  };
  std::string title_, x_label_, y_label_;
  std::vector<Series> series_;
};

// A heat map of values[row][col] over the axes, colour from low (dark blue) to high (yellow).
std::string svg_heatmap(const std::string& title, const std::vector<double>& x_axis,
                        const std::vector<double>& y_axis, const std::vector<double>& values,
                        const std::string& x_label, const std::string& y_label);

std::string xml_escape(const std::string& s);

}  // namespace mltrain
