#pragma once
// Shell-style globs over dotted names (parameter groups "*.bias", fp32 islands "h.*.ln_*").
#include <fnmatch.h>

#include <string>

namespace mltrain {

inline bool glob_match(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

}  // namespace mltrain
