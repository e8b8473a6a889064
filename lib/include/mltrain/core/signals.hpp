#pragma once
// Stop requests from SIGTERM/SIGINT (and SIGUSR1, the Slurm pre-emption signal): only recorded;
// the trainer checkpoints at the next step boundary and exits 128+N.
//
// watch_stop_signals() (call it before any thread exists) blocks the three signals in this thread,
// so every thread created later inherits the block, and a watcher thread takes them with sigwait.
// No worker, OpenMP or oneDNN thread is ever interrupted: with plain handlers a USR1 landing
// mid-sgemm aborted about 1 run in 8 with "corrupted size vs. prev_size" inside libdnnl (measured,
// `kill -USR1` at step 100). A second SIGINT more than a second after the first exits at once
// (130), without a checkpoint; one within the second is the same request delivered twice (a
// process-group signal reaching a rank directly and through `mltrain launch`).
//   watch_stop_signals();  ...  if (int sig = stop_signal()) { checkpoint(); throw Interrupted(sig); }
namespace mltrain {
void watch_stop_signals();
void install_stop_handlers();  // handlers instead (when the watcher was not started); a no-op after it
int stop_signal();             // 0 when none has arrived
void clear_stop_signal();

// Fatal signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT): a one-line reason and the crashing
// thread's backtrace on stderr, so a crash in a batch job leaves more in its log than "exit 139";
// then the signal's default action, so the exit status (128+N) and core dumps stay as they were.
// Runs on an alternate stack, so a stack overflow of the main thread reports too. Call once,
// early in main, before other threads exist.
void install_crash_reporter();
}  // namespace mltrain
