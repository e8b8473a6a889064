#pragma once
// Users' own data: image folders, CSV tables and chunk sets (`mltrain data convert`).
//
//   Dataset train = load_image_folder("pets/train", {.size = 64, .channels = 3}, opts);
//   Dataset table = load_csv("houses.csv", csv_options);            // f32 features + targets
//   ConvertReport r = write_chunks(train, "pets.chunks", {.chunk_bytes = 128 << 20});
//   Dataset again = load_chunks("pets.chunks", {});                 // mapped a window at a time
//
// Every bad input raises DataError naming the file (and row/column, or chunk) with a fix.
#include <cstdint>
#include <string>
#include <vector>

#include "mltrain/data/dataset.hpp"
#include "mltrain/data/image.hpp"

namespace mltrain::data {

// ---- image folders (torchvision ImageFolder's layout) ----
// root/<class>/**/*.{jpg,jpeg,png} (any case); classes are the sub-folder names sorted bytewise,
// ids 0..K-1; files sorted by path within a class. Decoding happens in the loader's workers.
struct FolderOptions {
  ImageSpec image;
  bool skip_bad = false;    // drop unreadable images (each decoded once at load) instead of failing
  bool in_memory = false;   // decode every image once at load and keep the samples (no reader)
  int64_t num_classes = 0;  // 0: any; else the folder count must match
  std::vector<std::string> classes;  // non-empty: these names, in this order (the test split)
};
struct FolderListing {
  std::vector<std::string> classes, files;
  std::vector<int64_t> labels;
  int64_t ignored = 0;  // files without an image extension (ImageFolder ignores them too)
  int64_t broken = 0;   // symbolic links to nothing, skipped (skip_bad; else a DataError)
};
FolderListing list_image_folder(const std::string& root, const FolderOptions& opt);
Dataset load_image_folder(const std::string& root, const FolderOptions& opt,
                          std::vector<std::string>* classes_out = nullptr);
// Named image files with their labels (predict's inputs: labels 0), read as a folder's are.
Dataset load_image_files(const std::string& source, std::vector<std::string> files,
                         std::vector<int64_t> labels, int64_t num_classes,
                         const FolderOptions& opt);
bool is_image_file(const std::string& path);  // by extension: .jpg, .jpeg, .png (any case)

// ---- CSV tables ----
struct CsvOptions {
  bool header = true;
  char delimiter = ',';
  std::vector<std::string> features;     // names (header) or 0-based indices; empty: all but target
  std::vector<std::string> targets;      // names or indices; empty: the last column
  std::vector<std::string> categorical;  // text columns mapped to ids (sorted distinct values)
  std::string fill = "error";            // missing cells: error | mean | zero | a number
  bool standardize = true;               // features to zero mean, unit variance (training stats)
  TargetKind target_kind = TargetKind::kClassId;
  int64_t num_classes = 0;
  // The training table's categories and fill values, so the test table maps the same way.
  struct Learned {
    std::vector<std::vector<std::string>> categories;  // per feature column (empty: numeric)
    std::vector<double> means;                         // of the numeric cells: the fill for `mean`
    std::vector<double> scale_means, stds;             // of the filled columns: for `standardize`
    std::vector<std::string> class_names;  // text class labels (sorted), when the target is text
    std::vector<std::string> feature_columns;  // header names (or 0-based indices) of the features
  };
  const Learned* reuse = nullptr;
  // New inputs for a trained model (predict): target columns are not read (labels 0), and the
  // features are the training table's columns by name (`reuse` required).
  bool inputs_only = false;
};
Dataset load_csv(const std::string& path, const CsvOptions& opt, CsvOptions::Learned* learned);

// ---- chunk sets: DIR/index.json + DIR/chunk-NNNNN.bin + DIR/targets.bin ----
// Fixed-size records (raw pixels) or JPEG records (an offset table, then the bytes); ~chunk_bytes
// per chunk file, each a multiple of 4 KiB. index.json lists every chunk's count, bytes and SHA-256.
struct ChunkWriteOptions {
  int64_t chunk_bytes = int64_t{128} << 20;
  bool jpeg = false;  // store u8 images as JPEG (decoded in the loader), else raw records
  int quality = 95;
};
struct ConvertReport {
  int64_t samples = 0, chunks = 0, bytes = 0;
};
ConvertReport write_chunks(const Dataset& ds, const std::string& dir, const ChunkWriteOptions& opt);
bool is_chunk_set(const std::string& path);
struct ChunkReadOptions {
  int64_t resident_chunks = 0;  // chunks kept mapped at once (0: all); others are unmapped
  bool verify = true;           // SHA-256 of each chunk on its first mapping
};
Dataset load_chunks(const std::string& dir, const ChunkReadOptions& opt);
int64_t chunk_count(const std::string& dir);
int64_t chunk_bytes(const std::string& dir);  // the largest chunk file's size
// Hashes every chunk against index.json; DataError names the first that differs.
void verify_chunks(const std::string& dir);

// `mltrain data inspect`: what an IDX/.npy array, a shard (with `labels`: a pair) or a chunk set
// holds: counts, shapes, dtype, labels or targets, pixel statistics, chunk sizes. As text.
std::string inspect_data(const std::string& path, const std::string& labels);

}  // namespace mltrain::data
