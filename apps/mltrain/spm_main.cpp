// mltrain_spm: the SentencePiece helper `mltrain data tokenize --sentencepiece` runs as a child,
// in a process without LibTorch (lib/src/data/sentencepiece.cpp says why). Not for people:
//   mltrain_spm OUT VAL_FRACTION MODEL TRAIN_VOCAB MODEL_TYPE FILE...
// prints one JSON line: {"ok": {...}} or {"error": {"kind", "where", "message", "fix"}}.
#include <cstdlib>
#include <iostream>

#include <nlohmann/json.hpp>

#include "mltrain/core/error.hpp"
#include "mltrain/data/dataset.hpp"

int main(int argc, char** argv) {
  using namespace mltrain;
  if (argc < 7) {
    std::cerr << "usage: mltrain_spm OUT VAL_FRACTION MODEL TRAIN_VOCAB MODEL_TYPE FILE...\n";
    return kExitUsage;
  }
  data::SentencePieceOptions sp;
  sp.model = argv[3];
  sp.train_vocab = std::atoll(argv[4]);
  sp.model_type = argv[5];
  const std::vector<std::string> files(argv + 6, argv + argc);
  try {
    const auto r = data::tokenize_sentencepiece_here(files, argv[1], std::atof(argv[2]), sp);
    std::cout << nlohmann::json{{"ok",
                                 {{"train_tokens", r.train_tokens},
                                  {"val_tokens", r.val_tokens},
                                  {"vocab", r.vocab},
                                  {"dtype", r.dtype}}}}
                     .dump()
              << std::endl;
    return 0;
  } catch (const Error& e) {
    const char* kind = dynamic_cast<const DataError*>(&e)     ? "data"
                       : dynamic_cast<const ConfigError*>(&e) ? "config"
                                                              : "runtime";
    std::cout << nlohmann::json{{"error",
                                 {{"kind", kind},
                                  {"where", e.where()},
                                  {"message", e.message()},
                                  {"fix", e.fix()}}}}
                     .dump()
              << std::endl;
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cout << nlohmann::json{{"error", {{"kind", "runtime"}, {"message", e.what()}}}}.dump()
              << std::endl;
    return kExitRuntime;
  }
}
