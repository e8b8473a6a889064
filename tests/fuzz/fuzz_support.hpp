#pragma once
// Shared by the libFuzzer targets (tests/fuzz/fuzz_<name>.cpp, built with MLTRAIN_FUZZ=ON by
// clang; scripts/fuzz.sh runs them). Each target feeds bytes to one parser of users' files.
//
// The contract every target checks: bad input is a mltrain::Error (the typed errors main.cpp maps
// to an exit code and a message naming the file). Anything else (another exception escaping, a
// crash, a sanitizer report, an allocation past the fuzzer's -rss_limit_mb) is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "mltrain/core/error.hpp"

namespace mltrain::fuzz {

// A private scratch folder under /dev/shm (memory, not disk), made once per process.
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    const char* base = std::getenv("MLTRAIN_FUZZ_TMP");
    std::filesystem::path d = std::filesystem::path(base ? base : "/dev/shm") /
                              ("mltrain_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes the input as a file named `name` in the scratch folder and returns its path.
inline std::string put(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = (scratch() / name).string();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}
inline std::string put(const std::string& name, const std::string& s) {
  return put(name, reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// Runs fn; a mltrain::Error is the documented answer to bad input, anything else escapes (and
// libFuzzer reports it as a crash with the input that caused it).
template <class F>
bool accepts(F&& fn) {
  try {
    fn();
    return true;
  } catch (const mltrain::Error&) {
    return false;
  }
}

// A property that must hold for accepted input; its failure is a finding.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "property failed: %s\n", what);
    std::abort();
  }
}

}  // namespace mltrain::fuzz
