#include "mltrain/config/period.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "mltrain/config/format.hpp"
#include "mltrain/core/error.hpp"

namespace mltrain::config {

namespace {
// Beyond any training (a million steps a second for 30 years); past it a count is a typo, and a
// double past int64 would not convert.
constexpr double kMaxSteps = 1e15;
constexpr double kMaxEpochs = 1e9;

// "<number><unit>" or never/off, spaces ignored: the one tokenizer behind Period and Duration.
// Returns false (with *why) when there is no number; `never` sets *never; zero (0u, 0ep, 0s) is
// what a user writes to turn something off, so the callers read it as never once the unit is
// checked. *number is the amount as written (for messages).
bool split_amount(const std::string& raw, const char* example, double* v, std::string* number,
                  std::string* unit, bool* never, std::string* why) {
  std::string text;
  for (char c : raw)
    if (c != ' ') text += c;
  *never = text == "never" || text == "off";
  if (*never) return true;
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  *number = text.substr(0, i);
  *unit = text.substr(i);
  if (number->empty()) {
    if (why)
      *why = std::string("expected a number followed by a unit (e.g. ") + example + "), got '" +
             raw + "'";
    return false;
  }
  char* end = nullptr;
  *v = std::strtod(number->c_str(), &end);
  if (end != number->c_str() + number->size() || !std::isfinite(*v) || *v < 0) {
    if (why) *why = "'" + *number + "' is not a number";
    return false;
  }
  return true;
}
}  // namespace

std::optional<Period> Period::try_parse(const std::string& raw, std::string* why) {
  double v = 0;
  std::string number, unit;
  bool never = false;
  if (!split_amount(raw, "10ep, 500u", &v, &number, &unit, &never, why)) return std::nullopt;
  if (never) return Period::never();
  const bool unit_ok = unit == "u" || unit == "steps" || unit == "step" || unit == "ep" ||
                       unit == "e" || unit == "epochs" || unit == "epoch";
  if (unit_ok && v == 0) return Period::never();  // 0u, 0ep: off
  if (unit == "u" || unit == "steps" || unit == "step") {
    if (v != std::floor(v)) {
      if (why) *why = "a step count must be a whole number, got '" + raw + "'";
      return std::nullopt;
    }
    if (v > kMaxSteps) {
      if (why) *why = "'" + raw + "' is more than 10^15 steps";
      return std::nullopt;
    }
    return Period::steps(static_cast<int64_t>(v));
  }
  if (unit == "ep" || unit == "e" || unit == "epochs" || unit == "epoch") {
    if (v > kMaxEpochs) {
      if (why) *why = "'" + raw + "' is more than 10^9 epochs";
      return std::nullopt;
    }
    return Period::epochs(v);
  }
  if (why) {
    if (unit.empty())
      *why = "'" + raw + "' has no unit: write " + number + "ep (epochs) or " + number +
             "u (optimizer steps)";
    else if (unit == "s" || unit == "m" || unit == "min" || unit == "h")
      *why = "unknown unit '" + unit + "' in '" + raw +
             "' for a training period (use ep for epochs, u for steps; wall-clock time is not one)";
    else
      *why = "unknown unit '" + unit + "' in '" + raw + "' (use ep for epochs, u for steps)";
  }
  return std::nullopt;
}

std::optional<Duration> Duration::try_parse(const std::string& raw, std::string* why) {
  double v = 0;
  std::string number, unit;
  bool never = false;
  if (!split_amount(raw, "90s, 30m, 2h", &v, &number, &unit, &never, why)) return std::nullopt;
  if (never) return Duration::never();
  if ((unit == "s" || unit == "m" || unit == "min" || unit == "h") && v == 0)
    return Duration::never();  // 0s: off
  if (unit == "s") return Duration::of_seconds(v);
  if (unit == "m" || unit == "min") return Duration::of_seconds(v * 60);
  if (unit == "h") return Duration::of_seconds(v * 3600);
  if (why)
    *why = unit.empty()
               ? "'" + raw + "' has no unit: write " + raw + "s, or use m (minutes) or h (hours)"
               : "unknown unit '" + unit + "' in '" + raw + "' (a duration takes s, m or h)";
  return std::nullopt;
}

std::string Duration::str() const {
  if (!enabled()) return "never";
  return format_double(secs) + "s";
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
  const double steps = std::min(kMaxSteps, value * static_cast<double>(steps_per_epoch));
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(steps)));
}

std::string Period::str() const {
  switch (unit) {
    case Unit::kNever:
      return "never";
    case Unit::kSteps:
      return std::to_string(static_cast<int64_t>(value)) + "u";
    case Unit::kEpochs: {  // shortest round-trip digits, never an exponent (the reader takes none)
      char buf[400];
      const auto r = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::fixed);
      return std::string(buf, r.ptr) + "ep";
    }
  }
  return "never";
}

}  // namespace mltrain::config
