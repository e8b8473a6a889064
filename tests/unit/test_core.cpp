// core: the oneDNN kernel route against LibTorch's kernels, SHA-256 against FIPS 180-4, files,
// Slurm time limits.
#include <catch2/catch.hpp>

#include "temp_dir.hpp"

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/process.hpp"
#include "mltrain/runtime/runtime.hpp"
#include "mltrain/core/sha256.hpp"

using namespace mltrain;

TEST_CASE(
    "kernel route: oneDNN sgemm matches LibTorch's kernel for mm/addmm/linear and their gradients",
    "[route]") {
  torch::manual_seed(1);
  struct Shape {
    int64_t m, k, n;
  };
  for (auto s : {Shape{128, 784, 512}, Shape{7, 3, 5}, Shape{1, 64, 1}, Shape{33, 1, 17}}) {
    INFO(s.m << "x" << s.k << "x" << s.n);
    auto a = torch::randn({s.m, s.k}), b = torch::randn({s.k, s.n}), bias = torch::randn({s.n});
    auto w = torch::randn({s.n, s.k}, torch::requires_grad());
    auto x = torch::randn({s.m, s.k}, torch::requires_grad());
    runtime::set_kernel_route("native");
    auto mm_ref = torch::mm(a, b), addmm_ref = torch::addmm(bias, a, b, 0.5, 2.0);
    auto mmT_ref = torch::mm(b.t(), a.t());  // transposed views: no copy on the fast path
    auto y_ref = torch::nn::functional::linear(x, w, bias);
    y_ref.sum().backward();
    auto gw_ref = w.grad().clone(), gx_ref = x.grad().clone();
    w.mutable_grad() = torch::Tensor();
    x.mutable_grad() = torch::Tensor();
    runtime::set_kernel_route("onednn");
    REQUIRE(runtime::kernel_route() == "onednn");
    const double tol = 1e-4 * std::sqrt(double(s.k));
    CHECK(torch::allclose(torch::mm(a, b), mm_ref, tol, tol));
    CHECK(torch::allclose(torch::addmm(bias, a, b, 0.5, 2.0), addmm_ref, tol, tol));
    CHECK(torch::allclose(torch::mm(b.t(), a.t()), mmT_ref, tol, tol));
    auto y = torch::nn::functional::linear(x, w, bias);
    CHECK(torch::allclose(y, y_ref, tol, tol));
    y.sum().backward();
    CHECK(torch::allclose(w.grad(), gw_ref, tol * 10, tol * 10));
    CHECK(torch::allclose(x.grad(), gx_ref, tol * 10, tol * 10));
    // out= and in-place variants, and dtypes the fast path leaves to LibTorch.
    auto out = torch::empty({0});
    torch::mm_out(out, a, b);
    CHECK(torch::allclose(out, mm_ref, tol, tol));
    auto c = addmm_ref.clone();
    c.addmm_(a, b);
    CHECK(torch::allclose(c, addmm_ref + mm_ref, tol * 4, tol * 4));
    auto ad = a.to(torch::kDouble), bd = b.to(torch::kDouble);
    CHECK(torch::allclose(torch::mm(ad, bd), mm_ref.to(torch::kDouble), tol, tol));
  }
  // beta = 0 ignores NaNs in self, as LibTorch does.
  auto nan_self = torch::full({2, 2}, NAN);
  auto r = torch::addmm(nan_self, torch::eye(2), torch::eye(2), /*beta=*/0, /*alpha=*/1);
  CHECK(torch::equal(r, torch::eye(2)));
  CHECK_THROWS_AS(runtime::set_kernel_route("mkl"), ConfigError);
}

TEST_CASE("runtime::parallel_for runs on LibTorch's intra-op threads and covers the range once",
          "[runtime]") {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  std::vector<int> seen(1000, 0), thread_of(1000, -1);
  runtime::parallel_for(0, 1000, 10, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) ++seen[i], thread_of[i] = at::get_thread_num();
  });
  at::set_num_threads(threads);
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  // Two threads took part (compiled without OpenMP, ATen's inline loop used only the caller's).
  CHECK(std::set<int>(thread_of.begin(), thread_of.end()) == std::set<int>{0, 1});
}

