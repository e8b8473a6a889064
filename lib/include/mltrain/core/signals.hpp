#pragma once
// Stop requests from SIGTERM/SIGINT (and SIGUSR1, the Slurm pre-emption signal): the handler
// only records the signal; the trainer checkpoints at the next step boundary and exits 128+N.
//   install_stop_handlers();  ...  if (int sig = stop_signal()) { checkpoint(); throw Interrupted(sig); }
namespace mltrain {
void install_stop_handlers();
int stop_signal();  // 0 when none has arrived
void clear_stop_signal();
}  // namespace mltrain
