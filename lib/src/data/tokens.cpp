// Token streams for language models: reading (.npy or .bin + meta.json, memory-mapped), checking
// every id against the vocabulary, and byte-level tokenisation of text files.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/data/dataset.hpp"

namespace fs = std::filesystem;

namespace mltrain::data {

namespace {

nlohmann::json read_meta(const fs::path& token_file) {
  const fs::path meta = token_file.parent_path() / "meta.json";
  if (!fs::exists(meta)) return nlohmann::json::object();
  std::ifstream in(meta);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(meta.string(), std::string("not valid JSON: ") + e.what(),
                    "rewrite it with `mltrain data tokenize` or fix the syntax");
  }
}

// A raw .bin token stream: the whole file, typed by meta.json (uint16 when it says nothing).
Array read_bin_tokens(const std::string& path, const nlohmann::json& meta) {
  const std::string dtype = meta.value("dtype", "uint16");
  Array a;
  a.source = path;
  if (dtype == "uint16")
    a.dtype = DType::kU16;
  else if (dtype == "uint32")
    a.dtype = DType::kU32;
  else if (dtype == "int32")
    a.dtype = DType::kI32;
  else
    throw DataError((fs::path(path).parent_path() / "meta.json").string(),
                    "token dtype '" + dtype + "' is not supported",
                    "use uint16, uint32 or int32 (\"dtype\" in meta.json)");
  auto m = std::make_shared<MappedFile>(path);
  if (m->size() % dtype_size(a.dtype) != 0)
    throw DataError(path,
                    "size " + std::to_string(m->size()) + " bytes is not a whole number of " +
                        dtype + " tokens",
                    "the file is truncated, or meta.json names the wrong dtype");
  a.shape = {static_cast<int64_t>(m->size() / dtype_size(a.dtype))};
  a.data = m->data();
  a.storage = m;
  return a;
}

int64_t token_at(const uint8_t* p, DType t) {
  switch (t) {
    case DType::kU8:
      return *p;
    case DType::kU16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case DType::kU32: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    default:
      return -1;
  }
}

}  // namespace

int64_t Dataset::token(int64_t i, int64_t j) const {
  const size_t w = dtype_size(dtype);
  return token_at(data + (static_cast<size_t>(i) * sample_shape[0] + j) * w, dtype);
}

// A meta.json's vocab_size: absent (0) or a positive integer; anything else names the key.
static int64_t meta_vocab(const nlohmann::json& meta, const std::string& token_file) {
  if (!meta.contains("vocab_size")) return 0;
  const auto& v = meta["vocab_size"];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0)
    throw DataError((fs::path(token_file).parent_path() / "meta.json").string(),
                    "\"vocab_size\" is " + v.dump() + ", not a positive integer",
                    "write the tokenizer's vocabulary size, or remove the key (then the largest "
                    "token + 1 is used)");
  return v.get<int64_t>();
}

static Array read_token_array(const std::string& path, const nlohmann::json& meta) {
  Array a = fs::path(path).extension() == ".bin" ? read_bin_tokens(path, meta) : read_array(path);
  if (a.shape.size() != 1)
    throw DataError(path, "a token stream is 1-D, got shape " + a.shape_text(),
                    "flatten it (arr.reshape(-1)) before saving");
  if (a.dtype != DType::kU8 && a.dtype != DType::kU16 && a.dtype != DType::kU32 &&
      a.dtype != DType::kI32 && a.dtype != DType::kI64)
    throw DataError(path, std::string("tokens must be integers, got ") + dtype_name(a.dtype),
                    "save token ids as uint16, uint32, int32 or int64");
  return a;
}

std::vector<int64_t> read_token_stream(const std::string& path) {
  const Array a = read_token_array(path, read_meta(path));
  std::vector<int64_t> ids(static_cast<size_t>(a.shape[0]));
  const size_t w = dtype_size(a.dtype);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = token_at(a.data + i * w, a.dtype);
  return ids;
}

