#include "mltrain/dist/nccl_check.hpp"

namespace mltrain::dist {
bool nccl_compiled() { return false; }
NcclResult nccl_allreduce_check(double, int) {
  NcclResult r;
  r.error = "this mltrain was built without NCCL (CPU build, or nccl.h not found)";
  return r;
}
}  // namespace mltrain::dist
