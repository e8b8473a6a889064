// Built without libsentencepiece: `data tokenize --sentencepiece` says how to get it.
#include "mltrain/core/error.hpp"
#include "mltrain/data/dataset.hpp"

namespace mltrain::data {

TokenizeResult tokenize_sentencepiece(const std::vector<std::string>&, const std::string&, double,
                                      const SentencePieceOptions&) {
  throw ConfigError("--sentencepiece", "this mltrain was built without SentencePiece",
                    "install libsentencepiece-dev (scripts/install-deps.sh) and rebuild");
}

}  // namespace mltrain::data
