// Users' own data: JPEG/PNG decoding against PIL/torchvision goldens (tests/golden/images.json,
// tests/golden/make_image_golden.py), image folders, CSV tables and chunk sets, each with the bad
// inputs that must fail naming the file.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "mltrain/core/error.hpp"
#include "mltrain/data/loader.hpp"
#include "mltrain/data/sources.hpp"

using namespace mltrain;
using namespace mltrain::data;
namespace fs = std::filesystem;

namespace {

nlohmann::json golden() {
  std::ifstream in(std::string(MLTRAIN_SOURCE_DIR) + "/tests/golden/images.json");
  return nlohmann::json::parse(in);
}

std::vector<uint8_t> unhex(const std::string& h) {
  std::vector<uint8_t> b;
  for (size_t i = 0; i + 1 < h.size(); i += 2) b.push_back(std::stoi(h.substr(i, 2), nullptr, 16));
  return b;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("mltrain_sources_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

// A gray 6x6 image whose pixels encode (seed, position).
std::vector<uint8_t> pattern(int seed, int64_t c = 1, int64_t s = 6) {
  std::vector<uint8_t> px(static_cast<size_t>(c * s * s));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((seed * 37 + i * 11) % 256);
  return px;
}

std::string slurp_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

std::vector<float> all_batches(Loader& l, int64_t epoch, int64_t first = 0) {
  std::vector<float> v;
  l.start_epoch(epoch, first);
  Batch b;
  while (l.next(b)) {
    const float* p = b.x.data_ptr<float>();
    v.insert(v.end(), p, p + b.x.numel());
  }
  return v;
}

int64_t rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return 0;
}

}  // namespace

TEST_CASE("JPEG and PNG decode exactly as PIL does", "[images]") {
  if (!images_supported()) FAIL("built without TurboJPEG/libspng: install them (install-deps.sh)");
  const auto g = golden();  // found by ASan: `: golden()["decode"]` iterated a freed temporary
  for (const auto& c : g["decode"]) {
    INFO(c["name"].get<std::string>());
    const auto bytes = unhex(c["bytes"]);
    const Image im = decode_image(bytes.data(), bytes.size(), "golden", c["channels"]);
    REQUIRE(im.h == c["h"]);
    REQUIRE(im.w == c["w"]);
    CHECK(im.px == c["pixels"].get<std::vector<uint8_t>>());
  }
}

TEST_CASE("resize and centre crop match torchvision's Resize + CenterCrop within 1 level",
          "[images]") {
  const auto g = golden();
  Image src{g["source_h"], g["source_w"], 3, g["source_rgb_hwc"].get<std::vector<uint8_t>>()};
  for (const auto& r : g["resize"]) {
    const ImageSpec spec{r["size"], 3, r["resize"]};
    std::vector<uint8_t> out(spec.sample_bytes());
    fit_image(src, spec, out.data());
    const auto want = r["chw"].get<std::vector<int>>();
    int worst = 0;
    for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::abs(out[i] - want[i]));
    INFO("resize " << r["resize"] << " crop " << r["size"]);
    CHECK(worst <= 1);  // PIL resamples in fixed point; we in float
  }
}

TEST_CASE("encoders round-trip: PNG exactly, JPEG at quality 100 closely", "[images]") {
  for (int64_t c : {1, 3}) {
    std::vector<uint8_t> px(static_cast<size_t>(c * 36));  // smooth: JPEG keeps it closely
    for (int64_t k = 0; k < c; ++k)
      for (int64_t y = 0; y < 6; ++y)
        for (int64_t x = 0; x < 6; ++x)
          px[(k * 6 + y) * 6 + x] = uint8_t(20 + 20 * x + 10 * y + 30 * k);
    const auto png = encode_png(px.data(), c, 6, 6);
    CHECK(sniff_image(png.data(), png.size()) == ImageFormat::kPng);
    CHECK(decode_image(png.data(), png.size(), "p", c).px.size() == px.size());
    std::vector<uint8_t> chw(px.size());
    fit_image(decode_image(png.data(), png.size(), "p", c), {6, c, 0}, chw.data());
    CHECK(chw == px);
    const auto jpg = encode_jpeg(px.data(), c, 6, 6, 100);
    fit_image(decode_image(jpg.data(), jpg.size(), "j", c), {6, c, 0}, chw.data());
    int worst = 0;
    for (size_t i = 0; i < px.size(); ++i) worst = std::max(worst, std::abs(chw[i] - px[i]));
    CHECK(worst < (c == 1 ? 4 : 16));  // RGB: 4:2:0 chroma subsampling
  }
}

