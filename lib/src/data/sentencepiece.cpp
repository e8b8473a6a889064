// `mltrain data tokenize --sentencepiece MODEL | --train-sentencepiece V`: text files to token
// streams through Debian's libsentencepiece (dataset.hpp). Compiled into the helper executable
// mltrain_spm only, never into a process with LibTorch: libsentencepiece.so.0 and libc10.so both
// define the global FLAGS_minloglevel (an absl flag object in one, an int in the other), so in
// one process each writes over the other's and TorchScript calls deadlock in c10's logging
// (measured: cli_quantize, cli_tasks and test_engine hung in c10::GetEventSampledHandler).
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/sha256.hpp"
#include "mltrain/data/dataset.hpp"

namespace fs = std::filesystem;

namespace mltrain::data {

namespace {

// The offset of the first byte that breaks UTF-8 (a bad lead, a missing continuation, an
// overlong form, a surrogate or a code point past U+10FFFF), or npos.
size_t first_invalid_utf8(const std::string& s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = b[i];
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((b[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (b[i + k] & 0x3F);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string::npos;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "cannot open", "check the path");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (const size_t at = first_invalid_utf8(text); at != std::string::npos) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned char>(text[at]));
    throw DataError(path,
                    "is not UTF-8 text: byte " + std::string(hex) + " at offset " +
                        std::to_string(at) + " starts no valid character",
                    "convert it (e.g. iconv -f latin1 -t utf-8), or tokenize its bytes with "
                    "--bytes");
  }
  return text;
}

void write_ids(const fs::path& path, const std::vector<int>& ids, bool wide) {
  std::string bytes;
  bytes.reserve(ids.size() * (wide ? 4 : 2));
  for (int id : ids) {
    if (wide) {
      const uint32_t v = static_cast<uint32_t>(id);
      bytes.append(reinterpret_cast<const char*>(&v), 4);
    } else {
      const uint16_t v = static_cast<uint16_t>(id);
      bytes.append(reinterpret_cast<const char*>(&v), 2);
    }
  }
  write_file_atomic(path.string(), bytes);
}

}  // namespace

TokenizeResult tokenize_sentencepiece_here(const std::vector<std::string>& files,
                                           const std::string& out, double val_fraction,
                                           const SentencePieceOptions& sp) {
  // Every file is read and checked first: nothing is trained or written from bad text.
  std::vector<std::string> lines;
  int64_t total_bytes = 0;
  for (const auto& f : files) {
    const std::string text = read_text(f);
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      total_bytes += static_cast<int64_t>(line.size()) + 1;
      lines.push_back(std::move(line));
    }
  }
  if (lines.empty())
    throw DataError(files.empty() ? out : files.front(), "no text to tokenize",
                    "pass one or more non-empty text files");
  fs::create_directories(out);
  std::string model = sp.model;
  if (sp.train_vocab > 0) {
    model = (fs::path(out) / "tokenizer.model").string();
    std::string inputs;
    for (const auto& f : files) inputs += (inputs.empty() ? "" : ",") + f;
    const std::string args =
        "--input=" + inputs + " --model_prefix=" + (fs::path(out) / "tokenizer").string() +
        " --vocab_size=" + std::to_string(sp.train_vocab) + " --model_type=" + sp.model_type +
        " --character_coverage=1.0 --num_threads=2 --minloglevel=2";
    const auto st = sentencepiece::SentencePieceTrainer::Train(args);
    if (!st.ok())
      throw DataError(files.front(),
                      "SentencePiece could not train a " + sp.model_type + " model of " +
                          std::to_string(sp.train_vocab) + " pieces: " + st.ToString(),
                      "lower --train-sentencepiece, or give more text");
  }
  sentencepiece::SentencePieceProcessor proc;
  if (const auto st = proc.Load(model); !st.ok())
    throw DataError(model, "is not a SentencePiece model: " + st.ToString(),
                    "pass the .model file spm_train (or --train-sentencepiece) wrote");
  const int vocab = proc.GetPieceSize();
  const int eos = proc.eos_id();
  // Lines end in the model's EOS (a newline's stand-in; SentencePiece drops newlines); the last
  // val_fraction of the text's bytes, whole lines, is held out.
  size_t split = lines.size();
  for (int64_t tail = 0; split > 1 && tail < static_cast<int64_t>(val_fraction * total_bytes);)
    tail += static_cast<int64_t>(lines[--split].size()) + 1;
  std::vector<int> train, val;
  int64_t train_bytes = 0, val_bytes = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<int> ids;
    if (const auto st = proc.Encode(lines[i], &ids); !st.ok())
      throw DataError(model,
                      "could not encode line " + std::to_string(i + 1) + ": " + st.ToString(),
                      "check the model file");
    auto& dst = i < split ? train : val;
    dst.insert(dst.end(), ids.begin(), ids.end());
    if (eos >= 0) dst.push_back(eos);
    (i < split ? train_bytes : val_bytes) += static_cast<int64_t>(lines[i].size()) + 1;
  }
  const bool wide = vocab > 65535;  // uint16 holds ids up to 65,535
  write_ids(fs::path(out) / "train.bin", train, wide);
  write_ids(fs::path(out) / "val.bin", val, wide);
  if (sp.train_vocab == 0) {  // the model beside its tokens, so the folder is self-contained
    const fs::path copy = fs::path(out) / "tokenizer.model";
    if (fs::absolute(model) != fs::absolute(copy))
      write_file_atomic(copy.string(), read_file(model));
  }
  nlohmann::json meta = {{"tokenizer", "sentencepiece"},
                         {"tokenizer_file", "tokenizer.model"},
                         {"tokenizer_source", fs::absolute(model).string()},
                         {"tokenizer_sha256", sha256_file(model)},
                         {"vocab_size", vocab},
                         {"bos_id", proc.bos_id()},
                         {"eos_id", eos},
                         {"line_end", "eos"},
                         {"dtype", wide ? "uint32" : "uint16"},
                         {"train_tokens", train.size()},
                         {"val_tokens", val.size()},
                         {"train_bytes", train_bytes},
                         {"val_bytes", val_bytes},
                         {"sources", files}};
  if (sp.train_vocab > 0) meta["model_type"] = sp.model_type;
  write_file_atomic((fs::path(out) / "meta.json").string(), meta.dump(1) + "\n");
  TokenizeResult r{static_cast<int64_t>(train.size()), static_cast<int64_t>(val.size())};
  r.vocab = vocab;
  r.dtype = wide ? "uint32" : "uint16";
  return r;
}

}  // namespace mltrain::data
