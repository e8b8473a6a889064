// runtime::parallel_for: at::parallel_for in the one file compiled with OpenMP (lib/CMakeLists.txt).
// ATen's OpenMP backend is inline (ATen/ParallelOpenMP.h): elsewhere `_OPENMP` is undefined and
// the loop runs on the calling thread alone, which measured GPT-2's gradient norm at one core.
#include <ATen/Parallel.h>

#include "mltrain/runtime/runtime.hpp"

#ifndef _OPENMP
#error "runtime/parallel.cpp must be compiled with -fopenmp (lib/CMakeLists.txt)"
#endif

namespace mltrain::runtime {

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& f) {
  at::parallel_for(begin, end, grain, f);
}

}  // namespace mltrain::runtime