TEST_CASE("corrupt, truncated and foreign images fail naming the file", "[images][bad]") {
  const auto png = encode_png(pattern(1).data(), 1, 6, 6);
  const auto jpg = encode_jpeg(pattern(1).data(), 1, 6, 6, 90);
  auto fails = [](std::vector<uint8_t> b, const std::string& want) {
    const std::string e = error_of([&] { decode_image(b.data(), b.size(), "bad.img", 1); });
    INFO(e);
    CHECK(e.find("bad.img") != std::string::npos);
    CHECK(e.find(want) != std::string::npos);
  };
  fails(std::vector<uint8_t>(png.begin(), png.begin() + png.size() / 2), "PNG");
  fails(std::vector<uint8_t>(jpg.begin(), jpg.begin() + jpg.size() - 40), "JPEG");
  fails({'G', 'I', 'F', '8', '9', 'a', 0, 0}, "neither JPEG nor PNG");
  auto flipped = png;
  flipped[flipped.size() / 2] ^= 0xFF;  // a CRC mismatch
  fails(flipped, "PNG");
  fails(unhex(golden()["cmyk_jpeg"]), "CMYK");  // refused with the conversion to make
  // An image claiming 100000 px per side is refused before any allocation.
  auto huge = png;
  huge[16] = 0, huge[17] = 1, huge[18] = 0x86, huge[19] = 0xA0;  // IHDR width = 100000
  fails(huge, "PNG");
}

TEST_CASE("image folder: classes sorted, files sorted, decoded in the loader", "[folder]") {
  const fs::path root = fresh_dir("folder");
  // class "b" holds PNGs, class "a" JPEGs and a README that ImageFolder would ignore too.
  for (int i = 0; i < 3; ++i)
    write_bytes(root / "b" / ("img" + std::to_string(i) + ".PNG"),
                encode_png(pattern(i).data(), 1, 6, 6));
  for (int i = 0; i < 2; ++i)
    write_bytes(root / "a" / "nested" / ("x" + std::to_string(i) + ".jpg"),
                encode_jpeg(pattern(10 + i).data(), 1, 6, 6, 100));
  write_bytes(root / "a" / "README.txt", {'h', 'i'});
  FolderOptions fo;
  fo.image = {6, 1, 0};
  std::vector<std::string> classes;
  const Dataset ds = load_image_folder(root.string(), fo, &classes);
  CHECK(classes == std::vector<std::string>{"a", "b"});
  REQUIRE(ds.count == 5);
  CHECK(ds.label(0) == 0);
  CHECK(ds.label(4) == 1);
  std::vector<uint8_t> buf;
  const uint8_t* px = ds.sample_into(2, buf);  // b/img0.PNG, lossless
  CHECK(std::vector<uint8_t>(px, px + 36) == pattern(0));
  CHECK(list_image_folder(root.string(), fo).ignored == 1);

  Loader loader(ds, {.batch_size = 2, .workers = 2, .shuffle = false, .drop_last = false});
  CHECK(all_batches(loader, 0).size() == 5u * 36);

  fo.num_classes = 3;
  CHECK(error_of([&] { load_image_folder(root.string(), fo); }).find("data.num_classes=2") !=
        std::string::npos);
}

