#pragma once
// Shortest round-trip text for doubles, shared by the config writer and the metrics writers.
//   format_double(0.1) == "0.1"; format_double(1e-05) == "1e-05"; format_double(3) == "3"
#include <string>

namespace mltrain::config {
std::string format_double(double v);
std::string yaml_quote(const std::string& s);
std::string format_fixed(
    double v,
    int decimals =
        1);  // "%.<decimals>f", for reports: format_fixed(2.345, 2) == "2.35"  // always double-quoted, JSON-style escapes
}  // namespace mltrain::config