TEST_CASE("kernel route: batched matmul (attention) matches LibTorch's bmm, views and gradients",
          "[route]") {
  torch::manual_seed(2);
  // q @ k^T and att @ v as multi-head attention computes them: [B, heads, T, hs] views.
  auto q = torch::randn({3, 4, 16, 8}, torch::requires_grad());
  auto k = torch::randn({3, 4, 16, 8}, torch::requires_grad());
  auto v = torch::randn({3, 16, 4, 8}).transpose(1, 2).detach().requires_grad_(true);
  auto run = [&] {
    auto att = torch::softmax(torch::matmul(q, k.transpose(-2, -1)), -1);
    auto y = torch::matmul(att, v);
    y.pow(2).sum().backward();
    std::vector<torch::Tensor> out = {y.detach(), q.grad().clone(), k.grad().clone(),
                                      v.grad().clone()};
    for (auto* t : {&q, &k, &v}) t->mutable_grad() = torch::Tensor();
    return out;
  };
  runtime::set_kernel_route("native");
  const auto ref = run();
  auto a = torch::randn({5, 7, 3}), b = torch::randn({5, 3, 2});
  const auto bmm_ref = torch::bmm(a, b),
             bmm_t_ref = torch::bmm(b.transpose(1, 2), a.transpose(1, 2));
  runtime::set_kernel_route("onednn");
  const auto got = run();
  for (size_t i = 0; i < ref.size(); ++i) {
    INFO("tensor " << i);
    CHECK(torch::allclose(got[i], ref[i], 1e-4, 1e-4));
  }
  CHECK(torch::allclose(torch::bmm(a, b), bmm_ref, 1e-5, 1e-5));
  CHECK(torch::allclose(torch::bmm(b.transpose(1, 2), a.transpose(1, 2)), bmm_t_ref, 1e-5, 1e-5));
  auto out = torch::empty({0});
  torch::bmm_out(out, a, b);
  CHECK(torch::allclose(out, bmm_ref, 1e-5, 1e-5));
  // Odd strides (a sliced last dimension) and doubles go to LibTorch's kernel, same result.
  auto wide = torch::randn({5, 7, 6});
  CHECK(torch::allclose(torch::bmm(wide.slice(2, 0, 6, 2), b),
                        torch::bmm(wide.slice(2, 0, 6, 2).contiguous(), b), 1e-5, 1e-5));
  CHECK(torch::allclose(torch::bmm(a.to(torch::kDouble), b.to(torch::kDouble)),
                        bmm_ref.to(torch::kDouble), 1e-5, 1e-5));
}

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

TEST_CASE("slurm_time_seconds reads sbatch's --time formats and refuses what sbatch refuses",
          "[core][slurm]") {
  // Seconds by Slurm's rule: the fields added as they are; 0, UNLIMITED, INFINITE, -1: no limit.
  // tests/cli/test_cli_slurm.cpp gives the same strings to a real sbatch.
  const std::vector<std::pair<std::string, long long>> taken = {
      {"90", 5400},     {"90:30", 5430},     {"01:00:00", 3600},     {"99:99:99", 362439},
      {"2-12", 216000}, {"2-12:30", 217800}, {"2-12:30:15", 217815}, {"1-", 86400},
      {"0", 0},         {"UNLIMITED", 0},    {"infinite", 0},        {"-1", 0}};
  for (const auto& [t, s] : taken) {
    INFO(t);
    REQUIRE(slurm_time_seconds(t));
    CHECK(*slurm_time_seconds(t) == s);
  }
  for (const std::string t :
       {"", "4h", "1:2:3:4", "12:", ":30", "1-2-3", "-5", "1 :00", "1.5", "1-2:3:4:5", "-"}) {
    INFO("'" << t << "'");
    CHECK_FALSE(slurm_time_seconds(t));
  }
  // The checkpoint signal comes signal_lead_s before the limit: the limit must be longer.
  CHECK_NOTHROW(check_slurm_time("--time", "00:01:31", 90));
  CHECK_NOTHROW(check_slurm_time("--time", "UNLIMITED", 90));
  CHECK_NOTHROW(check_slurm_time("--time", "1", 0));
  for (const std::string t : {"00:01:30", "1", "4h"}) {
    INFO(t);
    try {
      check_slurm_time("--time", t, 90);
      FAIL("accepted");
    } catch (const ConfigError& e) {
      CHECK(e.exit_code() == 2);
      CHECK(std::string(e.what()).rfind("--time: '" + t + "'", 0) == 0);
    }
  }
}
