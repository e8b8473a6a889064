// A tune study's journal.jsonl (shared by drivers, appended by killed ones): replayed into trials
// as `mltrain tune` does when it resumes, over a two-parameter space.
#include "fuzz_support.hpp"
#include "mltrain/tune/study.hpp"

using namespace mltrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tune::Space space = {tune::Param::floating("lr", 1e-4, 1.0, true),
                                    tune::Param::integer("width", 8, 64)};
  fuzz::put("journal.jsonl", data, size);
  std::vector<tune::TrialState> trials;
  if (!fuzz::accepts([&] { trials = tune::read_trials(fuzz::scratch(), space); })) return 0;
  for (size_t i = 0; i < trials.size(); ++i)
    fuzz::require(trials[i].number < 0 || trials[i].number == static_cast<int>(i),
                  "trial i is numbered i");
  return 0;
}
