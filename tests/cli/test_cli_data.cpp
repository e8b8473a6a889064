// `mltrain data convert` / `inspect`, and training from the shard.
#include "cli_support.hpp"

TEST_CASE("data convert / inspect, and training from the shard", "[cli][shard]") {
  auto d = tmpdir("shard");
  auto c = run("data convert --images " + kFmnist + "/t10k-images-idx3-ubyte.gz --labels " +
               kFmnist + "/t10k-labels-idx1-ubyte.gz -o " + (d / "test.shard").string());
  REQUIRE(c.code == 0);
  auto i = run("data inspect " + (d / "test.shard").string());
  CHECK(i.code == 0);
  CHECK_THAT(i.out, Catch::Contains("10000 samples, dtype u8, sample shape [1,28,28]"));
  CHECK_THAT(i.out, Catch::Contains("labels: 0:1000 1:1000"));
  auto t = run("train " + kSrc + "/configs/fashion_mnist_mlp.yaml run.dir=" + d.string() +
               " data.dataset=files data.train_images=" + (d / "test.shard").string() +
               " data.test_images=" + (d / "test.shard").string() + " train.duration=20u");
  CHECK(t.code == 0);
  auto bad = run("data inspect " + (d / "nope.shard").string());
  CHECK(bad.code == 3);
}
