// The one mapping from DataConfig to the readers (data/open.hpp): fashion_mnist's files, token
// streams, image folders, CSV tables, chunk sets and arrays; and predict's new inputs.
#include "mltrain/data/open.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <future>

#include "mltrain/core/error.hpp"

namespace fs = std::filesystem;

namespace mltrain::data {

FolderOptions folder_options(const config::DataConfig& c) {
  FolderOptions fo;
  fo.image = {c.image.size, c.image.mode == "rgb" ? 3 : 1, c.image.resize};
  fo.skip_bad = c.on_bad_sample == "skip";
  fo.in_memory = c.image.cache == "memory";
  fo.num_classes = c.num_classes;
  return fo;
}

CsvOptions csv_options(const config::DataConfig& c, const TargetSpec& targets) {
  CsvOptions co;
  co.header = c.csv.header;
  co.delimiter = c.csv.delimiter == "\\t" ? '\t' : c.csv.delimiter[0];
  co.features = c.csv.features;
  co.targets = c.csv.target;
  co.categorical = c.csv.categorical;
  co.fill = c.csv.fill;
  co.standardize = c.csv.standardize;
  co.target_kind = targets.kind == TargetKind::kAuto ? TargetKind::kFloat : targets.kind;
  co.num_classes = c.num_classes;
  return co;
}

// Token streams: root/{train,val}.{bin,npy} unless train_images/test_images name the files.
static void open_tokens(const config::ExperimentConfig& cfg, OpenedData& s) {
  const config::DataConfig& c = cfg.data;
  auto pick = [&](const std::string& given, const char* stem) {
    if (!given.empty()) return given;
    const fs::path bin = fs::path(c.root) / (std::string(stem) + ".bin");
    const fs::path npy = fs::path(c.root) / (std::string(stem) + ".npy");
    if (fs::exists(bin) || !fs::exists(npy)) return bin.string();
    return npy.string();
  };
  s.train = load_tokens(pick(c.train_images, "train"), cfg.model.block_size, c.vocab_size);
  s.test = load_tokens(pick(c.test_images, "val"), cfg.model.block_size,
                       s.train.num_classes);  // one vocabulary for both
}

// Chunks mapped at once: two shuffle windows (the one being read and the next) plus one per
// worker, unless data.memory_budget_mb caps it.
static ChunkReadOptions chunk_options(const config::ExperimentConfig& cfg, const std::string& dir) {
  ChunkReadOptions o;
  const int64_t workers = cfg.data.workers.is_auto() ? 4 : cfg.data.workers.resolve(0);
  o.resident_chunks = 2 * cfg.data.shuffle_window + std::max<int64_t>(workers, 1);
  if (cfg.data.memory_budget_mb > 0) {
    const int64_t bytes = chunk_bytes(dir);
    const int64_t fit =
        cfg.data.memory_budget_mb * (int64_t{1} << 20) / std::max<int64_t>(bytes, 1);
    if (fit < cfg.data.shuffle_window + 1)
      throw ConfigError("data.memory_budget_mb",
                        std::to_string(cfg.data.memory_budget_mb) + " MiB holds " +
                            std::to_string(fit) + " chunks of " + std::to_string(bytes >> 20) +
                            " MiB; a shuffle window needs " +
                            std::to_string(cfg.data.shuffle_window + 1),
                        "raise the budget, lower data.shuffle_window, or convert with a smaller "
                        "--chunk-mb");
    o.resident_chunks = std::min(o.resident_chunks, fit);
  }
  return o;
}

// data.format image_folder / csv, or a chunk set by its index.json. False: not one of these.
static bool open_users_data(const config::ExperimentConfig& cfg, const TargetSpec& targets,
                            OpenedData& s) {
  const config::DataConfig& c = cfg.data;
  if (c.format == "image_folder") {
    FolderOptions fo = folder_options(c);
    s.train = load_image_folder(c.train_images, fo, &fo.classes);
    s.test = load_image_folder(c.test_images, fo);
    s.class_names = fo.classes;
    return true;
  }
  if (c.format == "csv") {
    CsvOptions co = csv_options(c, targets);
    CsvOptions::Learned& learned = s.csv;
    s.train = load_csv(c.train_images, co, &learned);
    co.reuse = &learned;
    s.test = load_csv(c.test_images, co, nullptr);
    s.class_names = learned.class_names;
    return true;
  }
  if (!is_chunk_set(c.train_images)) {
    for (const std::string& f : {c.train_images, c.test_images})
      if (std::filesystem::is_directory(f))
        throw DataError(f,
                        "a folder, but neither a chunk set (no index.json) nor format image_folder",
                        "set data.format=image_folder for a folder of class sub-folders, or "
                        "point at a chunk set from `mltrain data convert`");
    return false;
  }
  s.train = load_chunks(c.train_images, chunk_options(cfg, c.train_images));
  if (std::filesystem::is_directory(c.test_images) && !is_chunk_set(c.test_images))
    throw DataError(
        c.test_images, "a folder, but not a chunk set (no index.json)",
        "convert the test split too: mltrain data convert " + c.test_images + " -o DIR");
  s.test = is_chunk_set(c.test_images)
               ? load_chunks(c.test_images, chunk_options(cfg, c.test_images))
               : load_dataset(c.test_images, c.test_labels, targets);
  for (const Dataset* d : {&s.train, &s.test}) {
    if (d->float_targets() == (targets.kind == TargetKind::kClassId))
      throw DataError(d->source,
                      d->float_targets()
                          ? "holds float targets; task " + cfg.task.name + " needs class labels"
                          : "holds class labels; task " + cfg.task.name + " needs float targets",
                      "convert the data with targets matching the task");
    if (!d->float_targets() && d->num_classes > c.num_classes)
      throw DataError(d->source,
                      "labels up to " + std::to_string(d->num_classes) +
                          " classes, data.num_classes is " + std::to_string(c.num_classes),
                      "set data.num_classes=" + std::to_string(d->num_classes));
  }
  return true;
}

OpenedData open_data(const config::ExperimentConfig& cfg, const TargetSpec& targets) {
  const config::DataConfig& c = cfg.data;
  std::string tri = c.train_images, trl = c.train_labels, tei = c.test_images, tel = c.test_labels;
  if (c.dataset == "fashion_mnist") {
    const fs::path r = c.root;
    tri = (r / "train-images-idx3-ubyte.gz").string();
    trl = (r / "train-labels-idx1-ubyte.gz").string();
    tei = (r / "t10k-images-idx3-ubyte.gz").string();
    tel = (r / "t10k-labels-idx1-ubyte.gz").string();
    if (!fs::exists(tri))
      throw DataError(tri, "Fashion-MNIST not found",
                      "put its four IDX files (train-images-idx3-ubyte.gz, "
                      "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
                      "t10k-labels-idx1-ubyte.gz) in one folder and set data.root=FOLDER; as root "
                      "on Debian: apt-get install dataset-fashion-mnist (its files land in "
                      "/usr/share/datasets/fashion-mnist, the default root)");
  }
  OpenedData s;
  if (c.dataset == "tokens") {
    open_tokens(cfg, s);
  } else if (!open_users_data(cfg, targets, s)) {
    // The two splits decode side by side (gzip is one core's work per file); a fault in the
    // training files is still the one reported, as when they were read in turn.
    auto test = std::async(std::launch::async, [&] { return load_dataset(tei, tel, targets); });
    s.train = load_dataset(tri, trl, targets);
    s.test = test.get();
  }
  if (s.train.sample_shape != s.test.sample_shape)
    throw DataError(tei, "sample shape differs from the training set's",
                    "pair matching train and test files");
  if (s.train.target_shape != s.test.target_shape ||
      s.train.float_targets() != s.test.float_targets())
    throw DataError(tel, "target shape differs from the training set's",
                    "pair matching train and test target files");
  return s;
}

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string t = "[";
  for (size_t i = 0; i < shape.size(); ++i) t += (i ? "," : "") + std::to_string(shape[i]);
  return t + "]";
}

