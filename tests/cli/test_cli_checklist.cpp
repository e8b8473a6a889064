// `mltrain checklist`.
#include "cli_support.hpp"

TEST_CASE("checklist: every item has a status, SKIPs say why, FAIL exits 4", "[cli][checklist]") {
  const auto d = tmpdir("checklist");
  auto r = run("checklist " + kSrc + "/configs/fashion_mnist_cnn.yaml run.dir=" + d.string() +
               " --json");
  INFO(r.out);
  REQUIRE(r.code == 0);  // this machine: no FAIL
  auto j = json_of(r.out);
  std::set<std::string> ids;
  for (const auto& it : j["items"]) {
    INFO(it.dump());
    const std::string st = it["status"];
    CHECK((st == "PASS" || st == "WARN" || st == "FAIL" || st == "SKIP"));
    CHECK(!it["why"].get<std::string>().empty());
    if (st == "SKIP")
      CHECK(!it["fix"].get<std::string>().empty());  // the reason
    else
      CHECK(!it["measured"].get<std::string>().empty());
    ids.insert(it["id"].get<std::string>());
  }
  for (const char* id :
       {"data.read_bandwidth", "data.loader_rate", "data.augmentation_cost", "data.pinned_copy",
        "compute.gemm", "compute.cudnn_benchmark", "compute.autocast_coverage", "compute.fusion",
        "system.swappiness", "system.transparent_hugepages", "system.cpu_governor",
        "system.threads", "system.allocator", "system.numa", "system.open_files",
        "system.disk_space", "gpu.versions", "gpu.nccl_allreduce"})
    CHECK(ids.count(id) == 1);
  for (const auto& it : j["items"]) {
    if (it["id"] == "compute.fusion")
      CHECK(it["value"]["conv_bn_pairs"] == 2);  // conv1/bn1, conv2/bn2
    if (it["id"] == "compute.autocast_coverage") {
      CHECK(it["measured"].get<std::string>().find("aten::conv2d") != std::string::npos);
      // Whether bf16 pays on this CPU, read from /proc/cpuinfo as the item must.
      std::ifstream cpuinfo("/proc/cpuinfo");
      const std::string info((std::istreambuf_iterator<char>(cpuinfo)), {});
      const bool native = info.find(" avx512_bf16") != std::string::npos ||
                          info.find(" amx_bf16") != std::string::npos;
      CHECK(it["value"]["native_bf16"] == native);
      CHECK(it["measured"].get<std::string>().find(native ? "this CPU has native bf16"
                                                          : "this CPU has no native bf16") !=
            std::string::npos);
    }
  }

  // Over-subscribed threads and a checkpoint budget no disk holds: FAIL, exit 4, named in the text.
  r = run("checklist " + kSrc + "/configs/fashion_mnist_cnn.yaml run.dir=" + d.string() +
          " runtime.threads=64 checkpoint.keep_last=10000000");
  CHECK(r.code == 4);
  CHECK(r.out.find("FAIL system.threads") != std::string::npos);
  CHECK(r.out.find("FAIL system.disk_space") != std::string::npos);
  // Without a config the pipeline items are skipped with the reason.
  r = run("checklist --level quick");
  CHECK(r.code == 0);
  CHECK(r.out.find("SKIP data.loader_rate: skipped: no config given") != std::string::npos);
  CHECK(run("checklist --level fastest").code == 2);
}
