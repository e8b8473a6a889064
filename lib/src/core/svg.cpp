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
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

void SvgChart::add_series(std::string name, std::vector<double> x, std::vector<double> y) {
  series_.push_back({std::move(name), std::move(x), std::move(y)});
}

// Axis numbers short enough for the margin: 27600 -> "27.6k", 1.2e6 -> "1.2M", else %.4g.
static std::string num(double v) {
  char b[32];
  const double a = std::fabs(v);
  if (a >= 1e9)
    std::snprintf(b, sizeof b, "%.3gG", v / 1e9);
  else if (a >= 1e6)
    std::snprintf(b, sizeof b, "%.3gM", v / 1e6);
  else if (a >= 1e4)
    std::snprintf(b, sizeof b, "%.3gk", v / 1e3);
  else
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
  const double L = 76, R = 20, T = 36, B = 46, pw = width - L - R, ph = height - T - B;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * ph; };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << width / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">"
    << xml_escape(title_) << "</text>\n";
  for (int k = 0; k <= 4; ++k) {  // grid and tick labels
    const double fy = y0 + (y1 - y0) * k / 4, fx = x0 + (x1 - x0) * k / 4;
    o << "<line x1=\"" << L << "\" x2=\"" << L + pw << "\" y1=\"" << py(fy) << "\" y2=\"" << py(fy)
      << "\" stroke=\"#ddd\"/>\n<text x=\"" << L - 6 << "\" y=\"" << py(fy) + 4
      << "\" text-anchor=\"end\">" << num(fy) << "</text>\n<text x=\"" << px(fx) << "\" y=\""
      << T + ph + 18 << "\" text-anchor=\"middle\">" << num(fx) << "</text>\n";
  }
  o << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"#444\"/>\n";
  o << "<text x=\"" << L + pw / 2 << "\" y=\"" << height - 8 << "\" text-anchor=\"middle\">"
    << xml_escape(x_label_) << "</text>\n";
  o << "<text transform=\"translate(16," << T + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << xml_escape(y_label_) << "</text>\n";
  for (size_t k = 0; k < series_.size(); ++k) {
    const auto& s = series_[k];
    const char* color = kColors[k % 6];
    o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
    // At most ~2 points per pixel column: long series stay small.
    const size_t n = std::min(s.x.size(), s.y.size());
    const size_t stride = std::max<size_t>(1, n / static_cast<size_t>(2 * pw));
    for (size_t i = 0; i < n; i += stride)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i]))
        o << num(px(s.x[i])) << "," << num(py(s.y[i])) << " ";
    if (n && (n - 1) % stride) o << num(px(s.x[n - 1])) << "," << num(py(s.y[n - 1]));
    o << "\"/>\n<text x=\"" << L + pw - 4 << "\" y=\"" << T + 16 + 14 * k
      << "\" text-anchor=\"end\" fill=\"" << color << "\">" << xml_escape(s.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

std::string svg_heatmap(const std::string& title, const std::vector<double>& xs,
                        const std::vector<double>& ys, const std::vector<double>& v,
                        const std::string& x_label, const std::string& y_label) {
  const int cell = 24, L = 70, T = 36;
  const int W = L + cell * static_cast<int>(xs.size()) + 90,
            H = T + cell * static_cast<int>(ys.size()) + 46;
  double lo = INFINITY, hi = -INFINITY;
  for (double x : v)
    if (std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
  if (!(hi > lo)) hi = lo + 1;
  auto color = [&](double x) {
    if (!std::isfinite(x)) return std::string("#888888");
    const double t = std::sqrt((x - lo) / (hi - lo));  // more contrast near the minimum
    const int r = static_cast<int>(40 + 215 * t), g = static_cast<int>(30 + 200 * t),
              b = static_cast<int>(120 - 90 * t);
    char buf[16];
    std::snprintf(buf, sizeof buf, "#%02x%02x%02x", r, g, b);
    return std::string(buf);
  };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" "
       "fill=\"white\"/>\n";
  o << "<text x=\"" << W / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">"
    << xml_escape(title) << "</text>\n";
  for (size_t r = 0; r < ys.size(); ++r)
    for (size_t c = 0; c < xs.size(); ++c) {
      const double val = v[r * xs.size() + c];
      o << "<rect x=\"" << L + cell * c << "\" y=\"" << T + cell * (ys.size() - 1 - r)
        << "\" width=\"" << cell << "\" height=\"" << cell << "\" fill=\"" << color(val)
        << "\"><title>" << num(xs[c]) << ", " << num(ys[r]) << ": " << num(val)
        << "</title></rect>\n";
    }
  const int bottom = T + cell * static_cast<int>(ys.size());
  o << "<text x=\"" << L << "\" y=\"" << bottom + 14 << "\">" << num(xs.front())
    << "</text>\n<text x=\"" << L + cell * xs.size() << "\" y=\"" << bottom + 14
    << "\" text-anchor=\"end\">" << num(xs.back()) << "</text>\n";
  o << "<text x=\"" << L - 4 << "\" y=\"" << bottom << "\" text-anchor=\"end\">" << num(ys.front())
    << "</text>\n<text x=\"" << L - 4 << "\" y=\"" << T + 10 << "\" text-anchor=\"end\">"
    << num(ys.back()) << "</text>\n";
  o << "<text x=\"" << L + cell * xs.size() / 2 << "\" y=\"" << H - 10
    << "\" text-anchor=\"middle\">" << xml_escape(x_label)
    << "</text>\n<text transform=\"translate(16," << T + cell * ys.size() / 2
    << ") rotate(-90)\" text-anchor=\"middle\">" << xml_escape(y_label) << "</text>\n";
  const int lx = L + cell * static_cast<int>(xs.size()) + 20;  // legend
  for (int k = 0; k <= 4; ++k) {
    const double val = lo + (hi - lo) * (1 - k / 4.0) * (1 - k / 4.0);
    o << "<rect x=\"" << lx << "\" y=\"" << T + k * 22 << "\" width=\"14\" height=\"14\" fill=\""
      << color(val) << "\"/><text x=\"" << lx + 18 << "\" y=\"" << T + k * 22 + 11 << "\">"
      << num(val) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace mltrain
