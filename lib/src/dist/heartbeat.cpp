#include "mltrain/dist/heartbeat.hpp"

#include <algorithm>

namespace mltrain::dist {

int find_hung(const std::vector<Beat>& beats, double timeout_s) {
  if (beats.size() < 2 || timeout_s <= 0) return -1;
  uint64_t most = 0;
  for (const auto& b : beats) most = std::max(most, b.issued);
  int hung = -1;
  for (size_t r = 0; r < beats.size(); ++r) {
    const auto& b = beats[r];
    // Level with the front, still moving, or not yet at its first collective (still loading its
    // data or model: the collective timeout covers a rank that never gets there).
    if (b.issued >= most || b.idle_s < timeout_s || b.issued == 0) continue;
    if (hung < 0 || b.issued < beats[size_t(hung)].issued) hung = int(r);
  }
  return hung;
}

}  // namespace mltrain::dist