bool byte_tokens(const std::string& token_file) {
  return read_meta(token_file).value("tokenizer", "") == "bytes";
}

Dataset load_tokens(const std::string& path, int64_t block, int64_t vocab_size) {
  const nlohmann::json meta = read_meta(path);
  Array a = read_token_array(path, meta);
  const int64_t n = a.shape[0];
  if (n < block + 1)
    throw DataError(path,
                    "holds " + std::to_string(n) + " tokens, shorter than one window of " +
                        std::to_string(block + 1) + " (model.block_size + 1)",
                    "give more text, or lower model.block_size");
  const int64_t from_meta = meta_vocab(meta, path);
  // A SentencePiece tokenizer's vocabulary is the model's floor (a larger one, padded, is fine);
  // byte streams keep the per-token check below, which names the first offending offset.
  if (vocab_size > 0 && from_meta > vocab_size && meta.value("tokenizer", "") == "sentencepiece")
    throw DataError((fs::path(path).parent_path() / "meta.json").string(),
                    "its SentencePiece tokenizer (" + meta.value("tokenizer_file", "") +
                        ", sha256 " + meta.value("tokenizer_sha256", "").substr(0, 12) + ") has " +
                        std::to_string(from_meta) + " pieces, more than data.vocab_size " +
                        std::to_string(vocab_size),
                    "set data.vocab_size: " + std::to_string(from_meta) +
                        " (or 0: meta.json's), or tokenize again with the tokenizer you meant");
  int64_t vocab = vocab_size > 0 ? vocab_size : from_meta;
  const size_t w = dtype_size(a.dtype);
  int64_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = token_at(a.data + static_cast<size_t>(i) * w, a.dtype);
    if (t < 0 || (vocab > 0 && t >= vocab))
      throw DataError(path,
                      "token " + std::to_string(t) + " at offset " + std::to_string(i) +
                          " (token index) is outside the vocabulary [0, " + std::to_string(vocab) +
                          ")",
                      "set data.vocab_size to the tokenizer's vocabulary, or re-tokenize");
    largest = std::max(largest, t);
  }
  Dataset d;
  d.source = path;
  d.dtype = a.dtype;
  d.data = a.data;
  d.storage = a.storage;
  d.token_windows = true;
  d.sample_shape = {block};
  d.count = (n - 1) / block;
  d.num_classes = vocab > 0 ? vocab : largest + 1;
  d.labels = std::make_shared<std::vector<int64_t>>();
  return d;
}

TokenizeResult tokenize_bytes(const std::vector<std::string>& files, const std::string& out,
                              double val_fraction) {
  std::vector<uint16_t> tokens;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw DataError(f, "cannot open", "check the path");
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (char c : bytes) tokens.push_back(static_cast<uint8_t>(c));
  }
  if (tokens.size() < 2)
    throw DataError(files.empty() ? out : files.front(), "no text to tokenize",
                    "pass one or more non-empty text files");
  const auto n_val = static_cast<size_t>(static_cast<double>(tokens.size()) * val_fraction);
  const size_t n_train = tokens.size() - n_val;
  fs::create_directories(out);
  auto bytes_of = [&](size_t begin, size_t end) {
    return std::string(reinterpret_cast<const char*>(tokens.data() + begin), (end - begin) * 2);
  };
  write_file_atomic((fs::path(out) / "train.bin").string(), bytes_of(0, n_train));
  write_file_atomic((fs::path(out) / "val.bin").string(), bytes_of(n_train, tokens.size()));
  nlohmann::json meta = {{"tokenizer", "bytes"},    {"vocab_size", 256},   {"dtype", "uint16"},
                         {"train_tokens", n_train}, {"val_tokens", n_val}, {"sources", files}};
  write_file_atomic((fs::path(out) / "meta.json").string(), meta.dump(1) + "\n");
  return {static_cast<int64_t>(n_train), static_cast<int64_t>(n_val)};
}

}  // namespace mltrain::data
