// The array readers: `.npy` (FUZZ_FORMAT_NPY), IDX (FUZZ_FORMAT_IDX) and the single-file shard
// (FUZZ_FORMAT_SHARD); one source, three targets. An accepted file's payload must lie inside the
// file: every byte of it is read (so ASan sees any view past the mapping).
#include "fuzz_support.hpp"
#include "mltrain/data/dataset.hpp"

#include <numeric>

using namespace mltrain;

namespace {
volatile uint64_t sink;
void touch(const uint8_t* p, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += p[i];
  sink = sum;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
#if defined(FUZZ_FORMAT_NPY)
  const std::string path = fuzz::put("a.npy", data, size);
  data::Array a;
  if (!fuzz::accepts([&] { a = data::read_npy(path); })) return 0;
#elif defined(FUZZ_FORMAT_IDX)
  const std::string path = fuzz::put("a.idx", data, size);
  data::Array a;
  if (!fuzz::accepts([&] { a = data::read_idx(path); })) return 0;
#else
  const std::string path = fuzz::put("a.shard", data, size);
  data::Dataset d;
  if (!fuzz::accepts([&] { d = data::read_shard(path); })) return 0;
  fuzz::require(d.count >= 0, "a shard's count is not negative");
  if (d.data) touch(d.data, static_cast<size_t>(d.count) * d.sample_bytes());
  for (int64_t i = 0; i < d.count; ++i) (void)d.label(i);
  return 0;
#endif
#if defined(FUZZ_FORMAT_NPY) || defined(FUZZ_FORMAT_IDX)
  int64_t elems = 1;
  for (int64_t dim : a.shape) {
    fuzz::require(dim >= 0, "array dimensions are not negative");
    elems *= dim;
  }
  touch(a.data, static_cast<size_t>(elems) * data::dtype_size(a.dtype));
  return 0;
#endif
}
