#pragma once
// Fault injection for the reliability tests: `MLTRAIN_FAULT=<point>[@<n>]` kills this process with
// SIGKILL the n-th time (default: the first) it reaches <point>, after a line on stderr
// ("[fault] killed at <point>@<n> (pid P)"), so a test can stop a run at an exact step of a
// protocol instead of at a moment picked by a sleep. Unset (always, outside the tests), a point
// costs one call that reads a flag set once.
//
//   fault::at("ckpt.folder_rename");                 // dies here when armed
//   if (fault::armed("write:" + name)) { ... half the bytes ...; fault::die(); }
//
// The points (tests/cli/test_cli_faults.cpp kills at each and resumes):
//   write:<file>    AtomicFile: the file's first write stops half-way (a torn temp file)
//   fsync:<file>    AtomicFile::commit, before fsync(file)
//   rename:<file>   after fsync, before the rename over <file>
//   dirsync:<file>  after the rename, before fsync(folder)
//     <file> is a base name: model.safetensors, state.safetensors, trainer.json, manifest.json,
//     latest (checkpoints); status.json, config.yaml (run folder); and every other atomic file.
//   ckpt.folder_rename   CheckpointStore::save, the complete step_<N>.partial before its rename
//   ckpt.folder_renamed  after the rename to step_<N>, before fsync(checkpoints/) and `latest`
//   ckpt.prune           pruning, after an old checkpoint's manifest is removed, before its files
//   journal.write        tune journal append: half of the records' bytes written
//   journal.fsync        tune journal append: all bytes written, before fdatasync
//   track.pending        MLflow sink: a batch noted as pending in mlflow.json, before its post
//   track.acked          MLflow sink: the server acknowledged a batch, before mlflow.json knows
// For write:<file>, <n> counts files (the n-th time that file is written), not write calls.
//
// `MLTRAIN_PAUSE=<point>[@<n>]:<ms>` instead holds the process at the n-th hit of <point> for <ms>
// milliseconds, after a line on stderr ("[fault] paused at <point>@<n> (pid P) for <ms> ms"), so
// a test can send a signal while a run is at that point (the preemption tests): the line is the
// event it waits on. Its points (fault::pause):
//   ckpt.write      CheckpointStore::save, between the weights and the optimizer state
//   eval            Trainer::evaluate, before the first batch
//   fit.begin       Trainer::fit, before the first step of this process
#include <string_view>

namespace mltrain::fault {

// Whether MLTRAIN_FAULT is set at all: callers that build a point's name check this first.
bool enabled();
// Counts a hit of `point`; true when this hit is the armed one (the caller then fails part-way
// and calls die()).
bool armed(std::string_view point);
[[noreturn]] void die();
inline void at(std::string_view point) {
  if (enabled() && armed(point)) die();
}
// Holds here when MLTRAIN_PAUSE names this point's current hit; otherwise one flag read.
void pause(std::string_view point);

}  // namespace mltrain::fault
