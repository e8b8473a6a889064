// `mltrain init`: the data's kind from its files, a task and a model that fit, a commented config.
#include "mltrain/init/init.hpp"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mltrain/config/experiment.hpp"
#include "mltrain/config/format.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/formats/pt2.hpp"
#include "mltrain/data/dataset.hpp"
#include "mltrain/data/image.hpp"
#include "mltrain/data/sources.hpp"

namespace fs = std::filesystem;

namespace mltrain::init {

namespace {

// What init found: the `data:` lines, the task, the model's lines and the schedule.
struct Plan {
  InitReport r;
  std::string data, model, task = "classification", duration = "10ep", eval_every = "1ep";
};

std::string q(const std::string& s) { return config::yaml_quote(s); }

bool has(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

// The split folders or files a data set came with: DIR/train + DIR/test (or val), else DIR alone.
std::pair<fs::path, fs::path> splits_of(const fs::path& p) {
  for (const char* test : {"test", "val", "valid", "validation"})
    if (fs::is_directory(p / "train") && has(p / test)) return {p / "train", p / test};
  return {p, fs::path()};
}

std::string test_split_lines(Plan& pl, const fs::path& train, const fs::path& test) {
  pl.r.train = train.string();
  pl.r.test = test.empty() ? train.string() : test.string();
  std::string s = "  train_images: " + q(pl.r.train) + "\n  test_images: " + q(pl.r.test) + "\n";
  if (test.empty()) {
    pl.r.notes.push_back(
        "no separate test split was found (DATA/train + DATA/test): the last 10 % of the training "
        "data is held out for evaluation, and the final test metrics are on the training data");
    s += "  val_fraction: 0.1          # no test split found: evaluate on the last 10 % instead\n";
  }
  return s;
}

// data.mean / data.std of u8 pixels in [0, 1] units (the loader's normalisation).
struct PixelStats {
  double sum = 0, sum2 = 0;
  int64_t n = 0;
  void add(const uint8_t* px, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      const double v = px[i] / 255.0;
      sum += v, sum2 += v * v;
    }
    n += static_cast<int64_t>(count);
  }
  std::string lines(const std::string& over) const {
    const double mean = sum / std::max<int64_t>(n, 1);
    const double sd = std::sqrt(std::max(1e-12, sum2 / std::max<int64_t>(n, 1) - mean * mean));
    char b[160];
    std::snprintf(b, sizeof b,
                  "  mean: %.4f               # pixel mean and std in [0, 1], %s\n  std: %.4f\n",
                  mean, over.c_str(), sd);
    return b;
  }
};

std::string vision_model(Plan& pl, int64_t channels, int64_t size) {
  if (size >= 8) {
    pl.r.model = "cnn";
    return "  name: cnn                  # two 5x5 conv + BatchNorm + pooling blocks, then 2 "
           "linear\n"
           "  channels: [32, 64]\n  fc: 128\n  batchnorm: true\n  dropout: 0.25\n";
  }
  pl.r.model = "mlp";
  (void)channels;
  return "  name: mlp\n  hidden: [256, 128]\n  dropout: 0.1\n";
}

// Image folders: the size and colour of the first image decide data.image.
void image_folder(Plan& pl, const fs::path& train, const fs::path& test) {
  data::FolderOptions fo;
  const data::FolderListing l = data::list_image_folder(train.string(), fo);
  if (l.files.empty())
    throw DataError(train.string(), "class folders without images",
                    "put .jpg/.jpeg/.png images in DATA/<class>/");
  const std::string bytes = read_file(l.files.front());
  const data::Image im = data::decode_image(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            bytes.size(), l.files.front(), 3);
  bool gray = true;
  for (size_t i = 0; i + 2 < im.px.size() && gray; i += 3)
    gray = im.px[i] == im.px[i + 1] && im.px[i] == im.px[i + 2];
  const int64_t side = std::min<int64_t>(std::min(im.h, im.w), 64);
  const data::ImageSpec spec{side, gray ? 1 : 3, 0};
  PixelStats stats;
  const size_t sampled = std::min<size_t>(l.files.size(), 256);
  std::vector<uint8_t> px(spec.sample_bytes());
  for (size_t i = 0; i < sampled; ++i) {  // evenly spaced over the classes
    const std::string& f = l.files[i * l.files.size() / sampled];
    const std::string b = read_file(f);
    data::decode_to_sample(reinterpret_cast<const uint8_t*>(b.data()), b.size(), f, spec,
                           px.data());
    stats.add(px.data(), px.size());
  }
  pl.r.kind = "image folder";
  pl.data =
      "  dataset: files\n  format: image_folder       # DATA/<class>/*.png|jpg, classes sorted "
      "by name\n" +
      test_split_lines(pl, train, test) + "  image: {size: " + std::to_string(side) +
      ", mode: " + (gray ? "gray" : "rgb") + "}   # first image: " + std::to_string(im.w) + "x" +
      std::to_string(im.h) + (gray ? ", gray" : ", colour") +
      "\n  num_classes: " + std::to_string(l.classes.size()) + "\n  batch_size: 64\n" +
      stats.lines("over " + std::to_string(sampled) + " images");
  pl.model = vision_model(pl, gray ? 1 : 3, side);
  if (std::min(im.h, im.w) > 64)
    pl.r.notes.push_back(
        "images are resized to 64x64 (data.image.size): raise it for detail, at a "
        "cost in speed");
}

// CSV: the last column is the target; text or few integer values make it a classification.
void csv_table(Plan& pl, const fs::path& file) {
  std::ifstream in(file);
  std::string header, line;
  if (!std::getline(in, header))
    throw DataError(file.string(), "is empty", "give a CSV with a header row and data rows");
  const int64_t columns = std::count(header.begin(), header.end(), ',') + 1;
  if (columns < 2)
    throw DataError(file.string(), "has one column", "give feature columns and a target column");
  std::set<std::string> values;
  bool numeric = true, integral = true;
  int64_t rows = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++rows;
    const std::string v = line.substr(line.rfind(',') + 1);
    values.insert(v);
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size())
      numeric = false;
    else if (d != std::floor(d) || d < 0)
      integral = false;
  }
  if (rows < 2) throw DataError(file.string(), "has fewer than 2 data rows", "give more rows");
  const std::string target = header.substr(header.rfind(',') + 1);
  const bool classes = !numeric || (integral && values.size() <= 20);
  pl.r.kind = "CSV table";
  pl.data = "  dataset: files\n  format: csv\n" + test_split_lines(pl, file, {}) +
            "  csv:\n    target: [" + q(target) +
            "]   # the last column\n    fill: mean        "
            "         # blank cells: the training column's mean\n    standardize: true\n";
  if (classes) {
    int64_t k = static_cast<int64_t>(values.size());
    if (numeric)
      for (const auto& v : values) k = std::max<int64_t>(k, std::stoll(v) + 1);
    pl.data += "  num_classes: " + std::to_string(k) + "          # " +
               std::to_string(values.size()) + " distinct values in '" + target + "'\n";
  } else {
    pl.task = "regression";
    pl.r.notes.push_back("'" + target + "' holds " + std::to_string(values.size()) +
                         " distinct numbers: trained as regression (MSE)");
  }
  pl.data +=
      "  batch_size: 32\n  workers: 0\n  mean: 0.0\n  std: 1.0                   # the "
      "features are standardised already (csv.standardize)\n";
  pl.r.model = "mlp";
  pl.model = "  name: mlp\n  hidden: [64, 32]\n  batchnorm: false\n  dropout: 0.1\n";
  pl.duration = "40ep", pl.eval_every = "10ep";
}

