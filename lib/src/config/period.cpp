#include "mltrain/config/period.hpp"

#include <cmath>
#include <cstdlib>

#include "mltrain/config/format.hpp"
#include "mltrain/core/error.hpp"

namespace mltrain::config {

std::optional<Period> Period::try_parse(const std::string& raw, std::string* why) {
  std::string text;
  for (char c : raw)
    if (c != ' ') text += c;
  if (text == "never" || text == "off") return Period::never();
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i), unit = text.substr(i);
  if (number.empty()) {
    if (why) *why = "expected a number followed by a unit (e.g. 10ep, 500u), got '" + raw + "'";
    return std::nullopt;
  }
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(v) || v <= 0) {
    if (why) *why = "'" + number + "' is not a positive number";
    return std::nullopt;
  }
  if (unit == "u" || unit == "steps" || unit == "step") {
    if (v != std::floor(v)) {
      if (why) *why = "a step count must be a whole number, got '" + raw + "'";
      return std::nullopt;
    }
    return Period::steps(static_cast<int64_t>(v));
  }
  if (unit == "ep" || unit == "e" || unit == "epochs" || unit == "epoch") return Period::epochs(v);
  if (why)
    *why = unit.empty() ? "'" + raw + "' has no unit: write " + number + "ep (epochs) or " + number +
                              "u (optimizer steps)"
                        : "unknown unit '" + unit + "' in '" + raw + "' (use ep for epochs, u for steps)";
  return std::nullopt;
}

Period Period::parse(const std::string& text) {
  std::string why;
  auto p = try_parse(text, &why);
  if (!p) throw ConfigError("", why);
  return *p;
}

int64_t Period::to_steps(int64_t steps_per_epoch) const {
  if (unit == Unit::kNever) return 0;
  if (unit == Unit::kSteps) return static_cast<int64_t>(value);
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(value * steps_per_epoch)));
}

std::string Period::str() const {
  switch (unit) {
    case Unit::kNever: return "never";
    case Unit::kSteps: return std::to_string(static_cast<int64_t>(value)) + "u";
    case Unit::kEpochs: return format_double(value) + "ep";
  }
  return "never";
}

}  // namespace mltrain::config
