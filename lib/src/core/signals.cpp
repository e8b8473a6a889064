#include "mltrain/core/signals.hpp"

#include <execinfo.h>
#include <pthread.h>
#include <ucontext.h>
#include <unistd.h>

#include <csignal>
#include <ctime>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <thread>
#include <vector>

namespace mltrain {
namespace {
volatile std::sig_atomic_t g_signal = 0;
bool g_watching = false;
// When the first stop signal came (CLOCK_MONOTONIC, seconds). A second SIGINT within a second of it is
// the same request arriving twice: a terminal's Ctrl-C, or a scheduler signalling the whole
// process group (LSF's SIGINT to every process of a job), reaches a rank directly and again through
// `mltrain launch`, which forwards what it receives. Only a later one means "stop now".
volatile std::sig_atomic_t g_first_s = 0;
constexpr long kSameRequestS = 1;

long now_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return static_cast<long>(ts.tv_sec);
}
bool second_interrupt(int sig) {
  return g_signal != 0 && sig == SIGINT && now_s() - g_first_s > kSameRequestS;
}
void record(int sig) {
  if (g_signal == 0) g_first_s = static_cast<std::sig_atomic_t>(now_s());
  g_signal = sig;
}

void on_signal(int sig) {
  if (second_interrupt(sig)) {  // a second Ctrl-C: stop now, without a checkpoint
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
  record(sig);
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
      if (second_interrupt(sig)) _exit(128 + SIGINT);
      record(sig);
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
namespace {
void write_str(const char* s) {
  for (size_t n = std::strlen(s); n > 0;) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

// Async-signal-safe apart from backtrace(), whose first call (the unwinder's loading) is done at
// install time.
void on_fatal(int sig, siginfo_t* info, void* context) {
  write_str("\nmltrain: fatal signal ");
  char num[8];
  int i = sizeof num - 1;
  num[i] = '\0';
  for (int v = sig; v > 0 && i > 0; v /= 10) num[--i] = static_cast<char>('0' + v % 10);
  write_str(num + i);
  write_str(" (");
  write_str(sig == SIGSEGV  ? "SIGSEGV, invalid memory access"
            : sig == SIGBUS ? "SIGBUS, bus error"
            : sig == SIGFPE ? "SIGFPE, arithmetic fault"
            : sig == SIGILL ? "SIGILL, illegal instruction"
                            : "SIGABRT, aborted");
  write_str(
      "). This is a bug in mltrain or a library below it; please report it with this\n"
      "backtrace, the command line and the run folder's config.yaml and env.json:\n");
#if defined(__x86_64__) && defined(REG_RIP)
  // The faulting instruction and the word on top of the stack. After a call through a null or
  // freed function pointer the unwinder stops at address 0, and that word is the return address
  // into the caller: the one frame that names the culprit.
  if (context) {
    const auto& gregs = static_cast<ucontext_t*>(context)->uc_mcontext.gregs;
    const auto sp = static_cast<uintptr_t>(gregs[REG_RSP]);
    const auto fault = reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr);
    // A fault at the stack pointer (an overflow into the guard page): its top is unreadable.
    const bool stack_ok = sig != SIGSEGV || fault + 65536 < sp || fault > sp + 65536;
    void* at[2] = {reinterpret_cast<void*>(gregs[REG_RIP]),
                   stack_ok ? *reinterpret_cast<void**>(sp) : nullptr};
    write_str("faulting instruction, then the return address on top of the stack:\n");
    backtrace_symbols_fd(at, stack_ok ? 2 : 1, STDERR_FILENO);
    write_str("backtrace:\n");
  }
#else
  (void)info;
  (void)context;
#endif
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  // SA_RESETHAND restored the default action: re-raise it, for the usual status and core dump.
  std::raise(sig);
}
}  // namespace

void install_crash_reporter() {
  static std::vector<char> alt_stack(1 << 16);
  stack_t ss{};
  ss.ss_sp = alt_stack.data();
  ss.ss_size = alt_stack.size();
  sigaltstack(&ss, nullptr);
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(s, &sa, nullptr);
}

int stop_signal() { return g_signal; }
void clear_stop_signal() { g_signal = 0; }
}  // namespace mltrain