void token_stream(Plan& pl, const fs::path& train, const fs::path& test) {
  pl.r.kind = "token stream";
  pl.task = "language_model";
  pl.r.train = train.string();
  pl.r.test = test.empty() ? train.string() : test.string();
  const int64_t vocab = data::load_tokens(train.string(), 1, 0).num_classes;
  pl.data = "  dataset: tokens\n  train_images: " + q(pl.r.train) +
            "\n  test_images: " + q(pl.r.test) + "\n  batch_size: 32\n  workers: 1\n";
  if (test.empty()) {
    pl.data +=
        "  val_fraction: 0.1          # no val.bin found: the stream's last 10 % is held out\n";
    pl.r.notes.push_back("no val.bin beside train.bin: the last 10 % of the stream is held out");
  }
  pl.r.model = "gpt";
  pl.model = "  name: gpt                  # vocabulary " + std::to_string(vocab) +
             " from the tokens\n  n_layer: 4\n  n_head: 4\n  n_embd: 128\n  block_size: 128\n"
             "  dropout: 0.0\n";
  pl.duration = "1000u", pl.eval_every = "250u";
}

// IDX/.npy files named *images* and *labels*, train and test (Fashion-MNIST's own layout).
bool array_files(Plan& pl, const fs::path& dir) {
  std::map<std::string, std::string> f;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    const bool test = n.find("t10k") != std::string::npos || n.find("test") != std::string::npos;
    const bool images = n.find("images") != std::string::npos;
    const bool labels = n.find("labels") != std::string::npos;
    if (images || labels)
      f[std::string(test ? "test_" : "train_") + (images ? "images" : "labels")] =
          e.path().string();
  }
  if (f.size() != 4) return false;
  const data::Dataset d =
      data::load_dataset(f["train_images"], f["train_labels"], int64_t{1} << 30);
  int64_t k = 0;
  for (int64_t i = 0; i < d.count; ++i) k = std::max(k, d.label(i) + 1);
  pl.r.kind = "IDX/.npy arrays";
  pl.r.train = f["train_images"], pl.r.test = f["test_images"];
  pl.data = "  dataset: files\n";
  for (const char* key : {"train_images", "train_labels", "test_images", "test_labels"})
    pl.data += std::string("  ") + key + ": " + q(f[key]) + "\n";
  pl.data += "  num_classes: " + std::to_string(k) + "\n  batch_size: 128\n";
  if (d.dtype == data::DType::kU8 && d.data) {
    PixelStats stats;
    const int64_t n = std::min<int64_t>(d.count, 10000);
    stats.add(d.data, static_cast<size_t>(n * d.sample_elems()));
    pl.data += stats.lines("over " + std::to_string(n) + " training images");
  }
  const auto& s = d.sample_shape;
  pl.model = s.size() == 3 ? vision_model(pl, s[0], std::min(s[1], s[2]))
                           : (pl.r.model = "mlp", "  name: mlp\n  hidden: [256, 128]\n");
  return true;
}

