#pragma once
// An NCCL process group through c10d (a world of one on this GPU) and an all-reduce timing, for
// `mltrain checklist`. The work runs in the helper executable mltrain_nccl_check (built only with
// a CUDA LibTorch and nccl.h: apps/mltrain/nccl_check_main.cpp), as a child with a timeout.
#include <string>

namespace mltrain::dist {

struct NcclResult {
  bool ok = false;
  std::string error, version;
  int world = 0;
  double bytes = 0, seconds = 0, algbw_gbps = 0, busbw_gbps = 0;
};

bool nccl_compiled();  // the helper exists beside this binary
// All-reduces `bytes` of fp32 on cuda:0 `iters` times after a warm-up, through a ProcessGroupNCCL
// over a FileStore. busbw = algbw * 2(n-1)/n (the nccl-tests convention; 0 for one rank).
NcclResult nccl_allreduce_check(double bytes, int iters, double timeout_s = 120);

}  // namespace mltrain::dist
