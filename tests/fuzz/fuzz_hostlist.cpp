// Slurm node lists (SLURM_JOB_NODELIST: "node[01-04,07],gpu-[1-2]"): expanded as the world is
// read under srun. Accepted lists give non-empty host names, at most the documented cap.
#include "fuzz_support.hpp"
#include "mltrain/dist/world.hpp"

using namespace mltrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string list(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> hosts;
  if (!fuzz::accepts([&] { hosts = dist::expand_nodelist(list); })) return 0;
  fuzz::require(hosts.size() <= 65536, "at most 65,536 hosts");
  return 0;
}
