// runtime::parallel_for: ATen's OpenMP loop without compiling mltrain with OpenMP. ATen's
// at::parallel_for is inline (ATen/ParallelOpenMP.h) and, in a file compiled without -fopenmp
// (every mltrain file; and clang's -fopenmp targets LLVM's runtime, not the libgomp LibTorch
// loads), runs on the calling thread alone: GPT-2's gradient norm was measured on one core. This
// file makes the call GCC emits for `#pragma omp parallel` itself, GOMP_parallel in LibTorch's
// libgomp, and splits the range as ATen's inline loop does, so the work runs on LibTorch's own
// OpenMP threads at at::get_num_threads().
#include <ATen/Parallel.h>
#include <c10/util/ParallelGuard.h>

#include <algorithm>
#include <atomic>
#include <exception>

#include "mltrain/runtime/runtime.hpp"

extern "C" {
void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
int omp_get_thread_num();
int omp_get_num_threads();
}

namespace mltrain::runtime {
namespace {

struct Loop {
  int64_t begin = 0, end = 0, grain = 0;
  const std::function<void(int64_t, int64_t)>* f = nullptr;
  std::atomic_flag failed = ATOMIC_FLAG_INIT;
  std::exception_ptr error;
};

// One OpenMP thread's share: contiguous chunks, at most one per thread and at least `grain` long.
void run_share(void* p) {
  Loop& loop = *static_cast<Loop*>(p);
  const int64_t n = loop.end - loop.begin;
  int64_t threads = omp_get_num_threads();
  if (loop.grain > 0) threads = std::min(threads, (n + loop.grain - 1) / loop.grain);
  const int64_t tid = omp_get_thread_num();
  const int64_t chunk = (n + threads - 1) / threads;
  const int64_t begin = loop.begin + tid * chunk;
  if (begin >= loop.end) return;
  try {
    at::internal::ThreadIdGuard tid_guard(tid);
    c10::ParallelGuard guard(true);  // ATen ops inside run on this thread, as in ATen's own loop
    (*loop.f)(begin, std::min(loop.end, begin + chunk));
  } catch (...) {
    if (!loop.failed.test_and_set()) loop.error = std::current_exception();
  }
}

}  // namespace

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& f) {
  if (begin >= end) return;
  at::internal::lazy_init_num_threads();
  if (end - begin <= grain || end - begin == 1 || at::in_parallel_region() ||
      at::get_num_threads() <= 1) {
    at::internal::ThreadIdGuard tid_guard(0);
    c10::ParallelGuard guard(true);
    f(begin, end);
    return;
  }
  Loop loop;
  loop.begin = begin, loop.end = end, loop.grain = grain, loop.f = &f;
  // 0 threads: the team size at::set_num_threads set (ATen avoids the num_threads clause too).
  GOMP_parallel(run_share, &loop, 0, 0);
  if (loop.error) std::rethrow_exception(loop.error);
}

}  // namespace mltrain::runtime