TEST_CASE("image folder bad input: empty class, foreign file, truncated image", "[folder][bad]") {
  const fs::path root = fresh_dir("folder_bad");
  write_bytes(root / "cat" / "1.png", encode_png(pattern(1).data(), 1, 6, 6));
  fs::create_directories(root / "dog");
  FolderOptions fo;
  fo.image = {6, 1, 0};
  CHECK(error_of([&] { load_image_folder(root.string(), fo); }).find("empty class folder") !=
        std::string::npos);

  write_bytes(root / "dog" / "1.png", encode_png(pattern(2).data(), 1, 6, 6));
  write_bytes(root / "dog" / "2.png", {'n', 'o', 't', ' ', 'p', 'n', 'g', '!', '!'});
  const std::string e = error_of([&] { load_image_folder(root.string(), fo); });
  CHECK(e.find((root / "dog" / "2.png").string()) != std::string::npos);

  // Truncated after a valid header: found when the loader decodes it, raised by next().
  const auto full = encode_png(pattern(3).data(), 1, 6, 6);
  write_bytes(root / "dog" / "2.png", std::vector<uint8_t>(full.begin(), full.begin() + 40));
  const Dataset ds = load_image_folder(root.string(), fo);
  Loader loader(ds, {.batch_size = 3, .workers = 1, .shuffle = false, .drop_last = false});
  const std::string le = error_of([&] { all_batches(loader, 0); });
  CHECK(le.find("2.png") != std::string::npos);

  fo.skip_bad = true;  // every image decoded at load: the bad one is left out and counted
  const Dataset kept = load_image_folder(root.string(), fo);
  CHECK(kept.count == 2);
  CHECK(kept.skipped == 1);
}

// data.image.cache: memory decodes every image once at load: the same samples and labels as the
// loader's on-demand decoding, no reader left, a truncated image fails at load (or is skipped).
TEST_CASE("image folder in memory: the same samples, decoded once at load", "[folder]") {
  const fs::path root = fresh_dir("folder_mem");
  for (int i = 0; i < 4; ++i)
    write_bytes(root / (i % 2 ? "b" : "a") / ("i" + std::to_string(i) + ".png"),
                encode_png(pattern(20 + i).data(), 1, 6, 6));
  write_bytes(root / "a" / "j.jpg", encode_jpeg(pattern(30).data(), 1, 6, 6, 90));
  FolderOptions fo;
  fo.image = {4, 3, 5};  // resized, centre-cropped and made RGB on the way
  const Dataset lazy = load_image_folder(root.string(), fo);
  fo.in_memory = true;
  const Dataset mem = load_image_folder(root.string(), fo);
  CHECK(lazy.reader != nullptr);
  CHECK(mem.reader == nullptr);
  REQUIRE(mem.count == lazy.count);
  REQUIRE(mem.count == 5);
  std::vector<uint8_t> a, b;
  for (int64_t i = 0; i < mem.count; ++i) {
    const uint8_t* x = lazy.sample_into(i, a);
    const uint8_t* y = mem.sample_into(i, b);
    CHECK(std::vector<uint8_t>(x, x + 48) == std::vector<uint8_t>(y, y + 48));
    CHECK(mem.label(i) == lazy.label(i));
  }
  Loader loader(mem, {.batch_size = 2, .workers = 2, .shuffle = false, .drop_last = false});
  CHECK(all_batches(loader, 0).size() == 5u * 48);

  // A truncated image: an error at load naming it, or left out with skip (the rest realigned).
  const auto full = encode_png(pattern(40).data(), 1, 6, 6);
  write_bytes(root / "a" / "i0.png", std::vector<uint8_t>(full.begin(), full.begin() + 40));
  CHECK(error_of([&] { load_image_folder(root.string(), fo); }).find("i0.png") !=
        std::string::npos);
  fo.skip_bad = true;
  const Dataset kept = load_image_folder(root.string(), fo);
  REQUIRE(kept.count == 4);
  CHECK(kept.skipped == 1);
  for (int64_t i = 0; i < kept.count; ++i) {  // lazy sample i + 1 is kept sample i
    const uint8_t* x = lazy.sample_into(i + 1, a);
    CHECK(std::vector<uint8_t>(x, x + 48) ==
          std::vector<uint8_t>(kept.sample(i), kept.sample(i) + 48));
    CHECK(kept.label(i) == lazy.label(i + 1));
  }
}