void chunk_set(Plan& pl, const fs::path& train, const fs::path& test) {
  std::ifstream in(train / "index.json");
  const auto index = nlohmann::json::parse(in, nullptr, false);
  if (!index.is_object())
    throw DataError((train / "index.json").string(), "not valid JSON",
                    "convert the data again with mltrain data convert");
  pl.r.kind = "chunk set";
  pl.data = "  dataset: files\n" + test_split_lines(pl, train, test) + "  batch_size: 128\n";
  const bool floats =
      index.value("targets", nlohmann::json::object()).value("kind", "class") == "float";
  if (floats)
    pl.task = "regression";
  else
    pl.data += "  num_classes: " + std::to_string(index.value("num_classes", 10)) + "\n";
  const auto s = index.value("sample_shape", std::vector<int64_t>{});
  pl.model = s.size() == 3 ? vision_model(pl, s[0], std::min(s[1], s[2]))
                           : (pl.r.model = "mlp", "  name: mlp\n  hidden: [256, 128]\n");
}

Plan look(const fs::path& p) {
  Plan pl;
  if (!has(p))
    throw DataError(p.string(), "does not exist",
                    "give an image folder, a .csv, a token folder, IDX/.npy files or a chunk set");
  if (!fs::is_directory(p)) {
    const std::string ext = p.extension().string();
    if (ext == ".csv")
      csv_table(pl, p);
    else if (ext == ".bin")
      token_stream(pl, p, {});
    else
      throw ConfigError("init", p.string() + ": not a kind of data init knows from one file",
                        "give a .csv table or a .bin token file; for IDX/.npy arrays the folder "
                        "holding the images and labels files; for images their folder");
    return pl;
  }
  if (has(p / "train.bin") || has(p / "train.npy")) {
    const fs::path t = has(p / "train.bin") ? p / "train.bin" : p / "train.npy";
    const fs::path v = has(p / "val.bin") ? p / "val.bin" : has(p / "val.npy") ? p / "val.npy" : "";
    token_stream(pl, t, v);
    return pl;
  }
  const auto [train, test] = splits_of(p);
  if (data::is_chunk_set(train.string()))
    chunk_set(pl, train, test);
  else if (!array_files(pl, p))
    image_folder(pl, train, test);
  return pl;
}

