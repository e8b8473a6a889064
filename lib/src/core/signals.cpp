#include "mltrain/core/signals.hpp"

#include <csignal>
#include <cstring>

namespace mltrain {
namespace {
volatile std::sig_atomic_t g_signal = 0;
void on_signal(int sig) {
  if (g_signal != 0 && sig == SIGINT) {  // a second Ctrl-C: stop now, without a checkpoint
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
  g_signal = sig;
}
}  // namespace

void install_stop_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGTERM, SIGINT, SIGUSR1}) sigaction(s, &sa, nullptr);
}
int stop_signal() { return g_signal; }
void clear_stop_signal() { g_signal = 0; }
}  // namespace mltrain
