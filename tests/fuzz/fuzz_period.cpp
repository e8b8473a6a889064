// Periods (`10ep`, `500u`, `never`) and durations (`30m`): parse, then use the result as the
// trainer does. Accepted text must print and parse back to the same value.
#include "fuzz_support.hpp"
#include "mltrain/config/period.hpp"

#include <cmath>

using namespace mltrain::config;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string why;
  if (auto p = Period::try_parse(text, &why)) {
    for (int64_t steps_per_epoch : {int64_t{1}, int64_t{469}, int64_t{1} << 20}) {
      const int64_t s = p->to_steps(steps_per_epoch);
      mltrain::fuzz::require(!p->enabled() || s >= 0, "an enabled period is a step count >= 0");
    }
    auto back = Period::try_parse(p->str(), &why);
    mltrain::fuzz::require(back.has_value(), "a printed period parses");
    mltrain::fuzz::require(back->str() == p->str(), "a printed period prints the same");
  } else {
    mltrain::fuzz::require(!why.empty(), "a rejected period says why");
  }
  if (auto d = Duration::try_parse(text, &why))
    mltrain::fuzz::require(!d->enabled() || d->seconds() >= 0, "a duration is not negative");
  return 0;
}
