#include "mltrain/core/fault.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace mltrain::fault {

namespace {
// "<point>[@<n>]": strips a valid "@<n>" (n >= 1) from `v` and returns n, else 1. Shared by
// MLTRAIN_FAULT and MLTRAIN_PAUSE.
long take_nth(std::string& v) {
  const size_t at = v.rfind('@');
  if (at == std::string::npos) return 1;
  char* end = nullptr;
  const long n = std::strtol(v.c_str() + at + 1, &end, 10);
  if (!end || *end != '\0' || n < 1) return 1;
  v.resize(at);
  return n;
}

struct Armed {
  std::string point;  // empty: fault injection off
  long nth = 1;
  std::atomic<long> hits{0};
  std::string hit;  // "<point>@<n>", for the message
};

Armed& state() {
  static Armed* a = [] {
    auto* s = new Armed;  // never destroyed: points may be reached during exit
    const char* env = std::getenv("MLTRAIN_FAULT");
    if (!env || !*env) return s;
    std::string v = env;
    s->nth = take_nth(v);
    s->point = v;
    s->hit = v + "@" + std::to_string(s->nth);
    return s;
  }();
  return *a;
}

// MLTRAIN_PAUSE=<point>[@<n>]:<ms>
struct Pause {
  std::string point;  // empty: off
  long nth = 1, ms = 0;
  std::atomic<long> hits{0};
};

Pause& pause_state() {
  static Pause* p = [] {
    auto* s = new Pause;
    const char* env = std::getenv("MLTRAIN_PAUSE");
    if (!env || !*env) return s;
    std::string v = env;
    const size_t colon = v.rfind(':');
    if (colon == std::string::npos) return s;
    s->ms = std::strtol(v.c_str() + colon + 1, nullptr, 10);
    v.resize(colon);
    s->nth = take_nth(v);
    if (s->ms > 0) s->point = v;
    return s;
  }();
  return *p;
}
}  // namespace

void pause(std::string_view point) {
  Pause& p = pause_state();
  if (p.point.empty() || point != p.point || p.hits.fetch_add(1) + 1 != p.nth) return;
  std::fprintf(stderr, "[fault] paused at %s@%ld (pid %d) for %ld ms\n", p.point.c_str(), p.nth,
               int(::getpid()), p.ms);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(p.ms));
}

bool enabled() { return !state().point.empty(); }

bool armed(std::string_view point) {
  Armed& s = state();
  if (s.point.empty() || point != s.point) return false;
  return s.hits.fetch_add(1) + 1 == s.nth;
}

void die() {
  const Armed& s = state();
  std::fprintf(stderr, "[fault] killed at %s (pid %d)\n", s.hit.c_str(), int(::getpid()));
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
  std::abort();  // not reached
}

}  // namespace mltrain::fault
