#pragma once
// Shortest round-trip text for doubles, shared by the config writer and the metrics writers.
//   format_double(0.1) == "0.1"; format_double(1e-05) == "1e-05"; format_double(3) == "3"
#include <string>

namespace mltrain::config {
std::string format_double(double v);
std::string yaml_quote(const std::string& s);  // always double-quoted, JSON-style escapes
}  // namespace mltrain::config
