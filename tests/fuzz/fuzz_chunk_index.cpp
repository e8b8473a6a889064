// A chunk set's index.json (`mltrain data convert` output) beside one real 8 KiB chunk file and a
// targets file: load the set as training does and read its first samples through the reader.
#include "fuzz_support.hpp"
#include "mltrain/data/sources.hpp"

#include <vector>

using namespace mltrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool ready = [] {
    std::string chunk(8192, '\0');
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 31 % 251);
    fuzz::put("c0.bin", chunk);
    fuzz::put("targets.bin", std::string(64, '\0'));  // 8 int64 labels 0, or 16 floats 0
    return true;
  }();
  (void)ready;
  fuzz::put("index.json", data, size);
  const std::string dir = fuzz::scratch().string();
  data::Dataset d;
  data::ChunkReadOptions opt;
  opt.verify = false;  // the fuzzer cannot forge SHA-256: reach the reader past it
  opt.resident_chunks = 1;
  if (!fuzz::accepts([&] { d = data::load_chunks(dir, opt); })) return 0;
  fuzz::require(d.count >= 0 && d.reader != nullptr, "a loaded chunk set has a reader");
  const size_t bytes = d.sample_bytes();
  if (bytes > (size_t{1} << 24)) return 0;  // a legal but huge sample: not read here
  std::vector<uint8_t> buf(bytes);
  for (int64_t i = 0; i < std::min<int64_t>(d.count, 4); ++i)
    if (!fuzz::accepts([&] { d.reader->read(i, buf.data()); })) break;
  return 0;
}
