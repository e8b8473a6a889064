// A checkpoint folder's manifest.json beside its real files: verify() must answer "intact" or a
// reason, never throw (resume falls back past damaged checkpoints), and load_dir() must throw only
// CheckpointError.
#include "fuzz_support.hpp"
#include "mltrain/train/checkpoint.hpp"

using namespace mltrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool ready = [] {
    fuzz::put("model.safetensors", std::string(100, 'm'));
    fuzz::put("trainer.json", "{\"step\": 7}\n");
    return true;
  }();
  (void)ready;
  fuzz::put("manifest.json", data, size);
  const auto dir = fuzz::scratch();
  std::string why;
  try {
    why = train::CheckpointStore::verify(dir);
  } catch (...) {
    fuzz::require(false, "verify() never throws");
  }
  train::LoadedCheckpoint ck;
  const bool loaded = fuzz::accepts([&] { ck = train::CheckpointStore::load_dir(dir); });
  fuzz::require(loaded == why.empty(), "load_dir() loads exactly what verify() calls intact");
  if (loaded) fuzz::require(ck.step == 7, "the step comes from trainer.json");
  return 0;
}