TEST_CASE("CSV: names, categories, fills, standardisation and text classes", "[csv]") {
  const fs::path d = fresh_dir("csv");
  {
    std::ofstream(d / "train.csv") << "age,city,score,label\n"
                                      "30,paris,1.5,cat\n"
                                      "40,\"berlin, de\",,dog\n"
                                      "50,paris,2.5,cat\n";
    std::ofstream(d / "test.csv") << "age,city,score,label\n60,\"berlin, de\",NA,dog\n";
  }
  CsvOptions o;
  o.categorical = {"city"};
  o.fill = "mean";
  o.standardize = false;
  o.num_classes = 2;
  CsvOptions::Learned L;
  const Dataset tr = load_csv((d / "train.csv").string(), o, &L);
  REQUIRE(tr.count == 3);
  REQUIRE(tr.sample_shape == std::vector<int64_t>{3});
  const float* x = reinterpret_cast<const float*>(tr.data);
  CHECK(x[3 + 1] == 0);    // "berlin, de" sorts before "paris"
  CHECK(x[3 + 2] == 2.0);  // the mean of 1.5 and 2.5
  CHECK(L.class_names == std::vector<std::string>{"cat", "dog"});
  CHECK(tr.label(1) == 1);
  o.reuse = &L;
  const Dataset te = load_csv((d / "test.csv").string(), o, nullptr);
  CHECK(reinterpret_cast<const float*>(te.data)[2] == 2.0);  // the training mean, not the test's
  CHECK(te.label(0) == 1);

  o.reuse = nullptr;
  o.standardize = true;
  const Dataset st = load_csv((d / "train.csv").string(), o, &L);
  const float* s = reinterpret_cast<const float*>(st.data);
  CHECK(s[0] + s[3] + s[6] == Approx(0).margin(1e-6));
  CHECK(s[0] == Approx(-1.2247449).epsilon(1e-5));  // (30 - 40) / std(30, 40, 50)
}

// RFC 4180 details the table reader re-splits rows for: "" inside quotes, quoted delimiters and
// newlines, CRLF line ends, blank lines, a last row without a newline; error lines count the
// newlines inside quoted cells.
TEST_CASE("CSV: RFC 4180 quoting, CRLF, blank lines", "[csv]") {
  const fs::path d = fresh_dir("csv_rfc");
  std::ofstream(d / "q.csv") << "name,x,y\r\n"
                                "\"say \"\"hi\"\"\",1,0\r\n"
                                "\r\n"
                                "\"two\nlines, here\",2,1\r\n"
                                "plain,3,0";
  CsvOptions o;
  o.categorical = {"name"};
  o.standardize = false;
  o.num_classes = 2;
  CsvOptions::Learned L;
  const Dataset t = load_csv((d / "q.csv").string(), o, &L);
  REQUIRE(t.count == 3);
  CHECK(L.categories[0] ==
        std::vector<std::string>{"plain", "say \"hi\"", "two\nlines, here"});  // sorted
  const float* x = reinterpret_cast<const float*>(t.data);
  CHECK(x[0] == 1);  // 'say "hi"'
  CHECK(x[1] == 1);
  CHECK(x[2] == 2);  // the quoted cell with a newline
  CHECK(x[5] == 3);
  CHECK(t.label(1) == 1);
  std::ofstream(d / "bad.csv") << "name,x,y\n\"two\nlines, here\",1,0\nplain,oops,1\n";
  o.reuse = &L;
  const std::string e = error_of([&] { load_csv((d / "bad.csv").string(), o, nullptr); });
  CHECK(e.find("bad.csv:4, column 'x'") != std::string::npos);  // line 4: the quoted newline counts
}

TEST_CASE("CSV bad input names file, line and column", "[csv][bad]") {
  const fs::path d = fresh_dir("csv_bad");
  auto err = [&](const std::string& text, CsvOptions o) {
    std::ofstream(d / "t.csv") << text;
    o.num_classes = 3;
    return error_of([&] { load_csv((d / "t.csv").string(), o, nullptr); });
  };
  CsvOptions o;
  CHECK(err("a,b,y\n1,2,0\n1,2\n", o).find("t.csv:3") != std::string::npos);
  const std::string nn = err("a,b,y\n1,2,0\n1,x,1\n", o);
  CHECK(nn.find("t.csv:3, column 'b'") != std::string::npos);
  CHECK(nn.find("data.csv.categorical") != std::string::npos);
  CHECK(err("a,b,y\n1,,0\n", o).find("missing value") != std::string::npos);
  CHECK(err("a,b,y\n1,2,7\n", o).find("data.num_classes") != std::string::npos);
  CHECK(err("a,\"b,y\n1,2,0\n", o).find("unterminated") != std::string::npos);
  o.features = {"nope"};
  CHECK(err("a,b,y\n1,2,0\n", o).find("columns are: a, b, y") != std::string::npos);
}

