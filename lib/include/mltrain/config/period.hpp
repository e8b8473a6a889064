#pragma once
// A duration or period with a unit, parsed in one place (Composer `10ep`, Marian `500u`).
//
//   Period p = Period::parse("2ep");         // 2 epochs
//   int64_t steps = p.to_steps(/*steps_per_epoch=*/468);   // 936
//   Period::parse("500u").to_steps(468);      // 500
//   Period::parse("never").enabled();         // false
//   Duration::parse("30m").seconds();        // 1800: wall-clock time (study.timeout)
#include <cstdint>
#include <optional>
#include <string>

namespace mltrain::config {

struct Period {
  enum class Unit { kNever, kSteps, kEpochs };
  Unit unit = Unit::kNever;
  double value = 0;  // whole number for steps; may be fractional for epochs (0.5ep)

  static Period steps(int64_t n) { return {Unit::kSteps, static_cast<double>(n)}; }
  static Period epochs(double n) { return {Unit::kEpochs, n}; }
  static Period never() { return {}; }

  // Accepts "<n>u", "<n>steps", "<x>ep", "<x>e", "<x>epochs", "never" (0u, 0ep: never). Returns nullopt and sets
  // *why on anything else (a bare number is rejected: its unit would be a guess).
  static std::optional<Period> try_parse(const std::string& text, std::string* why);
  static Period parse(const std::string& text);  // throws ConfigError

  bool enabled() const { return unit != Unit::kNever; }
  int64_t to_steps(int64_t steps_per_epoch) const;  // at least 1 when enabled
  std::string str() const;                          // canonical text; parse(str()) == *this
  bool operator==(const Period& o) const { return unit == o.unit && value == o.value; }
};

// Wall-clock time: "<x>s", "<x>m" / "<x>min", "<x>h" or "never", parsed by the same function as
// Period (one place for units) but kept a separate type, so a training period can never be read
// as minutes nor a study timeout as epochs.
struct Duration {
  double secs = 0;  // 0: never
  static Duration of_seconds(double s) { return {s}; }
  static Duration never() { return {}; }
  static std::optional<Duration> try_parse(const std::string& text, std::string* why);
  bool enabled() const { return secs > 0; }
  double seconds() const { return secs; }
  std::string str() const;  // canonical text; try_parse(str()) == *this
  bool operator==(const Duration& o) const { return secs == o.secs; }
};

}  // namespace mltrain::config
