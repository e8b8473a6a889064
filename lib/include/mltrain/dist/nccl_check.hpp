#pragma once
// An NCCL process group through c10d (a world of one on this GPU) and an all-reduce timing, for
// `mltrain checklist`. Compiled only when the LibTorch has CUDA and nccl.h is found
// (MLTRAIN_WITH_NCCL); this header has no LibTorch include so it can sit behind that guard.
#include <string>

namespace mltrain::dist {

struct NcclResult {
  bool ok = false;
  std::string error, version;
  int world = 0;
  double bytes = 0, seconds = 0, algbw_gbps = 0, busbw_gbps = 0;
};

bool nccl_compiled();
// All-reduces `bytes` of fp32 on cuda:0 `iters` times after a warm-up, through a ProcessGroupNCCL
// over a FileStore. busbw = algbw * 2(n-1)/n (the nccl-tests convention; 0 for one rank).
NcclResult nccl_allreduce_check(double bytes, int iters);

}  // namespace mltrain::dist
