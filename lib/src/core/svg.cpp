#include "mltrain/core/svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace mltrain {

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

void SvgChart::add_series(std::string name, std::vector<double> x, std::vector<double> y) {
  series_.push_back({std::move(name), std::move(x), std::move(y)});
}

static std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

std::string SvgChart::render(int width, int height) const {
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& s : series_)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + (y0 == 0 ? 1 : std::abs(y0) * 0.1);
  const double L = 70, R = 20, T = 36, B = 46, pw = width - L - R, ph = height - T - B;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * ph; };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << width / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">" << xml_escape(title_) << "</text>\n";
  for (int k = 0; k <= 4; ++k) {  // grid and tick labels
    const double fy = y0 + (y1 - y0) * k / 4, fx = x0 + (x1 - x0) * k / 4;
    o << "<line x1=\"" << L << "\" x2=\"" << L + pw << "\" y1=\"" << py(fy) << "\" y2=\"" << py(fy)
      << "\" stroke=\"#ddd\"/>\n<text x=\"" << L - 6 << "\" y=\"" << py(fy) + 4 << "\" text-anchor=\"end\">" << num(fy)
      << "</text>\n<text x=\"" << px(fx) << "\" y=\"" << T + ph + 18 << "\" text-anchor=\"middle\">" << num(fx) << "</text>\n";
  }
  o << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph << "\" fill=\"none\" stroke=\"#444\"/>\n";
  o << "<text x=\"" << L + pw / 2 << "\" y=\"" << height - 8 << "\" text-anchor=\"middle\">" << xml_escape(x_label_) << "</text>\n";
  o << "<text transform=\"translate(16," << T + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">" << xml_escape(y_label_)
    << "</text>\n";
  for (size_t k = 0; k < series_.size(); ++k) {
    const auto& s = series_[k];
    const char* color = kColors[k % 6];
    o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
    // At most ~2 points per pixel column: long series stay small.
    const size_t n = std::min(s.x.size(), s.y.size());
    const size_t stride = std::max<size_t>(1, n / static_cast<size_t>(2 * pw));
    for (size_t i = 0; i < n; i += stride)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) o << num(px(s.x[i])) << "," << num(py(s.y[i])) << " ";
    if (n && (n - 1) % stride) o << num(px(s.x[n - 1])) << "," << num(py(s.y[n - 1]));
    o << "\"/>\n<text x=\"" << L + pw - 4 << "\" y=\"" << T + 16 + 14 * k << "\" text-anchor=\"end\" fill=\"" << color
      << "\">" << xml_escape(s.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace mltrain
