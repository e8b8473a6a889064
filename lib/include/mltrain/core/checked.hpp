#pragma once
// Sizes that users' files declare (array headers, shard headers, chunk indexes, safetensors
// headers, targets shapes), multiplied without wrapping, and file names they give checked to
// stay inside their folder. One place for what every reader of those files must check.
//
//   uint64_t bytes = 0;
//   if (!checked_size(4, shape, &bytes)) throw DataError(path, "shape past any file");
//   if (!is_plain_file_name(name)) throw DataError(path, "'" + name + "' is not a file here");
#include <cstdint>
#include <string>
#include <vector>

namespace mltrain {

// *out = elem x every dim. False when a dim is negative or the product passes INT64_MAX (no file
// holds that many bytes, and int64 sizes elsewhere must not wrap). Zero dims are allowed.
inline bool checked_size(uint64_t elem, const std::vector<int64_t>& dims, uint64_t* out) {
  uint64_t n = elem;
  for (const int64_t d : dims)
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) ||
        n > static_cast<uint64_t>(INT64_MAX))
      return false;
  *out = n;
  return true;
}

// A name of a file directly in its folder: not empty, no '/', not hidden or '..'.
inline bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name[0] != '.' && name.find('/') == std::string::npos;
}

}  // namespace mltrain