// Every image under `path` (a folder, recursively, sorted) or `path` itself.
std::vector<std::string> image_files(const std::string& path) {
  std::vector<std::string> files;
  if (!fs::is_directory(path)) return {path};
  for (const auto& e : fs::recursive_directory_iterator(path)) {
    std::error_code ec;
    if (e.is_symlink(ec) && !fs::exists(e.path(), ec))
      throw DataError(e.path().string(), "a symbolic link to nothing", "fix or remove the link");
    if (e.is_regular_file() && is_image_file(e.path().string())) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty())
    throw DataError(path, "holds no .jpg/.jpeg/.png images", "give image files or their folder");
  return files;
}

}  // namespace

Inputs open_inputs(const config::ExperimentConfig& cfg, const OpenedData& trained,
                   const std::string& path) {
  const config::DataConfig& c = cfg.data;
  const Dataset& ref = trained.train;
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw DataError(path, "does not exist",
                    "give image files or folders, a .csv table, an IDX/.npy array or a chunk set");
  Inputs in;
  const bool images = fs::is_directory(path) ? !is_chunk_set(path) : is_image_file(path);
  if (images || c.format == "image_folder") {
    if (c.format != "image_folder")
      throw DataError(
          path, "images, but this model was trained on " + ref.source,
          "give inputs like its training data: samples of shape " + shape_text(ref.sample_shape));
    FolderOptions fo = folder_options(c);
    fo.skip_bad = false, fo.in_memory = false;
    in.ids = image_files(path);
    in.data =
        load_image_files(path, in.ids, std::vector<int64_t>(in.ids.size(), 0), ref.num_classes, fo);
  } else if (c.format == "csv") {
    CsvOptions co = csv_options(c, {});
    co.reuse = &trained.csv;
    co.inputs_only = true;
    in.data = load_csv(path, co, nullptr);
    for (int64_t i = 0; i < in.data.count; ++i)
      in.ids.push_back(path + ":" + std::to_string(i + 1));
  } else {
    in.data = is_chunk_set(path) ? load_chunks(path, {}) : load_inputs(path);
    for (int64_t i = 0; i < in.data.count; ++i) in.ids.push_back(path + ":" + std::to_string(i));
  }
  Dataset& d = in.data;
  if (d.sample_shape != ref.sample_shape || d.dtype != ref.dtype)
    throw DataError(path,
                    "holds samples of shape " + shape_text(d.sample_shape) + " (" +
                        dtype_name(d.dtype) + "); the model was trained on " +
                        shape_text(ref.sample_shape) + " (" + dtype_name(ref.dtype) + ")",
                    "give inputs of the training data's shape and type");
  if (ref.float_targets()) {  // zeros: the task's forward needs targets of the right shape
    d.targets = std::make_shared<std::vector<float>>(
        static_cast<size_t>(d.count * ref.target_elems()), 0.f);
    d.target_shape = ref.target_shape;
    d.labels = std::make_shared<std::vector<int64_t>>();
    d.label_offset = 0;
  } else {  // a shard's or chunk set's own labels may lie outside this model's classes
    d.labels = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(d.count), 0);
    d.label_offset = 0;
  }
  d.num_classes = ref.num_classes;
  return in;
}

