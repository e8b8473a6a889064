// core: SHA-256 against FIPS 180-4, files, the runtime report.
#include <catch2/catch.hpp>

#include "temp_dir.hpp"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/runtime.hpp"
#include "mltrain/core/sha256.hpp"

using namespace mltrain;

TEST_CASE("SHA-256 matches FIPS 180-4 test vectors", "[sha256]") {
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 h;  // streaming in odd chunk sizes equals one shot
  std::string million(1000000, 'a');
  for (size_t i = 0; i < million.size(); i += 333)
    h.update(million.data() + i, std::min<size_t>(333, million.size() - i));
  CHECK(h.hex() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("remove_tree removes a folder tree like rm -r, links as links, and reports errors",
          "[fs]") {
  namespace fs = std::filesystem;
  const auto d = mltrain::testing::fresh_temp_dir("remove_tree");
  const fs::path outside = d / "outside.txt";
  std::ofstream(outside) << "keep me";
  const fs::path tree = d / "step_12";
  fs::create_directories(tree / "a" / "b");
  std::ofstream(tree / "model.safetensors") << "x";
  std::ofstream(tree / "a" / "b" / "deep.bin") << "y";
  fs::create_symlink(outside, tree / "link_to_file");
  fs::create_directory_symlink(d, tree / "a" / "link_to_parent");  // must not be followed
  // 7 entries: model.safetensors, a, a/b, a/b/deep.bin, two links, and the folder itself
  CHECK(mltrain::remove_tree(tree) == 7);
  CHECK(!fs::exists(tree));
  CHECK(fs::exists(outside));  // a link's target is left alone
  CHECK(fs::exists(d));

  std::error_code ec;
  CHECK(mltrain::remove_tree(d / "missing", ec) == 0);  // nothing there: not an error
  CHECK(!ec);
  CHECK(mltrain::remove_tree(outside) == 1);  // a plain file
  CHECK(!fs::exists(outside));
  std::ofstream(d / "file") << "z";
  CHECK(mltrain::remove_tree(d / "file" / "below", ec) == 0);  // a file is not a folder
  CHECK(ec == std::errc::not_a_directory);
  CHECK_THROWS_AS(mltrain::remove_tree(d / "file" / "below"), fs::filesystem_error);
}