TEST_CASE("chunk sets: raw records round-trip, order stays within windows, resume is exact",
          "[chunks]") {
  const fs::path d = fresh_dir("chunks");
  const int64_t n = 103;
  auto px = std::make_shared<std::vector<uint8_t>>(n * 36);
  for (size_t i = 0; i < px->size(); ++i) (*px)[i] = static_cast<uint8_t>(i * 7 % 251);
  auto labels = std::make_shared<std::vector<int64_t>>(n);
  for (int64_t i = 0; i < n; ++i) (*labels)[i] = i % 5;
  Dataset src;
  src.source = "mem";
  src.count = n;
  src.sample_shape = {1, 6, 6};
  src.data = px->data();
  src.storage = px;
  src.labels = labels;
  src.num_classes = 5;
  const auto r = write_chunks(src, (d / "set").string(), {.chunk_bytes = 36 * 10});
  CHECK(r.chunks == 11);
  CHECK(is_chunk_set((d / "set").string()));
  const Dataset ds = load_chunks((d / "set").string(), {.resident_chunks = 3});
  REQUIRE(ds.count == n);
  CHECK(ds.chunk_samples == 10);
  std::vector<uint8_t> buf;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = ds.sample_into(i, buf);
    REQUIRE(std::equal(p, p + 36, src.sample(i)));
    REQUIRE(ds.label(i) == src.label(i));
  }

  // The order: a permutation, a pure function of its inputs, new each epoch, and every group of
  // `window` x chunk consecutive positions drawn from at most `window` chunks.
  const auto o1 = chunked_order(n, 0, 10, 2, 7, 0, 0, 1);
  CHECK(o1 == chunked_order(n, 0, 10, 2, 7, 0, 0, 1));
  CHECK(o1 != chunked_order(n, 0, 10, 2, 7, 1, 0, 1));
  CHECK(std::set<int64_t>(o1.begin(), o1.end()).size() == static_cast<size_t>(n));
  std::set<int64_t> seen;
  int64_t window_starts = 0;
  for (size_t i = 0; i < o1.size(); ++i) {
    seen.insert(o1[i] / 10);
    if (seen.size() > 2) seen = {o1[i] / 10}, ++window_starts;
  }
  CHECK(window_starts <= 5);
  // Two ranks share the epoch without overlap.
  auto r0 = chunked_order(n, 0, 10, 2, 7, 0, 0, 2), r1 = chunked_order(n, 0, 10, 2, 7, 0, 1, 2);
  std::set<int64_t> both(r0.begin(), r0.end());
  both.insert(r1.begin(), r1.end());
  CHECK(both.size() == r0.size() + r1.size());

  Loader a(ds, {.batch_size = 8, .workers = 2, .seed = 3, .shuffle_window = 2});
  Loader b(ds, {.batch_size = 8, .workers = 1, .seed = 3, .shuffle_window = 2});
  const auto full = all_batches(a, 1);
  const auto tail = all_batches(b, 1, 5);  // resumed at batch 5 of epoch 1
  REQUIRE(tail.size() == full.size() - 5 * 8 * 36);
  CHECK(std::equal(tail.begin(), tail.end(), full.begin() + 5 * 8 * 36));
}

