#include "mltrain/core/signals.hpp"

#include <pthread.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <initializer_list>
#include <thread>

namespace mltrain {
namespace {
volatile std::sig_atomic_t g_signal = 0;
bool g_watching = false;

void on_signal(int sig) {
  if (g_signal != 0 && sig == SIGINT) {  // a second Ctrl-C: stop now, without a checkpoint
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
  g_signal = sig;
}

sigset_t stop_set() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGUSR1);
  return s;
}
}  // namespace

void watch_stop_signals() {
  if (g_watching) return;
  sigset_t s = stop_set();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
  g_watching = true;
  std::thread([s] {
    for (;;) {
      int sig = 0;
      if (sigwait(&s, &sig) != 0) continue;
      if (g_signal != 0 && sig == SIGINT) _exit(128 + SIGINT);
      g_signal = sig;
    }
  }).detach();
}

void install_stop_handlers() {
  if (g_watching) return;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGTERM, SIGINT, SIGUSR1}) sigaction(s, &sa, nullptr);
}
int stop_signal() { return g_signal; }
void clear_stop_signal() { g_signal = 0; }
}  // namespace mltrain
