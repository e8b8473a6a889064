#pragma once
// Integers read from JSON that users' files supply (chunk indexes, safetensors headers, manifests,
// journals). nlohmann's get<int64_t>() on a float such as 8e20, or on an unsigned past INT64_MAX,
// is a static_cast: undefined behaviour (found by tests/fuzz). These accept only integer-valued
// numbers in range and otherwise throw nlohmann::json::type_error, which the readers already turn
// into their DataError or CheckpointError.
//
//   const int64_t count = json_int(j.at("count"));
//   const auto shape = json_ints(j.at("sample_shape"));
#include <cstdint>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

namespace mltrain {

inline int64_t json_int(const nlohmann::json& v) {
  if (v.is_number_integer() &&
      (!v.is_number_unsigned() ||
       v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
    return v.get<int64_t>();
  throw nlohmann::json::type_error::create(302, "expected an integer in int64, got " + v.dump(),
                                           &v);
}

inline uint64_t json_uint(const nlohmann::json& v) {
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0))
    return v.get<uint64_t>();
  throw nlohmann::json::type_error::create(302, "expected a non-negative integer, got " + v.dump(),
                                           &v);
}

template <class T = int64_t>
std::vector<T> json_ints(const nlohmann::json& v) {
  if (!v.is_array())
    throw nlohmann::json::type_error::create(302, "expected a list of integers, got " + v.dump(),
                                             &v);
  std::vector<T> out;
  out.reserve(v.size());
  for (const auto& e : v)
    out.push_back(static_cast<T>(std::is_signed_v<T> ? json_int(e) : json_uint(e)));
  return out;
}

// key's integer, or `fallback` when the object lacks it.
inline int64_t json_int_or(const nlohmann::json& obj, const char* key, int64_t fallback) {
  return obj.is_object() && obj.contains(key) ? json_int(obj.at(key)) : fallback;
}

}  // namespace mltrain
