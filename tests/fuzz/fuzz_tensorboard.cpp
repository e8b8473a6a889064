// TensorBoard event files (TFRecord framing, masked CRC32C, Event protos) as the reader the tests
// and `mltrain report` use reads them.
#include "fuzz_support.hpp"
#include "mltrain/formats/tensorboard.hpp"

using namespace mltrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::put("events.out.tfevents.fuzz", data, size);
  std::vector<formats::TbEvent> events;
  if (!fuzz::accepts([&] { events = formats::read_event_file(path); })) return 0;
  fuzz::require(events.size() <= size / 16 + 1, "each event costs at least 16 bytes of framing");
  return 0;
}
