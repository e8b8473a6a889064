// Data engine: IDX / npy / shard readers (accept and reject tables), and the loader.
#include <catch2/catch.hpp>

#include "temp_dir.hpp"
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "mltrain/core/error.hpp"
#include "mltrain/data/dataset.hpp"
#include "mltrain/data/augment.hpp"
#include "mltrain/data/loader.hpp"

using namespace mltrain;
using namespace mltrain::data;
namespace fs = std::filesystem;

static const std::string kFmnist = "/usr/share/datasets/fashion-mnist";

static fs::path tmpdir() {
  static const fs::path d =
      mltrain::testing::fresh_temp_dir("data");  // once per run of this binary
  return d;
}
static std::string put(const std::string& name, const std::string& bytes) {
  auto p = (tmpdir() / name).string();
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}
static std::string idx_bytes(uint8_t type, std::vector<uint32_t> dims, size_t payload) {
  std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (auto d : dims)
    for (int k = 3; k >= 0; --k) s += static_cast<char>((d >> (8 * k)) & 0xff);
  for (size_t i = 0; i < payload; ++i) s += static_cast<char>(i % 10);
  return s;
}
static std::string npy_bytes(const std::string& descr, const std::string& shape, size_t payload,
                             int major = 1, const char* fortran = "False") {
  std::string h =
      "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  const size_t pre = major == 1 ? 10 : 12;
  while ((pre + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string s = "\x93NUMPY";
  s += static_cast<char>(major);
  s += '\0';
  const size_t n = h.size();
  s += static_cast<char>(n & 0xff);
  s += static_cast<char>((n >> 8) & 0xff);
  if (major != 1) s += std::string(2, '\0');
  s += h;
  s += std::string(payload, '\x01');
  return s;
}
static std::string gz(const std::string& raw, size_t keep) {
  auto p = (tmpdir() / "tmp.gz").string();
  gzFile f = gzopen(p.c_str(), "wb");
  gzwrite(f, raw.data(), static_cast<unsigned>(raw.size()));
  gzclose(f);
  std::ifstream in(p, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  return all.substr(0, std::min(keep, all.size()));
}
static std::string data_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("real Fashion-MNIST IDX files read with the documented shapes", "[idx]") {
  auto img = read_array(kFmnist + "/train-images-idx3-ubyte.gz");
  CHECK(img.dtype == DType::kU8);
  CHECK(img.shape == std::vector<int64_t>{60000, 28, 28});
  auto ds = load_dataset(kFmnist + "/t10k-images-idx3-ubyte.gz",
                         kFmnist + "/t10k-labels-idx1-ubyte.gz", 10);
  CHECK(ds.count == 10000);
  CHECK(ds.sample_shape == std::vector<int64_t>{1, 28, 28});
  std::vector<int64_t> hist(10, 0);
  for (int64_t i = 0; i < ds.count; ++i) hist[ds.label(i)]++;
  for (auto h : hist) CHECK(h == 1000);  // the test split is balanced: 1000 per class
}

TEST_CASE("IDX accept table", "[idx]") {
  auto a = read_array(put("ok.idx", idx_bytes(0x08, {3, 2, 2}, 12)));
  CHECK(a.shape_text() == "3x2x2");
  auto raw = idx_bytes(0x08, {4}, 4);
  auto g = read_array(put("ok.idx.gz", gz(raw, 1 << 20)));
  CHECK(g.shape == std::vector<int64_t>{4});
  auto f = read_array(put("f32.idx", idx_bytes(0x0D, {2}, 8)));
  CHECK(f.dtype == DType::kF32);
}

// A gzipped IDX file decodes in one call (libdeflate, when built in) or through zlib's stream (several
// members, a lying trailer); both give the bytes zlib's gzread gives, and a corrupt file is
// reported by the stream as before.
TEST_CASE("gzip: one-call and streamed decoding give zlib's bytes", "[idx]") {
  auto zlib_bytes = [](const std::string& path) {
    gzFile f = gzopen(path.c_str(), "rb");
    std::string out;
    char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    gzclose(f);
    return out;
  };
  auto payload = [](const Array& a) {
    return std::string(reinterpret_cast<const char*>(a.data), static_cast<size_t>(a.numel()));
  };
  // The real file, single member: every byte after the 16-byte header.
  const std::string real = kFmnist + "/train-images-idx3-ubyte.gz";
  const auto img = read_array(real);
  CHECK(payload(img) == zlib_bytes(real).substr(16));
  // Random bytes, so the stream is not trivially compressible.
  std::string raw = idx_bytes(0x08, {300, 7, 11}, 0);
  uint32_t x = 12345;
  for (int i = 0; i < 300 * 7 * 11; ++i)
    raw += static_cast<char>((x = x * 1103515245u + 12345u) >> 24);
  const auto one = read_array(put("one.idx.gz", gz(raw, 1 << 30)));
  CHECK(payload(one) == raw.substr(16));
  // Two gzip members back to back (what `cat a.gz b.gz` makes): the one-call path declines it.
  const std::string two_members = gz(raw.substr(0, 5000), 1 << 30) + gz(raw.substr(5000), 1 << 30);
  const auto two = read_array(put("two.idx.gz", two_members));
  CHECK(payload(two) == raw.substr(16));
  // A trailer whose length is wrong: declined by the one-call path, named by zlib's check.
  std::string lying = gz(raw, 1 << 30);
  lying[lying.size() - 4] ^= 1;
  const auto p = put("lying.idx.gz", lying);
  auto err = data_error([&] { read_array(p); });
  CHECK_THAT(err, Catch::Contains("gzip stream"));
  CHECK_THAT(err, Catch::Contains(p));
}

TEST_CASE("IDX reject table", "[idx]") {
  const std::pair<std::string, const char*> rows[] = {
      {idx_bytes(0x08, {3, 2, 2}, 11), "truncated: header says 3x2x2 u8"},
      {idx_bytes(0x08, {3, 2, 2}, 13), "unexpected trailing bytes"},
      {std::string("\x01\x02\x08\x01", 4) + "abcd", "wrong magic: not an IDX file"},
      {idx_bytes(0x07, {2}, 2), "wrong magic: unknown IDX element type 0x07"},
      {idx_bytes(0x08, {}, 0), "declares 0 dimensions"},
      {idx_bytes(0x0E, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, 8),
       "more bytes than any file can hold"},
      {std::string("\0\0", 2), "too short for an IDX header"},
      {gz(idx_bytes(0x08, {100, 28, 28}, 78400), 200), "gzip"},
  };
  int i = 0;
  for (const auto& [bytes, why] : rows) {
    INFO(why);
    auto p = put("bad" + std::to_string(i++) + ".idx", bytes);
    auto err = data_error([&] { read_array(p); });
    CHECK_THAT(err, Catch::Contains(why));
    CHECK_THAT(err, Catch::Contains(p));  // the message names the file
  }
}

TEST_CASE("npy accept table: v1/v2 headers; u8, f32, i64", "[npy]") {
  auto u8 = read_array(put("u8.npy", npy_bytes("|u1", "(3, 2, 2)", 12)));
  CHECK(u8.dtype == DType::kU8);
  CHECK(u8.shape_text() == "3x2x2");
  auto f32 = read_array(put("f32.npy", npy_bytes("<f4", "(5,)", 20, 2)));
  CHECK(f32.dtype == DType::kF32);
  CHECK(f32.shape == std::vector<int64_t>{5});
  auto i64 = read_array(put("i64.npy", npy_bytes("<i8", "(4,)", 32)));
  CHECK(i64.dtype == DType::kI64);
}

TEST_CASE("npy reject table", "[npy]") {
  const std::pair<std::string, const char*> rows[] = {
      {npy_bytes("|u1", "(3, 2, 2)", 11), "truncated: header says 3x2x2 u8"},
      {npy_bytes(">f4", "(2,)", 8), ".npy dtype '>f4' is not supported"},
      {npy_bytes("<c8", "(2,)", 16), "not supported"},
      {npy_bytes("|u1", "(2, 2)", 4, 1, "True"), "Fortran order"},
      {npy_bytes("|u1", "()", 1), "scalar"},
      {std::string("\x93NUMPZ\x01\x00", 8), "wrong magic: not a .npy file"},
      {npy_bytes("|u1", "(2,)", 2, 9), "version 9 is not supported"},
      {npy_bytes("|u1", "(99999999999999999999999,)", 8),
       "dimension '99999999999999999999999' is too large"},
      {npy_bytes("<f4", "(4294967296, 4294967296)", 8), "more bytes than any file can hold"},
  };
  int i = 0;
  for (const auto& [bytes, why] : rows) {
    INFO(why);
    auto p = put("bad" + std::to_string(i++) + ".npy", bytes);
    CHECK_THAT(data_error([&] { read_npy(p); }), Catch::Contains(why));
  }
}

TEST_CASE("datasets: label range and count mismatch are rejected", "[dataset]") {
  auto imgs = put("imgs.idx", idx_bytes(0x08, {3, 2, 2}, 12));
  std::string lab = idx_bytes(0x08, {3}, 0) + std::string("\x01\x02\x0b", 3);
  auto labs = put("labs.idx", lab);
  CHECK_THAT(data_error([&] { load_dataset(imgs, labs, 10); }),
             Catch::Contains("label out of range at index 2: 11 not in [0, 10)"));
  auto short_labs = put("labs2.idx", idx_bytes(0x08, {2}, 0) + std::string("\x01\x02", 2));
  CHECK_THAT(data_error([&] { load_dataset(imgs, short_labs, 10); }),
             Catch::Contains("shape mismatch: 2 labels for 3 images"));
  CHECK_THAT(data_error([&] { load_dataset("/nonexistent.idx", labs, 10); }),
             Catch::Contains("file not found"));
}

TEST_CASE("shard: convert round trip and corruption", "[shard]") {
  auto ds = load_dataset(kFmnist + "/t10k-images-idx3-ubyte.gz",
                         kFmnist + "/t10k-labels-idx1-ubyte.gz", 10);
  auto path = (tmpdir() / "test.shard").string();
  write_shard(ds, path);
  REQUIRE(is_shard(path));
  auto back = load_dataset(path, "", 10);
  CHECK(back.count == ds.count);
  CHECK(back.sample_shape == ds.sample_shape);
  CHECK(std::memcmp(back.data, ds.data, ds.count * ds.sample_bytes()) == 0);
  for (int64_t i = 0; i < ds.count; i += 997) CHECK(back.label(i) == ds.label(i));
  CHECK(reinterpret_cast<uintptr_t>(back.data) % 4096 == 0);  // records start page-aligned
  // Truncate it: a clear error, not a crash.
  fs::resize_file(path, fs::file_size(path) / 2);
  CHECK_THAT(data_error([&] { read_shard(path); }), Catch::Contains("truncated: shard needs"));
  CHECK_THAT(data_error([&] { load_dataset(path, "", 5); }), Catch::Contains("truncated"));
  // Forged headers (found by tests/fuzz/fuzz_shard): a shape whose byte count wraps around to the
  // declared size, and offsets past the file, are corrupt headers, not reads past the mapping.
  write_shard(ds.slice(0, 2), path);
  auto patch = [&](size_t offset, const void* v, size_t n) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(static_cast<const char*>(v), static_cast<std::streamsize>(n));
  };
  const int64_t wrap[2] = {int64_t{1} << 62, 4};  // 2 x 2^62 x 4 x 1 byte wraps to 0 in 64 bits
  patch(32, wrap, sizeof wrap);
  CHECK_THAT(data_error([&] { read_shard(path); }), Catch::Contains("corrupt shard header"));
  write_shard(ds.slice(0, 2), path);
  const uint64_t far = ~uint64_t{0} - 100;  // data_offset: past the file, and + bytes would wrap
  patch(64, &far, sizeof far);
  CHECK_THAT(data_error([&] { read_shard(path); }), Catch::Contains("truncated: shard needs"));
  write_shard(ds.slice(0, 0), path);  // an empty shard reads as empty (copied no labels from null)
  CHECK(read_shard(path).count == 0);
  const int64_t huge[3] = {int64_t{1} << 40, int64_t{1} << 30, 1};  // count 0 hid this product
  patch(32, huge, sizeof huge);
  CHECK_THAT(data_error([&] { read_shard(path); }), Catch::Contains("sample shape"));
}

TEST_CASE("epoch order is a pure function of (seed, epoch, rank, world)", "[loader]") {
  auto a = epoch_order(1000, 7, 3, 0, 1, true);
  CHECK(a == epoch_order(1000, 7, 3, 0, 1, true));
  CHECK(a != epoch_order(1000, 7, 4, 0, 1, true));
  CHECK(a != epoch_order(1000, 8, 3, 0, 1, true));
  CHECK(std::set<int64_t>(a.begin(), a.end()).size() == 1000);
  // Ranks split one global permutation: disjoint, equal sizes, union = floor(N/world)*world samples.
  std::set<int64_t> all;
  for (int r = 0; r < 3; ++r) {
    auto part = epoch_order(1000, 7, 3, r, 3, true);
    CHECK(part.size() == 333);
    all.insert(part.begin(), part.end());
  }
  CHECK(all.size() == 999);
  auto seq = epoch_order(5, 1, 0, 0, 1, false);
  CHECK(seq == std::vector<int64_t>{0, 1, 2, 3, 4});
}

TEST_CASE(
    "epoch order in global blocks (invariance: bitwise): a twelfth of a block is the same samples "
    "in every world that divides 12, also after a skip",
    "[loader][invariance]") {
  const int64_t n = 1000, block = 120;  // 8 whole blocks; the last 40 samples are never read
  for (const int64_t skip : {int64_t{0}, int64_t{240}}) {
    const auto global = epoch_order(n, 7, 3, 0, 1, true);
    for (const int64_t world : {1, 2, 3, 4, 6, 12}) {
      std::vector<int64_t> shards;  // every rank's samples, laid out by rank: shard order
      for (int64_t j = 0; j < (n - skip) / block; ++j)
        for (int64_t r = 0; r < world; ++r) {
          const auto part = epoch_order(n, 7, 3, r, world, true, skip, block);
          REQUIRE(int64_t(part.size()) == (n - skip) / block * (block / world));
          const int64_t per = block / world;
          shards.insert(shards.end(), part.begin() + j * per, part.begin() + (j + 1) * per);
        }
      // Block j's shard v holds entries [skip + j*120 + v*10, +10) of the global permutation.
      CHECK(shards == std::vector<int64_t>(global.begin() + skip,
                                           global.begin() + skip + (n - skip) / block * block));
    }
  }
}

TEST_CASE(
    "epoch order with a skip: the rest of one world's epoch re-shards over another, each sample "
    "once",
    "[loader][elastic]") {
  const int64_t n = 1000;
  // World 2, 4 batches of 16 on each rank consumed the first 2 x 4 x 16 = 128 entries of the
  // global permutation, whatever the world.
  const auto global = epoch_order(n, 7, 3, 0, 1, true);
  std::multiset<int64_t> seen;
  for (int r = 0; r < 2; ++r) {
    const auto part = epoch_order(n, 7, 3, r, 2, true);
    seen.insert(part.begin(), part.begin() + 4 * 16);
  }
  CHECK(seen == std::multiset<int64_t>(global.begin(), global.begin() + 128));
  // The other 872 over three ranks: 290 each (2 of them dropped, as drop_last drops any tail).
  for (const int64_t world : {1, 3, 4}) {
    std::multiset<int64_t> rest = seen;
    for (int64_t r = 0; r < world; ++r) {
      const auto part = epoch_order(n, 7, 3, r, world, true, /*skip=*/128);
      CHECK(int64_t(part.size()) == (n - 128) / world);
      CHECK(part.front() == global[size_t(128 + r)]);  // strided from the skip
      rest.insert(part.begin(), part.end());
    }
    CHECK(std::set<int64_t>(rest.begin(), rest.end()).size() == rest.size());  // no repeats
    CHECK(int64_t(rest.size()) == 128 + (n - 128) / world * world);
  }
  // rank_share by hand; a skip past the end leaves nothing.
  const std::vector<int64_t> perm = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
  CHECK(rank_share(perm, 1, 3, 2) == std::vector<int64_t>{6, 3});
  CHECK(rank_share(perm, 0, 1, 7) == std::vector<int64_t>{2, 1, 0});
  CHECK(rank_share(perm, 0, 2, 20).empty());
  // Chunk sets take the same skip.
  const auto chunked = chunked_order(n, 0, 100, 2, 7, 3, 0, 1);
  CHECK(chunked_order(n, 0, 100, 2, 7, 3, 1, 2, 10).front() == chunked[11]);
}

static std::vector<torch::Tensor> collect(Loader& l, int64_t epoch, int64_t first = 0) {
  std::vector<torch::Tensor> out;
  l.start_epoch(epoch, first);
  Batch b;
  while (l.next(b))
    out.push_back(torch::cat({b.x.flatten(1), b.y.unsqueeze(1).to(torch::kFloat)}, 1).clone());
  return out;
}

TEST_CASE("loader: batches are normalised, identical for any worker count, resumable mid-epoch",
          "[loader]") {
  auto ds = load_dataset(kFmnist + "/t10k-images-idx3-ubyte.gz",
                         kFmnist + "/t10k-labels-idx1-ubyte.gz", 10)
                .slice(0, 1000);
  LoaderOptions o;
  o.batch_size = 64;
  o.seed = 5;
  o.mean = 0.5f;
  o.std = 0.25f;
  o.workers = 0;
  Loader l0(ds, o);
  CHECK(l0.batches_per_epoch() == 15);  // drop_last: 1000 / 64
  auto ref = collect(l0, 2);
  REQUIRE(ref.size() == 15);
  // Normalisation: check one sample by hand.
  auto order = epoch_order(1000, 5, 2, 0, 1, true);
  const uint8_t* px = ds.sample(order[0]);
  for (int j : {0, 100, 400, 783})
    CHECK(ref[0][0][j].item<float>() == Approx((px[j] / 255.f - 0.5f) / 0.25f).epsilon(1e-6));
  CHECK(ref[0][0][784].item<float>() == ds.label(order[0]));
  for (int64_t w : {1, 2, 3}) {
    o.workers = w;
    o.prefetch = 2;
    Loader lw(ds, o);
    auto got = collect(lw, 2);
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(torch::equal(got[i], ref[i]));
  }
  // Resume at batch 9 gives exactly the tail.
  o.workers = 2;
  Loader lr(ds, o);
  auto tail = collect(lr, 2, 9);
  REQUIRE(tail.size() == 6);
  for (size_t i = 0; i < tail.size(); ++i) CHECK(torch::equal(tail[i], ref[9 + i]));
  // Rank 1 of 3 after 320 samples consumed by another world: (1000 - 320) / 3 = 226 samples,
  // 3 batches of 64, the first holding global entries 321, 324, ...
  {
    LoaderOptions r = o;
    r.rank = 1, r.world = 3;
    Loader lk(ds, r);
    CHECK(lk.batches_after(320) == 3);
    CHECK(lk.batches_after(0) == lk.batches_per_epoch());
    lk.start_epoch(2, 0, /*skip=*/320);
    CHECK(lk.batches_this_epoch() == 3);
    const auto first = lk.batch_samples(0);
    REQUIRE(first.size() == 64);
    CHECK(first[0] == order[321]);
    CHECK(first[1] == order[324]);
    Batch b;
    REQUIRE(lk.next(b));
    CHECK(b.y[0].item<int64_t>() == ds.label(order[321]));
  }
  // No drop_last: a short final batch.
  o.drop_last = false;
  o.shuffle = false;
  Loader ll(ds, o);
  auto all = collect(ll, 0);
  CHECK(all.size() == 16);
  CHECK(all.back().size(0) == 1000 - 15 * 64);
}

TEST_CASE("weighted sampler: draws by class weight, pure in (seed, epoch), resumable, any world",
          "[loader][sampler]") {
  auto ds = load_dataset(kFmnist + "/t10k-images-idx3-ubyte.gz",
                         kFmnist + "/t10k-labels-idx1-ubyte.gz", 10);  // 1000 of each class
  std::vector<double> w(10, 1.0);
  w[3] = 3.0;  // class 3 drawn 3 times as often
  w[7] = 0.0;  // never drawn: class 3 has 3 / 11 of the weight, the other eight 1 / 11 each
  const auto a = weighted_order(ds, w, 11, 2, 0, 1);
  REQUIRE(int64_t(a.size()) == ds.count);  // an epoch is as many draws as samples
  CHECK(a == weighted_order(ds, w, 11, 2, 0, 1));
  CHECK(a != weighted_order(ds, w, 11, 3, 0, 1));
  CHECK(a != weighted_order(ds, w, 12, 2, 0, 1));
  std::vector<int64_t> per(10, 0);
  for (int64_t i : a) ++per[size_t(ds.label(i))];
  CHECK(per[7] == 0);
  // Expected 10000 x 3/11 = 2727.3 of class 3 and 10000/11 = 909.1 of each other (binomial sd
  // 44.5 and 28.7): within 5 sd.
  CHECK(std::abs(per[3] - 2727.3) < 5 * 44.5);
  for (int c : {0, 1, 2, 4, 5, 6, 8, 9}) CHECK(std::abs(per[size_t(c)] - 909.1) < 5 * 28.7);
  CHECK(std::set<int64_t>(a.begin(), a.end()).size() < a.size());  // with replacement
  // Ranks share the one draw list as they share a shuffle; a skip resumes it in any world.
  CHECK(weighted_order(ds, w, 11, 2, 1, 3) == rank_share(a, 1, 3));
  CHECK(weighted_order(ds, w, 11, 2, 0, 2, 640) == rank_share(a, 0, 2, 640));
  // Through the loader: the batches' samples are those draws, and a resumed epoch its tail.
  LoaderOptions o;
  o.batch_size = 100;
  o.seed = 11;
  o.class_weights = w;
  Loader l(ds, o);
  l.start_epoch(2, 0);
  CHECK(l.batch_samples(0) == std::vector<int64_t>(a.begin(), a.begin() + 100));
  Loader r(ds, o);
  r.start_epoch(2, 7);
  CHECK(r.batch_samples(7) == std::vector<int64_t>(a.begin() + 700, a.begin() + 800));
  // Weights that leave no sample drawable are refused.
  CHECK_THROWS_AS(weighted_order(ds, std::vector<double>(10, 0.0), 1, 0, 0, 1), DataError);
}

TEST_CASE("normalize_u8 matches the scalar formula for every byte", "[loader]") {
  std::vector<uint8_t> src(256 + 7);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i);
  std::vector<float> dst(src.size());
  normalize_u8(src.data(), dst.data(), static_cast<int64_t>(src.size()), 0.5f, -1.f);
  for (size_t i = 0; i < src.size(); ++i) CHECK(dst[i] == static_cast<float>(src[i]) * 0.5f - 1.f);
}

static config::AugmentConfig no_aug() {
  config::AugmentConfig a;
  return a;
}

TEST_CASE("augment: identities and exact ops", "[augment]") {
  std::vector<float> img(28 * 28);
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<float>((i * 37) % 101) / 100.f;
  auto run = [&](config::AugmentConfig a, uint64_t key = 7) {
    std::vector<float> px = img;
    Augmenter(a, 1).sample(px.data(), 1, 28, 28, 0.5, key);
    return px;
  };
  auto a = no_aug();
  a.crop.p = 1;  // full-area, square crop at pixel centres = identity
  a.crop_scale = {1.0, 1.0};
  a.crop_ratio = {1.0, 1.0};
  auto out = run(a);
  for (size_t i = 0; i < img.size(); ++i) REQUIRE(out[i] == Approx(img[i]).margin(1e-5));
  a = no_aug();
  a.rotate.p = 1;
  a.rotate_degrees = 0;
  out = run(a);
  for (size_t i = 0; i < img.size(); ++i) REQUIRE(out[i] == Approx(img[i]).margin(1e-5));
  a = no_aug();
  a.flip.p = 1;
  out = run(a);
  for (int y = 0; y < 28; ++y)
    for (int x = 0; x < 28; ++x) REQUIRE(out[y * 28 + x] == img[y * 28 + 27 - x]);
  a = no_aug();
  a.erase.p = 1;
  out = run(a);
  int64_t zeroed = 0;
  for (size_t i = 0; i < img.size(); ++i) zeroed += (out[i] == 0.f && img[i] != 0.f);
  CHECK(zeroed >= 1);
  CHECK(zeroed <= static_cast<int64_t>(0.2 * 784 * 1.2) + 28);
  // Windows: an op outside its part of training does nothing.
  a = no_aug();
  a.flip.p = 1;
  a.flip.window = {0.7, 1.0};
  std::vector<float> px = img;
  CHECK_FALSE(Augmenter(a, 1).sample(px.data(), 1, 28, 28, /*progress=*/0.5, 7));
  CHECK(Augmenter(a, 1).sample(px.data(), 1, 28, 28, /*progress=*/0.8, 7));
  // Same key, same result; another key, another crop.
  a = no_aug();
  a.crop.p = 1;
  CHECK(run(a, 3) == run(a, 3));
  CHECK(run(a, 3) != run(a, 4));
}

TEST_CASE(
    "adaptive augmentation: the field guide's rule as written (from 0.1, the validation loss "
    "against the best so far), its accuracy reading, and the gap rule",
    "[augment]") {
  config::AugmentConfig c;
  c.adaptive = true;
  c.adaptive_rule = "guide";
  Augmenter w(c, 1);
  CHECK(w.strength() == Approx(0.1));  // starts gently
  w.adapt(0.9, 0.80, 0.60);            // first evaluation: the best so far, x 0.9
  CHECK(w.strength() == Approx(0.09));
  w.adapt(0.9, 0.80, 0.55);  // a new best loss: x 0.9
  CHECK(w.strength() == Approx(0.081));
  w.adapt(0.9, 0.85, 0.58);  // better accuracy, but the loss is worse than the best: x 1.1
  CHECK(w.strength() == Approx(0.0891));
  w.adapt(0.9, 0.70, 0.56);  // better than the previous evaluation, not than the best: x 1.1
  CHECK(w.strength() == Approx(0.09801));
  w.adapt(0.9, 0.70, 0.50);  // a new best: x 0.9
  CHECK(w.strength() == Approx(0.088209));
  CHECK(w.best_eval_loss() == Approx(0.50));
  Augmenter wr(c, 1);  // resume: the best loss is part of the state
  wr.set_strength(0.2), wr.set_best_eval_loss(0.5);
  wr.adapt(0.9, 0.9, 0.51);
  CHECK(wr.strength() == Approx(0.22));
  for (int i = 0; i < 40; ++i) wr.adapt(0.9, 0.9, 0.9);  // never better: capped at 0.5
  CHECK(wr.strength() == Approx(0.5));

  c.adaptive_rule = "guide_accuracy";
  Augmenter g(c, 1);
  CHECK(g.strength() == 0.5);  // this reading starts at the cap
  g.adapt(0.9, 0.80, 1.0);     // first evaluation: nothing to beat, x 1.1 capped at 0.5
  CHECK(g.strength() == Approx(0.5));
  g.adapt(0.9, 0.82, 1.0);  // improved: x 0.9
  CHECK(g.strength() == Approx(0.45));
  g.adapt(0.9, 0.84, 1.0);  // improved again: 0.405
  CHECK(g.strength() == Approx(0.405));
  g.adapt(0.9, 0.84, 1.0);  // not improved (equal): x 1.1 = 0.4455
  CHECK(g.strength() == Approx(0.4455));
  g.adapt(0.9, 0.83, 1.0);  // worse: x 1.1 = 0.49005
  CHECK(g.strength() == Approx(0.49005));
  g.adapt(0.9, 0.82, 1.0);  // worse: 0.539 capped at 0.5
  CHECK(g.strength() == Approx(0.5));
  // resume: the previous accuracy is part of the state
  Augmenter h(c, 1);
  h.set_strength(0.45), h.set_last_eval_accuracy(0.82);
  h.adapt(0.9, 0.83, 1.0);
  CHECK(h.strength() == Approx(0.405));
  // the gap rule: +step while train - eval > gap, else -step
  c.adaptive_rule = "gap";
  Augmenter a(c, 1);
  CHECK(a.strength() == 1.0);
  a.adapt(0.95, 0.90, 1.0);  // gap 0.05 > 0.02: +0.1, clamped at 1
  CHECK(a.strength() == 1.0);
  a.adapt(0.91, 0.90, 1.0);  // gap 0.01: -0.1
  CHECK(a.strength() == Approx(0.9));
}

TEST_CASE("three-phase curriculum: colour from 1/3 of training, mixup from 2/3", "[augment]") {
  config::AugmentConfig c;
  c.curriculum = "three_phase";
  c.color.p = 1.0;
  c.brightness = 0.5;
  c.flip.p = 1.0;
  Augmenter a(c, 3);
  auto changed = [&](double progress, uint64_t key) {
    std::vector<float> px(3 * 4 * 4);
    for (size_t i = 0; i < px.size(); ++i) px[i] = float(i % 7) / 7.f;
    const auto before = px;
    a.sample(px.data(), 3, 4, 4, progress, key);
    return px != before;
  };
  c.flip.p = 0.0;
  Augmenter colour_only(c, 3);
  auto colour_changed = [&](double progress) {
    std::vector<float> px(3 * 4 * 4, 0.5f);
    return colour_only.sample(px.data(), 3, 4, 4, progress, 7);
  };
  CHECK(changed(0.1, 1));            // flip: geometric, from the start
  CHECK_FALSE(colour_changed(0.3));  // colour: not before 1/3
  CHECK(colour_changed(0.34));
  CHECK(colour_changed(0.9));
  c.color.p = 0.0;
  c.mixup.p = 1.0;
  Augmenter mix(c, 3);
  auto x = torch::rand({4, 1, 2, 2});
  const auto y = torch::tensor({0, 1, 2, 3});
  auto early = x.clone(), late = x.clone();
  CHECK_FALSE(mix.batch(early, y, 0.6, 1).mixed);  // mixup: not before 2/3
  CHECK(torch::equal(early, x));
  CHECK(mix.batch(late, y, 0.7, 1).mixed);
}

TEST_CASE("augment: mixup is lam*x + (1-lam)*x[perm] and cutmix's lam is the kept area",
          "[augment]") {
  auto a = no_aug();
  a.mixup.p = 1;
  auto x = torch::randn({8, 1, 28, 28});
  auto y = torch::arange(8);
  auto x0 = x.clone();
  auto m = Augmenter(a, 1).batch(x, y, 0.5, 11);
  REQUIRE(m.mixed);
  CHECK(m.lam > 0);
  CHECK(m.lam < 1);
  auto partner = x0.index_select(0, m.y2);  // labels are indices here
  CHECK(torch::allclose(x, x0 * m.lam + partner * (1 - m.lam), 1e-5, 1e-5));
  a = no_aug();
  a.cutmix.p = 1;
  x = x0.clone();
  m = Augmenter(a, 1).batch(x, y, 0.5, 12);
  REQUIRE(m.mixed);
  const double kept = x.eq(x0).all(0).to(torch::kDouble).mean().item<double>();
  CHECK(m.lam == Approx(kept).margin(1e-9));
}

TEST_CASE("augmented batches do not depend on the worker count", "[augment][loader]") {
  auto ds = load_dataset(kFmnist + "/t10k-images-idx3-ubyte.gz",
                         kFmnist + "/t10k-labels-idx1-ubyte.gz", 10)
                .slice(0, 640);
  auto a = no_aug();
  a.crop.p = 1;
  a.flip.p = 0.5;
  a.rotate.p = 0.5;
  a.color.p = 0.5;
  a.erase.p = 0.5;
  a.mixup.p = 0.5;
  LoaderOptions o;
  o.batch_size = 64;
  o.seed = 3;
  o.mean = 0.3f;
  o.std = 0.3f;
  std::vector<std::vector<torch::Tensor>> runs;
  for (int64_t w : {0, 1, 3}) {
    o.workers = w;
    Loader l(ds, o);
    l.set_augmenter(std::make_shared<Augmenter>(a, 3), 100);
    runs.push_back(collect(l, 1));
    CHECK(l.augmented_samples() == 640);
    CHECK(l.augment_seconds() > 0);
  }
  for (size_t r = 1; r < runs.size(); ++r)
    for (size_t i = 0; i < runs[0].size(); ++i) CHECK(torch::equal(runs[r][i], runs[0][i]));
  o.workers = 0;
  Loader plain(ds, o);
  CHECK_FALSE(torch::equal(collect(plain, 1)[0], runs[0][0]));  // augmentation did change the batch
}

// A .npy whose payload is given (little-endian values), unlike npy_bytes' filler.
template <class T>
static std::string npy_of(const std::string& descr, const std::string& shape,
                          const std::vector<T>& values) {
  std::string s = npy_bytes(descr, shape, 0);
  s.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  return s;
}

TEST_CASE("float and multi-hot targets: shapes, values and the batches they make", "[dataset]") {
  auto x = put("tx.npy", npy_of<float>("<f4", "(4, 3)", std::vector<float>(12, 0.5f)));
  auto y = put("ty.npy", npy_of<double>("<f8", "(4, 2)", {1, 2, 3, 4, 5, 6, 7, 8}));
  const Dataset reg = load_dataset(x, y, TargetSpec{TargetKind::kFloat, 0});
  CHECK(reg.float_targets());
  CHECK(reg.target_shape == std::vector<int64_t>{2});
  CHECK(reg.target(2)[1] == 6.0f);
  Loader l(reg, {.batch_size = 3, .shuffle = false, .drop_last = false});
  l.start_epoch(0);
  Batch b;
  REQUIRE(l.next(b));
  CHECK(b.y.dtype() == torch::kFloat32);
  CHECK(b.y.sizes() == torch::IntArrayRef({3, 2}));
  CHECK(b.y[1][0].item<float>() == 3.0f);
  REQUIRE(l.next(b));
  CHECK(b.y.sizes() == torch::IntArrayRef({1, 2}));  // the short last batch keeps its sample
  CHECK(b.y[0][1].item<float>() == 8.0f);
  // kAuto: a 1-D integer file is class ids, anything else float values.
  auto ids = put("tid.npy", npy_of<int64_t>("<i8", "(4,)", {0, 1, 2, 1}));
  CHECK_FALSE(load_dataset(x, ids, TargetSpec{TargetKind::kAuto, 3}).float_targets());
  CHECK(load_dataset(x, y, TargetSpec{TargetKind::kAuto, 3}).float_targets());

  const std::pair<std::string, const char*> rows[] = {
      {npy_of<float>("<f4", "(3, 2)", {1, 2, 3, 4, 5, 6}), "targets 3x2 for 4 samples"},
      {npy_of<float>("<f4", "(4,)", {1, NAN, 3, 4}), "target at sample 1, element 0 is not finite"},
  };
  for (const auto& [bytes, why] : rows) {
    INFO(why);
    auto p = put("badt.npy", bytes);
    CHECK_THAT(data_error([&] {
                 load_dataset(x, p, TargetSpec{TargetKind::kFloat, 0});
               }),
               Catch::Contains(why));
  }
  auto hot = put("hot.npy", npy_of<float>("<f4", "(4, 2)", {1, 0, 0, 1, 1, 1, 0, 2}));
  CHECK_THAT(data_error([&] {
               load_dataset(x, hot, TargetSpec{TargetKind::kMultiHot, 2});
             }),
             Catch::Contains("multilabel target at sample 3, element 1 is 2"));
  CHECK_THAT(data_error([&] {
               load_dataset(x, y, TargetSpec{TargetKind::kMultiHot, 3});
             }),
             Catch::Contains("[N, num_classes] = [N, 3], got 4x2"));
}

TEST_CASE("token streams: windows shifted by one, vocabulary and length checked", "[tokens]") {
  std::vector<uint16_t> t(41);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>(i * 7 % 50);
  const auto bin = tmpdir() / "tok";
  fs::create_directories(bin);
  std::ofstream(bin / "train.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * 2));
  const Dataset d = load_tokens((bin / "train.bin").string(), 8, 0);
  CHECK(d.token_windows);
  CHECK(d.count == 5);         // (41 - 1) / 8 non-overlapping windows of 8 + 1 tokens
  CHECK(d.num_classes == 50);  // no meta.json: the largest id + 1
  Loader l(d, {.batch_size = 2, .shuffle = true, .seed = 3});
  l.start_epoch(1);
  Batch b;
  REQUIRE(l.next(b));
  REQUIRE(b.x.dtype() == torch::kInt64);
  REQUIRE(b.x.sizes() == torch::IntArrayRef({2, 8}));
  const auto order = epoch_order(5, 3, 1, 0, 1, true);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t j = 0; j < 8; ++j) {
      const int64_t at = order[r] * 8 + j;
      CHECK(b.x[r][j].item<int64_t>() == t[at]);
      CHECK(b.y[r][j].item<int64_t>() == t[at + 1]);
    }
  // The same from a .npy of uint32 tokens.
  std::vector<uint32_t> t32(t.begin(), t.end());
  const Dataset n = load_tokens(put("tok.npy", npy_of<uint32_t>("<u4", "(41,)", t32)), 8, 64);
  CHECK(n.num_classes == 64);
  CHECK(n.token(4, 8) == t[40]);

  std::ofstream(bin / "meta.json") << R"({"dtype": "uint16", "vocab_size": 30})";
  CHECK_THAT(
      data_error([&] { load_tokens((bin / "train.bin").string(), 8, 0); }),
      Catch::Contains("token 35 at offset 5 (token index) is outside the vocabulary [0, 30)"));
  CHECK_THAT(data_error([&] { load_tokens((bin / "train.bin").string(), 41, 64); }),
             Catch::Contains("holds 41 tokens, shorter than one window of 42"));
  std::ofstream(bin / "meta.json") << R"({"dtype": "uint32"})";  // 82 bytes are not whole uint32s
  CHECK_THAT(data_error([&] { load_tokens((bin / "train.bin").string(), 8, 0); }),
             Catch::Contains("not a whole number of uint32 tokens"));
  std::ofstream(bin / "meta.json") << R"({"dtype": "float16"})";
  CHECK_THAT(data_error([&] { load_tokens((bin / "train.bin").string(), 8, 0); }),
             Catch::Contains("token dtype 'float16' is not supported"));
  CHECK_THAT(data_error([&] { load_tokens(put("f.npy", npy_bytes("<f4", "(64,)", 256)), 8, 0); }),
             Catch::Contains("tokens must be integers, got f32"));
}

TEST_CASE("tokenize --bytes: the text's bytes, split train/val, with meta.json", "[tokens]") {
  const auto src = tmpdir() / "text.txt";
  std::ofstream(src) << "hello, world\n";
  const auto out = tmpdir() / "tokens_out";
  const auto r = tokenize_bytes({src.string(), src.string()}, out.string(), 0.25);
  CHECK(r.train_tokens + r.val_tokens == 26);
  CHECK(r.val_tokens == 6);
  const Dataset d = load_tokens((out / "train.bin").string(), 4, 0);
  CHECK(d.num_classes == 256);  // from meta.json
  CHECK(d.token(0, 0) == 'h');
  CHECK(d.token(1, 2) == ' ');  // "hello, world": byte 6
  CHECK_THAT(
      data_error([&] { tokenize_bytes({(tmpdir() / "absent").string()}, out.string(), 0.1); }),
      Catch::Contains("cannot open"));
}

TEST_CASE("k-fold split: disjoint folds covering the data, pure in the seed; gather copies rows",
          "[folds]") {
  using mltrain::data::kfold_split;
  const int64_t n = 103, k = 4;
  std::vector<int> covered(n, 0);
  for (int64_t f = 0; f < k; ++f) {
    const auto [tr, va] = kfold_split(n, k, f, 7);
    CHECK(int64_t(tr.size() + va.size()) == n);
    CHECK((va.size() == 25 || va.size() == 26));  // near-equal parts of 103
    CHECK(std::is_sorted(va.begin(), va.end()));
    std::vector<int> in_train(n, 0);
    for (auto i : tr) in_train[size_t(i)] = 1;
    for (auto i : va) {
      CHECK(in_train[size_t(i)] == 0);  // a validation sample is never trained on
      ++covered[size_t(i)];
    }
    CHECK(kfold_split(n, k, f, 7) == kfold_split(n, k, f, 7));
  }
  for (int c : covered) CHECK(c == 1);  // every sample validated exactly once
  CHECK(kfold_split(n, k, 0, 7).second != kfold_split(n, k, 0, 8).second);
  // Not the identity order: a shuffled permutation (sorted samples would put fold 0 at 0..25).
  CHECK(kfold_split(n, k, 0, 7).second.back() > 30);

  mltrain::data::Dataset d;
  auto bytes = std::make_shared<std::vector<uint8_t>>();
  for (int i = 0; i < 6; ++i) bytes->insert(bytes->end(), {uint8_t(i), uint8_t(10 + i)});
  d.data = bytes->data(), d.storage = bytes, d.count = 6, d.sample_shape = {2};
  d.labels = std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  d.num_classes = 6;
  const auto g = d.slice(1, 6).gather({3, 0});  // samples 4 and 1 of the whole set
  REQUIRE(g.count == 2);
  CHECK(g.sample(0)[0] == 4);
  CHECK(g.sample(0)[1] == 14);
  CHECK(g.label(0) == 4);
  CHECK(g.sample(1)[0] == 1);
  CHECK(g.label(1) == 1);
}

TEST_CASE(
    "data.workers auto: min(cores, 4 x GPUs, chunks) per node, shared among the node's local "
    "ranks, at least 1 each",
    "[loader][workers]") {
  CHECK(auto_workers(2) == 2);               // this VM, one process
  CHECK(auto_workers(2, 0, 0, 2) == 1);      // two ranks share its two cores
  CHECK(auto_workers(64) == 64);             // a CPU node
  CHECK(auto_workers(64, 0, 0, 8) == 8);     // eight ranks on it
  CHECK(auto_workers(64, 8) == 32);          // 8 GPUs: 4 each bound the node's workers
  CHECK(auto_workers(64, 8, 0, 8) == 4);     // one rank per GPU: 4 each (was 1 per rank)
  CHECK(auto_workers(16, 8, 0, 8) == 2);     // fewer cores than 4 x GPUs: the cores bound it
  CHECK(auto_workers(64, 8, 12, 8) == 1);    // a set of 12 chunks: 12 for the node, 1 each
  CHECK(auto_workers(64, 0, 100, 4) == 16);  // more chunks than cores: the cores bound it
  CHECK(auto_workers(0, 0, 0, 3) == 1);      // never 0 workers
  CHECK(auto_workers(4, 0, 0, 0) == 4);      // a local size of 0 counts as 1
}