TEST_CASE("chunk sets: JPEG records, corrupt chunks and index, float targets", "[chunks][bad]") {
  const fs::path d = fresh_dir("chunks_bad");
  const fs::path folder = d / "imgs";
  for (int i = 0; i < 12; ++i)
    write_bytes(folder / (i % 2 ? "odd" : "even") / (std::to_string(i) + ".png"),
                encode_png(pattern(i).data(), 1, 6, 6));
  FolderOptions fo;
  fo.image = {6, 1, 0};
  const Dataset imgs = load_image_folder(folder.string(), fo);
  write_chunks(imgs, (d / "jpeg").string(), {.chunk_bytes = 2000, .jpeg = true, .quality = 100});
  const Dataset back = load_chunks((d / "jpeg").string(), {});
  REQUIRE(back.count == 12);
  std::vector<uint8_t> a, b;
  int worst = 0;
  for (int64_t i = 0; i < 12; ++i) {
    const uint8_t* p = imgs.sample_into(i, a);
    const uint8_t* q = back.sample_into(i, b);
    for (int k = 0; k < 36; ++k) worst = std::max(worst, std::abs(p[k] - q[k]));
    CHECK(back.label(i) == imgs.label(i));
  }
  CHECK(worst < 4);
  CHECK(error_of([&] { write_chunks(imgs, (d / "jpeg").string(), {}); }).find("already exists") !=
        std::string::npos);

  // One flipped byte in a chunk: the SHA-256 check names the chunk, on read and in verify.
  write_chunks(imgs, (d / "raw").string(), {.chunk_bytes = 36 * 4});
  const fs::path chunk = d / "raw" / "chunk-00001.bin";
  {
    std::fstream f(chunk, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x7f');
  }
  const Dataset bad = load_chunks((d / "raw").string(), {});
  std::vector<uint8_t> buf;
  CHECK_NOTHROW(bad.sample_into(0, buf));  // chunk 0 is intact
  const std::string e = error_of([&] { bad.sample_into(5, buf); });
  CHECK(e.find("chunk-00001.bin") != std::string::npos);
  CHECK(e.find("SHA-256") != std::string::npos);
  CHECK(error_of([&] { verify_chunks((d / "raw").string()); }).find("chunk 1") !=
        std::string::npos);

  // Hostile indexes (found by tests/fuzz/fuzz_chunk_index.cpp): each a DataError naming
  // index.json, never an escaping JSON exception, an overflow or a file outside the set.
  const std::string good = slurp_text(d / "raw" / "index.json");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  const std::pair<std::string, std::string> hostile[] = {
      {with("\"file\": \"targets.bin\"", "\"fila\": \"targets.bin\""), "malformed targets entry"},
      {with("\"file\": \"targets.bin\"", "\"file\": \"../targets.bin\""), "not a file of the set"},
      {with("\"file\": \"chunk-00001.bin\"", "\"file\": \"/etc/passwd\""), "not a file of the set"},
      {with("\"sample_shape\": [", "\"sample_shape\": [4611686018427387904, "), "more bytes than"},
      {with("\"count\": 12", "\"count\": 8e20"), "malformed index"},  // a float, not an int64
      {R"({"format":"mltrain-chunks","version":1})", "index.json"},
  };
  for (const auto& [text, why] : hostile) {
    INFO(text);
    std::ofstream(d / "raw" / "index.json") << text;
    const std::string err = error_of([&] { load_chunks((d / "raw").string(), {}); });
    CHECK(err.find("index.json") != std::string::npos);
    CHECK(err.find(why) != std::string::npos);
  }
}

TEST_CASE("a chunk set larger than the resident window streams without growing RSS",
          "[chunks][memory]") {
  const fs::path d = fresh_dir("chunks_rss");
  const int64_t n = 4096, side = 96;  // 4096 x 9 KiB = 36 MiB in 1 MiB chunks
  auto px = std::make_shared<std::vector<uint8_t>>(n * side * side);
  for (size_t i = 0; i < px->size(); ++i) (*px)[i] = static_cast<uint8_t>(i * 13 % 255);
  Dataset src;
  src.source = "mem";
  src.count = n;
  src.sample_shape = {1, side, side};
  src.data = px->data();
  src.labels = std::make_shared<std::vector<int64_t>>(n, 0);
  src.num_classes = 1;
  write_chunks(src, (d / "set").string(), {.chunk_bytes = 1 << 20});
  px.reset();  // the source array leaves memory before we measure
  auto grow = [&](int64_t resident) {
    const Dataset ds = load_chunks((d / "set").string(), {.resident_chunks = resident});
    Loader loader(ds, {.batch_size = 16, .workers = 1, .seed = 1, .shuffle_window = 2});
    loader.start_epoch(0);
    Batch b;
    for (int i = 0; i < 8; ++i) loader.next(b);  // every slot touched, the first chunks mapped
    const int64_t before = rss_kib();
    while (loader.next(b)) {
    }
    b = Batch{};
    return (rss_kib() - before) / 1024;
  };
  const int64_t bounded = grow(5), unbounded = grow(0);
  INFO("RSS growth over an epoch: resident 5 chunks " << bounded << " MiB, all chunks " << unbounded
                                                      << " MiB");
  CHECK(bounded < 12);
  CHECK(unbounded > 24);  // the same epoch with every chunk kept mapped: the check can fail
}
