#pragma once
// Pareto fronts of several objectives, all minimised (the study negates maximised ones).
//
//   auto ranks = nondominated_ranks(points);        // 0: the front, 1: the front once 0 is gone...
//   double hv = hypervolume(front, reference);      // dominated volume below the reference point
//   auto pick = select_best(points, 10);            // fronts in order, the last by hypervolume
#include <cstddef>
#include <vector>

namespace mltrain::tune {

using Point = std::vector<double>;

// a is no worse than b everywhere and better somewhere.
bool dominates(const Point& a, const Point& b);

// Non-dominated sorting (Deb et al. 2002): rank 0 is the Pareto front.
std::vector<int> nondominated_ranks(const std::vector<Point>& pts);

// The volume dominated by `pts` and bounded by `ref` (points not below ref in every coordinate
// add nothing). Exact: a sweep for two objectives, slicing (HSO) for more (fine for fronts of a
// few dozen points).
double hypervolume(std::vector<Point> pts, const Point& ref);

// The n best points: whole fronts in rank order, the front that does not fit chosen greedily by
// hypervolume contribution (reference: the worst value per objective + 1 % of its range), as
// MOTPE splits its good group (Ozaki et al. 2020). Indices into pts.
std::vector<size_t> select_best(const std::vector<Point>& pts, size_t n);

}  // namespace mltrain::tune
