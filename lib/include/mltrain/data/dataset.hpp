#pragma once
// Arrays and labelled data sets read from IDX (gzipped or not), .npy (v1-v3 headers) and the
// memory-mapped shard format. Every malformed file raises DataError naming the file and reason.
//
//   Array images = read_array("train-images-idx3-ubyte.gz");   // u8 [60000, 28, 28]
//   Dataset train = load_dataset("a.idx.gz", "b.idx.gz", /*num_classes=*/10);
//   write_shard(train, "train.shard");  Dataset again = load_dataset("train.shard", "", 10);
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mltrain::data {

enum class DType { kU8, kI8, kI16, kU16, kI32, kU32, kI64, kF32, kF64 };
const char* dtype_name(DType t);
size_t dtype_size(DType t);

// A dense, C-ordered array whose bytes live in a buffer or a mapping that `storage` keeps alive.
struct Array {
  std::string source;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  std::shared_ptr<const void> storage;
  int64_t numel() const;
  std::string shape_text() const;  // "60000x28x28"
};

Array read_idx(const std::string& path);
Array read_npy(const std::string& path);
Array read_array(const std::string& path);  // by content (gzip / IDX / npy magic)

// Samples made on demand: images decoded from files or from compressed chunk records, raw records
// of a chunk set mapped a window at a time. read() is called from the loader's worker threads.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Writes sample i (u8, the data set's sample_shape) to `dst`; DataError names the file on failure.
  virtual void read(int64_t i, uint8_t* dst) const = 0;
};

// Images (u8 or f32, shape [N, ...]) with int64 labels in [0, num_classes).
struct Dataset {
  std::string source;
  DType dtype = DType::kU8;
  int64_t count = 0;
  std::vector<int64_t> sample_shape;  // e.g. {1, 28, 28}: a channel dimension is added to [N,H,W]
  const uint8_t* data = nullptr;
  std::shared_ptr<const void> storage;
  std::shared_ptr<const std::vector<int64_t>> labels;
  int64_t label_offset = 0;  // first label of this view
  int64_t num_classes = 0;
  // Float targets (regression, multilabel): count x target_elems() values, `target_shape` per
  // sample ({} for one value). Null: the int64 class labels above.
  std::shared_ptr<const std::vector<float>> targets;
  std::vector<int64_t> target_shape;
  bool float_targets() const { return targets != nullptr; }
  int64_t target_elems() const;
  const float* target(int64_t i) const {
    return targets->data() + static_cast<size_t>((label_offset + i) * target_elems());
  }

  // Token windows (language models): `data` is a token stream, sample i is tokens [iT, iT+T) and
  // its targets [iT+1, iT+T], T = sample_shape[0]; `num_classes` is the vocabulary.
  bool token_windows = false;
  int64_t token(int64_t i, int64_t j) const;  // token j of window i (j may be T: the last target)

  // On-demand samples (image folders, chunk sets): `data` is null and `reader` makes sample i as
  // its sample `reader_offset + i`. `chunk_samples` > 0: samples come in chunks of that many, and
  // the loader shuffles a window of chunks at a time (see chunked_order in loader.hpp).
  std::shared_ptr<const SampleSource> reader;
  int64_t reader_offset = 0;
  int64_t chunk_samples = 0;
  int64_t skipped = 0;  // bad samples left out (data.on_bad_sample: skip), for the run summary

  int64_t sample_elems() const;
  size_t sample_bytes() const { return static_cast<size_t>(sample_elems()) * dtype_size(dtype); }
  const uint8_t* sample(int64_t i) const { return data + static_cast<size_t>(i) * sample_bytes(); }
  // Sample i's bytes: a pointer into `data`, or made by `reader` into `buf`.
  const uint8_t* sample_into(int64_t i, std::vector<uint8_t>& buf) const;
  int64_t label(int64_t i) const { return (*labels)[static_cast<size_t>(label_offset + i)]; }
  Dataset slice(int64_t begin, int64_t end) const;  // a view, no copy
  // Samples `idx` (in that order) copied into memory of their own, with their labels or targets
  // (on-demand samples are made once here). Not for token windows, which overlap in the stream.
  Dataset gather(const std::vector<int64_t>& idx) const;
};

