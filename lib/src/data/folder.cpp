// Image folders in torchvision ImageFolder's layout, decoded on demand in the loader's workers, or
// once at load into memory (data.image.cache: memory).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/runtime/runtime.hpp"
#include "mltrain/data/sources.hpp"

namespace fs = std::filesystem;

namespace mltrain::data {

namespace {

bool image_extension(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  return e == ".jpg" || e == ".jpeg" || e == ".png";
}

std::vector<std::string> class_folders(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw DataError(root, "not a folder",
                    "point data.train_images/test_images at a folder with "
                    "one sub-folder per class (torchvision ImageFolder)");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && e.path().filename().string()[0] != '.')
      names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  if (names.empty())
    throw DataError(root, "no class sub-folders", "put each class's images in root/<class>/");
  return names;
}

class FolderSource : public SampleSource {
 public:
  FolderSource(std::vector<std::string> files, ImageSpec spec)
      : files_(std::move(files)), spec_(spec) {}
  void read(int64_t i, uint8_t* dst) const override {
    const std::string& f = files_[static_cast<size_t>(i)];
    const std::string bytes = read_file(f);
    decode_to_sample(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), f, spec_, dst);
  }

 private:
  std::vector<std::string> files_;
  ImageSpec spec_;
};

// Runs fn(i) for i in [0, n) on every usable core; the first exception is rethrown.
template <class Fn>
void parallel_for(int64_t n, Fn fn) {
  const int64_t t = std::clamp<int64_t>(runtime::usable_cores(), 1, 16);
  std::atomic<int64_t> next{0};
  std::exception_ptr err;
  std::mutex mu;
  std::vector<std::thread> th;
  for (int64_t k = 0; k < t; ++k)
    th.emplace_back([&] {
      for (int64_t i; (i = next++) < n;) try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!err) err = std::current_exception();
          next = n;
        }
    });
  for (auto& x : th) x.join();
  if (err) std::rethrow_exception(err);
}

}  // namespace

FolderListing list_image_folder(const std::string& root, const FolderOptions& opt) {
  FolderListing l;
  l.classes = class_folders(root);
  if (!opt.classes.empty() && l.classes != opt.classes)
    throw DataError(root,
                    "class folders differ from the training split's (" +
                        std::to_string(l.classes.size()) + " here, " +
                        std::to_string(opt.classes.size()) + " there)",
                    "give both splits the same class sub-folder names");
  if (opt.num_classes > 0 && static_cast<int64_t>(l.classes.size()) != opt.num_classes)
    throw DataError(root,
                    std::to_string(l.classes.size()) + " class folders but data.num_classes is " +
                        std::to_string(opt.num_classes),
                    "set data.num_classes=" + std::to_string(l.classes.size()));
  for (size_t c = 0; c < l.classes.size(); ++c) {
    const fs::path dir = fs::path(root) / l.classes[c];
    std::vector<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      std::error_code ec;
      if (e.is_symlink(ec) && !fs::exists(e.path(), ec)) {  // a link to nothing: never silent
        if (!opt.skip_bad)
          throw DataError(e.path().string(),
                          "a symbolic link to " + fs::read_symlink(e.path(), ec).string() +
                              ", which does not exist",
                          "fix or remove the link, or set data.on_bad_sample: skip");
        ++l.broken;
        continue;
      }
      if (!e.is_regular_file()) continue;
      if (image_extension(e.path()))
        files.push_back(e.path().string());
      else
        ++l.ignored;
    }
    std::sort(files.begin(), files.end());
    if (files.empty() && !opt.skip_bad)
      throw DataError(dir.string(), "empty class folder: no .jpg/.jpeg/.png images",
                      "add images, remove the folder, or set data.on_bad_sample: skip");
    for (auto& f : files) {
      l.files.push_back(std::move(f));
      l.labels.push_back(static_cast<int64_t>(c));
    }
  }
  return l;
}

Dataset load_image_folder(const std::string& root, const FolderOptions& opt,
                          std::vector<std::string>* classes_out) {
  if (!images_supported())
    throw DataError(root, "this mltrain was built without JPEG/PNG support",
                    "install libturbojpeg0-dev and libspng-dev, then rebuild");
  FolderListing l = list_image_folder(root, opt);
  Dataset d = load_image_files(root, std::move(l.files), std::move(l.labels),
                               static_cast<int64_t>(l.classes.size()), opt);
  d.skipped += l.broken;
  if (classes_out) *classes_out = l.classes;
  return d;
}

Dataset load_image_files(const std::string& source, std::vector<std::string> all_files,
                         std::vector<int64_t> all_labels, int64_t num_classes,
                         const FolderOptions& opt) {
  if (!images_supported())
    throw DataError(source, "this mltrain was built without JPEG/PNG support",
                    "install libturbojpeg0-dev and libspng-dev, then rebuild");
  // error: each header is checked now (a wrong format fails before training starts), the pixels
  // when the loader decodes them. skip: every image is decoded once here, so the data set is
  // fixed before the first batch and a resumed run sees the same samples.
  // in_memory: every image is decoded now, into its slot of one buffer the data set keeps.
  std::vector<char> bad(all_files.size(), 0);
  const size_t sample_bytes = opt.image.sample_bytes();
  auto pixels = std::make_shared<std::vector<uint8_t>>(
      opt.in_memory ? all_files.size() * sample_bytes : size_t{0});
  parallel_for(static_cast<int64_t>(all_files.size()), [&](int64_t i) {
    const std::string& f = all_files[static_cast<size_t>(i)];
    try {
      const std::string file = read_file(f);
      const auto* bytes = reinterpret_cast<const uint8_t*>(file.data());
      if (opt.in_memory) {
        decode_to_sample(bytes, file.size(), f, opt.image,
                         pixels->data() + static_cast<size_t>(i) * sample_bytes);
      } else if (opt.skip_bad) {
        std::vector<uint8_t> px(sample_bytes);
        decode_to_sample(bytes, file.size(), f, opt.image, px.data());
      } else {
        check_image_header(bytes, file.size(), f);
      }
    } catch (const DataError&) {
      if (!opt.skip_bad) throw;
      bad[static_cast<size_t>(i)] = 1;
    }
  });
  std::vector<std::string> files;
  auto labels = std::make_shared<std::vector<int64_t>>();
  size_t kept = 0;
  for (size_t i = 0; i < all_files.size(); ++i) {
    if (bad[i]) continue;
    files.push_back(all_files[i]), labels->push_back(all_labels[i]);
    if (opt.in_memory && kept != i)  // close the gaps the skipped images left
      std::memmove(pixels->data() + kept * sample_bytes, pixels->data() + i * sample_bytes,
                   sample_bytes);
    ++kept;
  }
  Dataset d;
  d.source = source;
  d.dtype = DType::kU8;
  d.count = static_cast<int64_t>(files.size());
  d.sample_shape = {opt.image.channels, opt.image.size, opt.image.size};
  d.skipped = static_cast<int64_t>(all_files.size() - files.size());
  if (d.count == 0) throw DataError(source, "no readable images", "check the folder's images");
  d.labels = labels;
  d.num_classes = num_classes;
  if (opt.in_memory) {
    pixels->resize(kept * sample_bytes);
    d.data = pixels->data();
    d.storage = pixels;
  } else {
    d.reader = std::make_shared<FolderSource>(std::move(files), opt.image);
  }
  return d;
}

bool is_image_file(const std::string& path) { return image_extension(path); }

}  // namespace mltrain::data
