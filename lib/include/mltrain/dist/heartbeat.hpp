#pragma once
// The hang and straggler doctor (distributed.hang_timeout). Every rank's Comm watchdog publishes,
// to the rendezvous store, a beat: how many collectives it has issued and its last few (sequence
// number, name, bytes), where it is (data, forward, backward, all-reduce, optimizer, evaluation,
// checkpoint), its step, a progress count (batches, evaluation batches, checkpoint files) and the
// median of its recent step times. Each rank's watchdog reads the others' and looks for
//   - a hung rank: behind the others (they have issued a collective it has not, so they wait for
//     it) and without progress for the timeout; alive but silent, stopped, or stuck in its loader;
//   - a divergent collective: the same sequence number with another name or size on two ranks;
//   - a straggler: a rank whose own compute per step (its step time less its wait in collectives)
//     is well above the others'.
// The first two are named (rank, host, pid, collective, phase, step) and end the process, so the
// launcher restarts the group from its latest checkpoint; a straggler is named in a warning.
//
//   std::vector<Beat> beats = {{/*issued=*/47, /*idle_s=*/0.2}, {45, 31.0}};
//   find_hung(beats, /*timeout_s=*/30);   // 1: behind rank 0 and idle for 31 s
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mltrain/core/phase.hpp"

namespace mltrain::dist {

// A phase (core/phase.hpp, the trainer's one marker) as the doctor writes it: "set-up", "data",
// "h2d copy", "forward", "backward", "all-reduce", "optimizer", "evaluation", "checkpoint", "other".
const char* where_name(Phase w);

// This process's side, written by the trainer and read by the watchdog thread: relaxed atomics,
// one store each, so marking a phase costs nothing measurable.
namespace here {
// Entering kData before this process's first step is done counts as set-up (its first batch may
// take long: workers starting, files opening).
void enter(Phase w);
void tick();  // a unit of progress: a batch read, an evaluation batch, a checkpoint file
// After each optimizer step: its wall time and its busy time (the wall time less this rank's
// wait inside collectives); the medians of the last kWindow steps are published.
void step_done(int64_t step, double step_s, double busy_s);
constexpr int kWindow = 10;
Phase where();
uint64_t progress();
int64_t step();
double step_median_s();
double busy_median_s();
int steps_seen();  // in the window, at most kWindow
void reset();      // tests
void set_rank(int rank);
// Faults for the doctor's tests, `MLTRAIN_FAULT=<kind>:<rank>:<step>` (core/fault.hpp's points
// have no colon), on the first attempt only (TORCHELASTIC_RESTART_COUNT unset or 0):
//   silent.<phase>  on entering <phase> in that step, that rank stops making progress; alive:
//                   its watchdog keeps publishing (silent.data: a loader stall)
//   stop.<phase>    ... is stopped with SIGSTOP (frozen: nothing of it runs)
//   kill.<phase>    ... is SIGKILLed
//   slow            from that step on, about twice as slow: it joins the cgroup
//                   MLTRAIN_FAULT_CGROUP (a CPU quota the test made) when set, else it sleeps its
//                   median busy time in every forward
//   skip_bucket     DataParallel skips its first gradient bucket's all-reduce in that step
//   resize_bucket   ... sends its first bucket one element short
// <phase> is a where_name(). The action starts after 0.6 s in the phase, so the beat the others
// read names it (a real fault strikes a rank that has been somewhere for a while).
bool fault(const char* kind);  // skip_bucket / resize_bucket: armed for this rank and step
}  // namespace here

struct Op {
  uint64_t seq = 0;
  std::string name;
  int64_t bytes = 0;
  bool operator==(const Op& o) const { return seq == o.seq && name == o.name && bytes == o.bytes; }
};

struct Beat {
  uint64_t issued = 0;  // collectives this rank has issued (Comm's sequence number)
  double idle_s = 0;    // seconds since `issued` or `progress` last changed, as the reader saw it
  Phase where = Phase::kOther;
  int64_t step = -1;  // steps done (this process's count starts at the resumed step); 0: none yet
  uint64_t progress = 0;
  double step_s = 0, busy_s = 0;  // medians over the last `steps` steps (0 when none yet)
  int steps = 0;
  std::vector<Op> recent;  // the last few collectives, oldest first
};

// The text a rank publishes (idle_s is the reader's), and back; a malformed text gives a Beat
// with issued 0 (never reported).
std::string encode_beat(const Beat& b);
Beat decode_beat(const std::string& text);

// Phases whose length does not scale with a step (set-up until this process's first step is
// done, rank 0's checkpoint write, which the others wait for) are given at least this long
// before a rank in them is named hung.
constexpr double kSlowPhaseS = 60;

// The hung rank (the furthest behind; ties: the lowest rank), or -1: a rank is hung when another
// rank has issued more collectives and its own count, past its first collective, has not moved
// for timeout_s (kSlowPhaseS in set-up, before its first step, or in a checkpoint).
int find_hung(const std::vector<Beat>& beats, double timeout_s);

// Every rank waiting in the same collective, none behind and none moving for timeout_s (none in
// a slow phase): the transport between them drops packets. The collective's sequence number, or 0.
uint64_t find_stuck(const std::vector<Beat>& beats, double timeout_s);

// distributed.hang_timeout: auto: twice the slowest rank's median step, at least 7 s, so a hang
// is named within max(3 x the median step, 10 s) of its start.
double auto_hang_timeout(const std::vector<Beat>& beats);

// Two ranks whose collective with the same sequence number differs in name or size. `rank` is
// the odd one out: in the minority, or (two groups of equal size) the one without the lowest rank.
struct Mismatch {
  int rank = -1, other = -1;
  Op op, other_op;
  Beat beat;  // the odd rank's
};
std::optional<Mismatch> find_mismatch(const std::vector<Beat>& beats);

// The rank whose median busy time per step is more than `ratio` times the median of the other
// ranks' (and more than `floor_s` above it), each over a full window of steps.
struct Straggler {
  int rank = -1;
  double busy_s = 0, others_s = 0;
};
std::optional<Straggler> find_straggler(const std::vector<Beat>& beats, double ratio = 1.5,
                                        double floor_s = 0.002);

}  // namespace mltrain::dist