// K-fold cross-validation: the fold a sample belongs to is its position in a permutation of
// [0, n) drawn from `seed`, cut into k near-equal parts. Returns (training, validation) indices of
// fold `fold`, each sorted. Pure: the same (n, k, fold, seed) gives the same split anywhere.
std::pair<std::vector<int64_t>, std::vector<int64_t>> kfold_split(int64_t n, int64_t k,
                                                                  int64_t fold, uint64_t seed);

// images: any readable array; labels: IDX/npy file, or "" when images is a shard.
Dataset load_dataset(const std::string& images, const std::string& labels, int64_t num_classes);

// Inputs alone (predict): an IDX/.npy array (labels 0) or a shard (its own labels).
Dataset load_inputs(const std::string& images);

// What the targets file holds: class ids in [0, num_classes) (1-D, integer), float values of any
// per-sample shape (any numeric dtype, converted to float32), or 0/1 labels [N, num_classes];
// kAuto: class ids when the file is a 1-D integer array, else float values.
enum class TargetKind { kClassId, kFloat, kMultiHot, kAuto };
struct TargetSpec {
  TargetKind kind = TargetKind::kClassId;
  int64_t num_classes = 0;
};
Dataset load_dataset(const std::string& images, const std::string& targets, const TargetSpec& spec);

// A token stream (language models): a .npy of u8/u16/u32/i32/i64 tokens, or a raw .bin whose dtype
// is named by meta.json beside it ({"dtype": "uint16"}, the default, or uint32/int32), cut into
// non-overlapping windows of `block` + 1 tokens. vocab_size 0: from meta.json's "vocab_size", else
// the largest token + 1. A token outside [0, vocab) or a stream shorter than one window: DataError
// naming the token's offset.
Dataset load_tokens(const std::string& path, int64_t block, int64_t vocab_size);
// The whole token stream of a .bin (typed by meta.json) or .npy token file, as ids.
std::vector<int64_t> read_token_stream(const std::string& path);
// Whether the token file's meta.json says its tokens are bytes (`mltrain data tokenize --bytes`).
bool byte_tokens(const std::string& token_file);
// Byte-level tokens of UTF-8 text files, split into train/val (the last `val_fraction` of the
// stream): writes <out>/train.bin, <out>/val.bin (uint16) and <out>/meta.json (vocab 256).
struct TokenizeResult {
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t vocab = 256;
  std::string dtype = "uint16";
};
TokenizeResult tokenize_bytes(const std::vector<std::string>& files, const std::string& out,
                              double val_fraction);
// SentencePiece tokens (Debian's libsentencepiece): with `model`, or a unigram/BPE model of
// `train_vocab` pieces trained on the files first (<out>/tokenizer.model). Each line is encoded
// and ends in the model's EOS id; the last val_fraction of the bytes (whole lines) goes to
// val.bin. meta.json records the tokenizer file and its SHA-256, vocabulary, BOS/EOS ids, the
// bytes of each split (for loss per byte) and the dtype: uint16, or uint32 past 65,535 pieces.
// Text that is not UTF-8 or a model file that is not SentencePiece: DataError naming the file.
struct SentencePieceOptions {
  std::string model;        // an existing .model file
  int64_t train_vocab = 0;  // > 0: train one of this many pieces
  std::string model_type = "unigram";
};
// Runs in the helper mltrain_spm beside the mltrain binary (tokenize_spm.cpp), which links
// libsentencepiece without LibTorch: the two clash in one process (sentencepiece.cpp says how).
// The helper's errors come back as the same DataError / ConfigError and exit code.
TokenizeResult tokenize_sentencepiece(const std::vector<std::string>& files, const std::string& out,
                                      double val_fraction, const SentencePieceOptions& sp);
// The work itself, in the helper's process (lib/src/data/sentencepiece.cpp).
TokenizeResult tokenize_sentencepiece_here(const std::vector<std::string>& files,
                                           const std::string& out, double val_fraction,
                                           const SentencePieceOptions& sp);

// Shard v1: a 4 KiB header, then fixed-size sample records, then int64 labels, each region
// 4 KiB-aligned so readers can mmap it and gather samples straight from the page cache.
Dataset read_shard(const std::string& path);
void write_shard(const Dataset& ds, const std::string& path);  // atomic (temp + fsync + rename)
bool is_shard(const std::string& path);

}  // namespace mltrain::data