static Dataset convert_source(const config::DataConfig& c, const ConvertInput& in) {
  if (!in.images.empty()) return load_dataset(in.images, in.labels, in.targets);
  if (in.input.empty())
    throw ConfigError("data convert", "no input", "give an image folder, a .csv, or --images");
  if (fs::is_directory(in.input)) {
    FolderOptions fo = folder_options(c);
    fo.num_classes = 0;  // as many as the folder has; the chunk set records them
    return load_image_folder(in.input, fo);
  }
  CsvOptions co = csv_options(c, in.targets);
  co.standardize = false;  // training standardises with the training table's statistics
  return load_csv(in.input, co, nullptr);
}

ConvertResult convert_data(const config::DataConfig& c, const ConvertInput& in,
                           const std::string& out, const ChunkWriteOptions& wo) {
  const Dataset ds = convert_source(c, in);
  ConvertResult r;
  r.out = out;
  r.skipped = ds.skipped;
  r.samples = ds.count;
  r.sample_elems = ds.sample_elems();
  r.dtype = ds.dtype;
  r.store = wo.jpeg ? "jpeg" : "raw";
  r.shard = out.size() > 6 && out.compare(out.size() - 6, 6, ".shard") == 0;
  if (r.shard) {
    write_shard(ds, out);
    return r;
  }
  const ConvertReport w = write_chunks(ds, out, wo);
  r.chunks = w.chunks, r.bytes = w.bytes;
  return r;
}

std::string ConvertResult::to_text() const {
  std::string t = skipped > 0 ? "skipped " + std::to_string(skipped) + " unreadable images\n" : "";
  if (shard)
    return t + "wrote " + out + ": " + std::to_string(samples) + " samples of " +
           std::to_string(sample_elems) + " " + dtype_name(dtype) + "\n";
  char mib[32];
  std::snprintf(mib, sizeof mib, "%.1f", static_cast<double>(bytes) / (1 << 20));
  return t + "wrote " + out + ": " + std::to_string(samples) + " samples in " +
         std::to_string(chunks) + " chunks, " + mib + " MiB (" + store + " records)\n";
}

}  // namespace mltrain::data
