#pragma once
// Hang detection by heartbeat (distributed.hang_timeout). Every rank's Comm publishes, to the
// rendezvous store, how many collectives it has issued and the last one; a watchdog thread on
// each rank reads the others'. A rank behind the rest (the others have issued a collective it has
// not, so they are waiting for it) whose count has not moved for the timeout is hung: alive but
// silent, which the collective timeout alone would only notice after distributed.timeout_s, and
// without naming it. The first rank that sees it names the hung rank and exits, so the launcher
// restarts the group from its latest checkpoint.
//
//   std::vector<Beat> beats = {{/*issued=*/47, /*idle_s=*/0.2}, {45, 31.0}};
//   find_hung(beats, /*timeout_s=*/30);   // 1: behind rank 0 and idle for 31 s
#include <cstdint>
#include <vector>

namespace mltrain::dist {

struct Beat {
  uint64_t issued = 0;  // collectives this rank has issued (Comm's sequence number)
  double idle_s = 0;    // seconds since `issued` last changed, as the watchdog saw it
};

// The hung rank (the furthest behind; ties: the lowest rank), or -1: a rank is hung when another
// rank has issued more collectives and its own count, past its first collective, has not moved
// for timeout_s.
int find_hung(const std::vector<Beat>& beats, double timeout_s);

}  // namespace mltrain::dist