// --model FILE.pt2: the user's exported program replaces the proposed model; its input and
// outputs are read from the archive (training checks the data's shape against them).
void use_exported(Plan& pl, const std::string& path) {
  const formats::Pt2Program p = formats::read_pt2(path);
  std::string input;
  for (const auto& in : p.inputs)
    if (in.kind == formats::InputSpec::kUserInput && p.graph.tensor_values.count(in.arg)) {
      const auto& m = p.graph.tensor_values.at(in.arg);
      input = in.arg + " [";
      for (size_t d = 0; d < m.sizes.size(); ++d)
        input += (d ? ", " : "") +
                 (m.sizes[d].is_symbol ? std::string("B") : std::to_string(m.sizes[d].value));
      input += "] " + std::string(formats::pt2_dtype_name(m.dtype));
    }
  std::string outputs;
  for (const auto& leaf : p.output_leaves)
    outputs += (outputs.empty() ? "" : ", ") + (leaf.empty() ? "output" : leaf);
  pl.r.model = "exported";
  pl.model =
      "  name: exported             # your torch.export program (docs/guide/models.md)\n  path: " +
      q(fs::absolute(path).string()) + "\n  channels_last: true        # input " + input +
      "; outputs: " + outputs + "\n";
  pl.r.notes.push_back("the model is " + path + " (input " + input +
                       "): the data's samples must fit it");
}

}  // namespace

InitReport init_config(const InitOptions& o) {
  if (has(o.out) && !o.force)
    throw ConfigError("-o", o.out + " exists", "choose another name or pass --force");
  Plan pl = look(fs::path(o.data));
  if (!o.model.empty()) use_exported(pl, o.model);
  const std::string name = fs::path(o.out).stem().string();
  std::string y = "# Written by `mltrain init " + o.data + "`: " + pl.r.kind + ", task " + pl.task +
                  ", model " + pl.r.model + ".\n# Train it: mltrain train " + o.out +
                  "\n# Every key, its default and check: mltrain config schema\n";
  for (const auto& n : pl.r.notes) y += "# note: " + n + "\n";
  y += "run:\n  name: " + q(name) + "\n  seed: 0\n";
  if (pl.task != "classification") y += "task:\n  name: " + pl.task + "\n";
  y += "data:\n" + pl.data + "model:\n" + pl.model +
       "optim:\n  name: adamw\n  lr: 0.001\n  weight_decay: 0.01\nschedule:\n  name: cosine\n"
       "train:\n  duration: " +
       pl.duration +
       "               # 10ep: epochs, 500u: optimizer steps\n"
       "  eval_every: " +
       pl.eval_every + "\ncheckpoint:\n  every: " + pl.eval_every + "\n";
  // What init writes must load: a config it cannot read back is a bug here, not the user's.
  const fs::path tmp = fs::path(o.out).string() + ".init.tmp";
  write_file_atomic(tmp.string(), y);
  try {
    config::load_experiment(tmp.string(), {});
  } catch (...) {
    fs::remove(tmp);
    throw;
  }
  fs::rename(tmp, o.out);
  pl.r.task = pl.task;
  pl.r.out = o.out;
  pl.r.yaml = y;
  return pl.r;
}

std::string InitReport::to_text() const {
  std::string t = "found " + kind + " (" + train + (test != train ? ", test " + test : "") +
                  "): task " + task + ", model " + model + "\n";
  for (const auto& n : notes) t += "note: " + n + "\n";
  return t + "wrote " + out + "; train it with:\n  mltrain train " + out + "\n";
}

}  // namespace mltrain::init
