// External torchrun running the same binary.
#include "cli_support.hpp"

TEST_CASE(
    "external torchrun runs the same binary: one node, two nodes, rank 0's own TCPStore, a "
    "restart; every layout ends with "
    "mltrain launch's weights",
    "[cli][dist][torchrun]") {
  const auto d = tmpdir("torchrun");
  const std::string cfg =
      kSrc +
      "/configs/fashion_mnist_mlp.yaml data.limit_train=4096 data.batch_size=64 train.duration=1ep "
      "model.dropout=0 runtime.threads=1 run.dir=" +
      d.string();
  const std::string train = kBin + " train " + cfg;
  auto digest = [&](const std::string& tag) {
    ::setenv("MLTRAIN_TEST_PARAM_DIGEST", (d / tag).c_str(), 1);
  };
  // The venv's torchrun (torch 2.15), the one a user of this checkout has. -r 1 -t 1: redirect and
  // tee each worker's output, as with torch 1.13 (whose defaults crashed on Python 3.11).
  const std::string torchrun =
      "cd " + d.string() + " && " + kSrc + "/.venv/bin/torchrun -r 1 -t 1 ";
  const std::string in_dir = "cd " + d.string() + " && ";

  digest("launch");
  auto ref = run("launch --nproc-per-node 2 -- mltrain train " + cfg + " run.name=launch");
  REQUIRE(ref.code == 0);
  const auto want = lines_of(d / "launch.0");
  REQUIRE(want.size() == 32);
  CHECK(lines_of(d / "launch.1") == want);

  // 1. One node, two workers: every rank a client of torchrun's own store.
  digest("one");
  auto one = sh(torchrun + "--nproc_per_node 2 --master_port " + std::to_string(free_ports()) +
                " --no_python " + train + " run.name=one");
  INFO(one.out);
  REQUIRE(one.code == 0);
  CHECK(one.out.find(
            "rank 0/2 (local 0/2, node 0/1, torchrun) joined Gloo over torchrun's TCPStore") !=
        std::string::npos);
  CHECK(lines_of(d / "one.0") == want);
  CHECK(lines_of(d / "one.1") == want);

  // 2. Two "nodes" on this host (two agents, --nnodes 2): the multi-node path, one worker each.
  digest("two");
  const std::string agent =
      kSrc + "/.venv/bin/torchrun -r 1 -t 1 --nnodes 2 --nproc_per_node 1 --master_addr " +
      "127.0.0.1 --master_port " + std::to_string(free_ports()) + " ";
  auto two = sh(in_dir + "{ " + agent + "--node_rank 1 --no_python " + train +
                " run.name=two > node1.log 2>&1 & " + agent + "--node_rank 0 --no_python " + train +
                " run.name=two; rc=$?; wait; exit $rc; }");
  INFO(two.out << slurp(d / "node1.log"));
  REQUIRE(two.code == 0);
  CHECK(two.out.find(
            "rank 0/2 (local 0/1, node 0/2, torchrun) joined Gloo over torchrun's TCPStore") !=
        std::string::npos);
  CHECK(lines_of(d / "two.0") == want);

  // 3. No agent (hand-set variables, two nodes): rank 0 serves the TCPStore and warns about it.
  digest("tcp");
  const std::string tcp_port = std::to_string(free_ports());
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + tcp_port +
                          " WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 LOCAL_RANK=0 ";
  auto tcp =
      sh(in_dir + "{ " + env + "RANK=1 GROUP_RANK=1 " + train + " run.name=tcp > tcp1.log 2>&1 & " +
         env + "RANK=0 GROUP_RANK=0 " + train + " run.name=tcp; rc=$?; wait; exit $rc; }");
  INFO(tcp.out);
  REQUIRE(tcp.code == 0);
  CHECK(tcp.out.find("TCPStore on 127.0.0.1:" + tcp_port +
                     ": the port is unauthenticated and open on all interfaces") !=
        std::string::npos);
  CHECK(tcp.out.find("(local 0/1, node 0/2, torchrun) joined Gloo over TCPStore") !=
        std::string::npos);
  CHECK(lines_of(d / "tcp.0") == want);
  ::unsetenv("MLTRAIN_TEST_PARAM_DIGEST");

  // 4. torchrun's restarts: rank 1 SIGKILLed at step 20; the new attempt resumes from the checkpoint.
  ::setenv("MLTRAIN_TEST_KILL", "1:20", 1);
  const std::string longer =
      train + " train.duration=2ep checkpoint.every=8u distributed.timeout_s=30";
  auto restart = sh(torchrun + "--nproc_per_node 2 --master_port " + std::to_string(free_ports()) +
                    " --max_restarts 1 --no_python " + longer + " run.name=restart");
  INFO(restart.out);
  CHECK(restart.code == 0);
  CHECK(restart.out.find("resuming in") != std::string::npos);
  CHECK(restart.out.find("after 64 steps") != std::string::npos);
  // Without restarts torchrun fails, and its summary carries the survivor's own message (TORCHELASTIC_ERROR_FILE).
  auto fail = sh(torchrun + "--nproc_per_node 2 --master_port " + std::to_string(free_ports()) +
                 " --max_restarts 0 --no_python " + longer + " run.name=fail");
  ::unsetenv("MLTRAIN_TEST_KILL");
  INFO(fail.out);
  CHECK(fail.code != 0);
  CHECK(fail.out.find("traceback : mltrain: distributed: rank 0: ") != std::string::npos);
  CHECK(fail.out.find("missing: rank 1 (host ") != std::string::npos);
}
