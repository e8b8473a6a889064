#include "mltrain/tune/pareto.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace mltrain::tune {

bool dominates(const Point& a, const Point& b) {
  bool better = false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] > b[i]) return false;
    better = better || a[i] < b[i];
  }
  return better;
}

std::vector<int> nondominated_ranks(const std::vector<Point>& pts) {
  const size_t n = pts.size();
  std::vector<int> rank(n, -1), dominated_by(n, 0);
  std::vector<std::vector<size_t>> dominates_list(n);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      if (i != j && dominates(pts[i], pts[j])) dominates_list[i].push_back(j), ++dominated_by[j];
  std::vector<size_t> front;
  for (size_t i = 0; i < n; ++i)
    if (dominated_by[i] == 0) front.push_back(i);
  for (int r = 0; !front.empty(); ++r) {
    std::vector<size_t> next;
    for (size_t i : front) {
      rank[i] = r;
      for (size_t j : dominates_list[i])
        if (--dominated_by[j] == 0) next.push_back(j);
    }
    front = std::move(next);
  }
  return rank;
}

static double hv_rec(std::vector<Point> pts, const Point& ref, size_t d) {
  if (pts.empty()) return 0;
  if (d == 1) {
    double lo = ref[0];
    for (const auto& p : pts) lo = std::min(lo, p[0]);
    return ref[0] - lo;
  }
  if (d == 2) {  // sweep: sort by the first coordinate, keep the running minimum of the second
    std::sort(pts.begin(), pts.end(), [](const Point& a, const Point& b) {
      return a[0] < b[0] || (a[0] == b[0] && a[1] < b[1]);
    });
    double v = 0, best2 = ref[1];
    for (const auto& p : pts) {
      if (p[1] >= best2) continue;
      v += (ref[0] - p[0]) * (best2 - p[1]);
      best2 = p[1];
    }
    return v;
  }
  // Slices along the last coordinate: between consecutive values, the points below the slice
  // dominate a (d-1)-dimensional volume.
  std::sort(pts.begin(), pts.end(),
            [d](const Point& a, const Point& b) { return a[d - 1] < b[d - 1]; });
  double v = 0;
  std::vector<Point> below;
  for (size_t i = 0; i < pts.size(); ++i) {
    below.push_back(Point(pts[i].begin(), pts[i].begin() + long(d - 1)));
    const double top = i + 1 < pts.size() ? pts[i + 1][d - 1] : ref[d - 1];
    if (top > pts[i][d - 1]) v += hv_rec(below, ref, d - 1) * (top - pts[i][d - 1]);
  }
  return v;
}

double hypervolume(std::vector<Point> pts, const Point& ref) {
  std::vector<Point> inside;
  for (auto& p : pts) {
    bool in = true;
    for (size_t i = 0; i < ref.size(); ++i) in = in && p[i] < ref[i];
    if (in) inside.push_back(std::move(p));
  }
  return hv_rec(std::move(inside), ref, ref.size());
}

std::vector<size_t> select_best(const std::vector<Point>& pts, size_t n) {
  std::vector<size_t> out;
  if (pts.empty() || n == 0) return out;
  const auto rank = nondominated_ranks(pts);
  const int max_rank = *std::max_element(rank.begin(), rank.end());
  const size_t M = pts[0].size();
  Point ref(M, -std::numeric_limits<double>::infinity()),
      lo(M, std::numeric_limits<double>::infinity());
  for (const auto& p : pts)
    for (size_t i = 0; i < M; ++i) ref[i] = std::max(ref[i], p[i]), lo[i] = std::min(lo[i], p[i]);
  for (size_t i = 0; i < M; ++i) ref[i] += 0.01 * std::max(ref[i] - lo[i], 1e-12);
  for (int r = 0; r <= max_rank && out.size() < n; ++r) {
    std::vector<size_t> front;
    for (size_t i = 0; i < pts.size(); ++i)
      if (rank[i] == r) front.push_back(i);
    if (out.size() + front.size() <= n) {
      out.insert(out.end(), front.begin(), front.end());
      continue;
    }
    // Greedy: add the point whose hypervolume contribution to the chosen ones is largest.
    std::vector<Point> chosen;
    std::vector<bool> used(front.size(), false);
    while (out.size() < n) {
      double best = -1;
      size_t bi = 0;
      const double base = hypervolume(chosen, ref);
      for (size_t k = 0; k < front.size(); ++k) {
        if (used[k]) continue;
        auto with = chosen;
        with.push_back(pts[front[k]]);
        const double gain = hypervolume(with, ref) - base;
        if (gain > best) best = gain, bi = k;
      }
      used[bi] = true;
      chosen.push_back(pts[front[bi]]);
      out.push_back(front[bi]);
    }
  }
  return out;
}

}  // namespace mltrain::tune
