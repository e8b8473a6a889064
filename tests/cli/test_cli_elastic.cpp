// Elastic training: a world that changes size between attempts (the rest of the epoch re-sharded),
// and `mltrain launch --nnodes MIN:MAX`, rounds of a rendezvous that nodes leave and join.
#include "cli_support.hpp"

#include <algorithm>

// The samples each rank consumed, from MLTRAIN_TEST_SAMPLES files: every index on lines whose
// step is at most `upto` (the checkpoint a resumed run started from; later lines were redone).
static std::vector<int64_t> consumed(const fs::path& prefix, int ranks, int64_t upto) {
  std::vector<int64_t> ids;
  for (int r = 0; r < ranks; ++r)
    for (const auto& line : lines_of(prefix.string() + "." + std::to_string(r))) {
      std::istringstream in(line);
      int64_t step = 0, id = 0;
      in >> step;
      if (step > upto) continue;
      while (in >> id) ids.push_back(id);
    }
  return ids;
}

TEST_CASE(
    "a world that changes size: a 2-rank run killed mid-epoch resumes on 1 and on 3 ranks, and "
    "every sample of the epoch is consumed exactly once",
    "[cli][dist][elastic]") {
  const auto d = tmpdir("reshard");
  // 3968 samples, 32 per rank: 62 steps of 2 x 32; killed at step 10, resumed from step 8 (512
  // samples consumed), the other 3456 fill 108 batches on one rank or 36 on each of three.
  const std::string common = kSrc +
                             "/configs/fashion_mnist_mlp.yaml data.limit_train=3968 "
                             "data.batch_size=32 train.duration=1ep checkpoint.every=4u "
                             "runtime.threads=1 distributed.timeout_s=60 run.dir=" +
                             d.string();
  std::vector<int64_t> epoch(3968);
  for (int64_t i = 0; i < 3968; ++i) epoch[size_t(i)] = i;
  for (const int world : {1, 3}) {
    const std::string name = "to" + std::to_string(world);
    ScopedEnv env1({{"MLTRAIN_TEST_SAMPLES", (d / (name + ".a")).c_str()}});
    ScopedEnv env2({{"MLTRAIN_TEST_KILL", "1:10"}});
    auto killed = run("launch --nproc-per-node 2 -- mltrain train " + common + " run.name=" + name);
    env2.restore();
    INFO(killed.out);
    REQUIRE(killed.code != 0);
    ScopedEnv env3({{"MLTRAIN_TEST_SAMPLES", (d / (name + ".b")).c_str()}});
    auto resumed = run("launch --nproc-per-node " + std::to_string(world) + " -- mltrain train " +
                       common + " run.name=" + name + " distributed.rewarm=20u");
    env3.restore();
    env1.restore();
    INFO(resumed.out);
    REQUIRE(resumed.code == 0);
    CHECK(resumed.out.find("(step 8, epoch 0, batch 0)") != std::string::npos);
    CHECK(resumed.out.find("world 2 -> " + std::to_string(world) +
                           " ranks (batch 32 -> 32): epoch 0 resumes after 512 of its samples, "
                           "the other 3456 re-sharded over " +
                           std::to_string(world) + " ranks (" + std::to_string(3456 / 32 / world) +
                           " batches each); the run now ends "
                           "at step " +
                           std::to_string(8 + 3456 / 32 / world)) != std::string::npos);
    CHECK(resumed.out.find("re-warming the learning rate over 20 steps after the restart") !=
          std::string::npos);
    CHECK(resumed.out.find("after " + std::to_string(8 + 3456 / 32 / world) + " steps") !=
          std::string::npos);
    auto ids = consumed(d / (name + ".a"), 2, 8);
    REQUIRE(ids.size() == 512);
    const auto rest = consumed(d / (name + ".b"), world, 1 << 30);
    ids.insert(ids.end(), rest.begin(), rest.end());
    std::sort(ids.begin(), ids.end());
    CHECK(ids == epoch);  // the multiset of samples across the interruption is the epoch
  }
}

namespace {
// A launcher of an elastic job on this host, its output in `log`.
pid_t elastic_node(const fs::path& log, int port, const std::string& nnodes,
                   const std::string& train_args, const std::string& extra = "") {
  std::vector<std::string> args = {kBin,
                                   "launch",
                                   "--nnodes",
                                   nnodes,
                                   "--nproc-per-node",
                                   "1",
                                   "--master-addr",
                                   "127.0.0.1",
                                   "--master-port",
                                   std::to_string(port),
                                   "--rdzv-last-call",
                                   "3",
                                   "--rdzv-join-timeout",
                                   "120",
                                   "--max-restarts",
                                   "3",
                                   "--grace",
                                   "20"};
  std::istringstream more(extra);
  for (std::string a; more >> a;) args.push_back(a);
  args.insert(args.end(), {"--", "mltrain", "train"});
  std::istringstream in(train_args);
  for (std::string a; in >> a;) args.push_back(a);
  return spawn(args, log);
}

bool log_has(const fs::path& log, const std::string& text) {
  return slurp(log).find(text) != std::string::npos;
}

// The elastic runs' MLP in distributed.invariance: bitwise: a global batch of 96 in 12 shards,
// so the rounds of 2 and 3 nodes train the weights one process does.
std::string bitwise_mlp(const fs::path& d) {
  return kSrc +
         "/configs/fashion_mnist_mlp.yaml data.limit_train=12288 train.global_batch=96 "
         "data.batch_size=auto distributed.invariance=bitwise train.duration=2ep "
         "checkpoint.every=8u distributed.timeout_s=30 run.dir=" +
         d.string();
}

std::pair<std::string, std::string> one_process_digests(const fs::path& d) {
  const auto r = run("train " + bitwise_mlp(d) + " run.name=one_process");
  INFO(r.out);
  REQUIRE(r.code == 0);
  return final_digests(d / "one_process");
}
}  // namespace

TEST_CASE(
    "elastic launch, --nnodes 2:3: three launchers train; one killed for good, the other two "
    "finish in a world of two, in the bytes of one process (distributed.invariance: bitwise)",
    "[cli][dist][elastic][invariance]") {
  const auto d = tmpdir("elastic_kill");
  const int port = free_ports();
  const std::string train = bitwise_mlp(d) + " run.name=kill";
  const fs::path log0 = d / "node0.log", log1 = d / "node1.log", log2 = d / "node2.log";
  const pid_t n0 = elastic_node(log0, port, "2:3", train);
  // The first launcher serves the store; the one killed later must not be it.
  REQUIRE(wait_for([&] { return log_has(log0, "rendezvous store serving at 127.0.0.1"); }, 60));
  const pid_t n1 = elastic_node(log1, port, "2:3", train);
  const pid_t n2 = elastic_node(log2, port, "2:3", train);
  // Three joined well within the last call: round 0 has all three.
  REQUIRE(wait_for([&] { return fs::exists(d / "kill" / "v0" / "checkpoints" / "step_16"); }, 180));
  CHECK(log_has(log0, "round 0: node "));
  CHECK(log_has(log0, "/3, 1 workers"));
  ::kill(n2, SIGKILL);  // the launcher, and with it its worker (they die with their launcher)
  CHECK(wait_exit(n2) == 128 + SIGKILL);
  const int rc0 = wait_exit(n0), rc1 = wait_exit(n1);
  const std::string out0 = slurp(log0), out1 = slurp(log1);
  INFO("node 0:\n" << out0 << "\nnode 1:\n" << out1 << "\nnode 2:\n" << slurp(log2));
  CHECK(rc0 == 0);
  CHECK(rc1 == 0);
  // Either surviving launcher may see its worker fail first and open round 1; the other then
  // finds round 0 superseded. Both train in the round of two.
  const std::string both = out0 + out1;
  CHECK(both.find("opening round 1 after the failure") != std::string::npos);
  for (const auto* out : {&out0, &out1}) {
    CHECK(out->find("round 1: node ") != std::string::npos);
    CHECK(out->find("/2, 1 workers") != std::string::npos);
  }
  // The round-1 world resumes the checkpoint and re-shards the rest of the epoch over two ranks.
  CHECK(both.find("world 3 -> 2 ranks") != std::string::npos);
  CHECK(both.find("test accuracy: ") != std::string::npos);
  CHECK(final_digests(d / "kill") == one_process_digests(d));
}

TEST_CASE(
    "elastic launch, --nnodes 2:3: a third launcher started later joins at the next round; the "
    "two running nodes stop cleanly and the three resume, in the bytes of one process "
    "(distributed.invariance: bitwise)",
    "[cli][dist][elastic][invariance]") {
  const auto d = tmpdir("elastic_join");
  const int port = free_ports();
  const std::string train = bitwise_mlp(d) + " run.name=join";
  const fs::path log0 = d / "node0.log", log1 = d / "node1.log", log2 = d / "node2.log";
  ScopedEnv env4({{"MLTRAIN_TEST_HOLD", "0:12"}});  // first round only
  const pid_t n0 = elastic_node(log0, port, "2:3", train);
  REQUIRE(wait_for([&] { return log_has(log0, "rendezvous store serving at"); }, 60));
  const pid_t n1 = elastic_node(log1, port, "2:3", train);
  // Two nodes, and after the last call a round of two trains; rank 0 holds at step 12 until it is
  // told to stop, so the group is still running when the third node comes, however fast it is.
  REQUIRE(wait_for([&] { return fs::exists(d / "join" / "v0" / "checkpoints" / "step_8"); }, 180));
  const pid_t n2 = elastic_node(log2, port, "2:3", train);
  const int rc2 = wait_exit(n2), rc0 = wait_exit(n0), rc1 = wait_exit(n1);
  env4.restore();
  const std::string out0 = slurp(log0), out1 = slurp(log1), out2 = slurp(log2);
  INFO("node 0:\n" << out0 << "\nnode 1:\n" << out1 << "\nnode 2:\n" << out2);
  CHECK(rc0 == 0);
  CHECK(rc1 == 0);
  CHECK(rc2 == 0);
  // Either running node may be the one that sees the newcomer first; the other is superseded.
  const std::string running = out0 + out1;
  CHECK(running.find("round 0: node 0/2") != std::string::npos);
  CHECK(running.find("round 0: node 1/2") != std::string::npos);
  CHECK(running.find("a node is waiting to join (round of 2, at most 3)") != std::string::npos);
  CHECK(out2.find("round 1: node ") != std::string::npos);  // the newcomer trained in round 1
  CHECK(out2.find("/3, 1 workers") != std::string::npos);
  CHECK(out2.find("[rank ") != std::string::npos);
  const std::string all = out0 + out1 + out2;
  CHECK(all.find("signal 15 received: saving at step 12") != std::string::npos);  // a clean stop
  CHECK(all.find("(step 12, epoch 0, batch 0)") != std::string::npos);  // resumed there, 2 -> 3
  CHECK(all.find("world 2 -> 3 ranks") != std::string::npos);
  CHECK(all.find("test accuracy: ") != std::string::npos);
  CHECK(final_digests(d / "join") == one_process_digests(d));
}

TEST_CASE("elastic launch: bad ranges, missing ports and another run's rendezvous are refused",
          "[cli][dist][elastic]") {
  const auto d = tmpdir("elastic_bad");
  const std::string train = " -- mltrain train " + kSrc + "/configs/fashion_mnist_mlp.yaml";
  auto reversed = run("launch --nnodes 3:2 --master-port " + std::to_string(free_ports()) + train);
  CHECK(reversed.code == 2);
  CHECK(reversed.out.find("--nnodes: MIN 3 is above MAX 2") != std::string::npos);
  auto garbage = run("launch --nnodes 2:x --master-port 29999" + train);
  CHECK(garbage.code == 2);
  CHECK(garbage.out.find("is not N or MIN:MAX") != std::string::npos);
  auto no_port = run("launch --nnodes 1:2" + train);
  CHECK(no_port.code == 2);
  CHECK(no_port.out.find("--master-port") != std::string::npos);
  auto ranked = run("launch --nnodes 1:2 --node-rank 1 --master-port 29999" + train);
  CHECK(ranked.code == 2);
  CHECK(ranked.out.find("--node-rank") != std::string::npos);
  // A launcher of run "a" waits for a second node; one of run "b" at the same address is refused.
  const int port = free_ports();
  const fs::path log_a = d / "a.log";
  const pid_t a =
      elastic_node(log_a, port, "2:2", kSrc + "/configs/fashion_mnist_mlp.yaml", "--rdzv-id a");
  REQUIRE(wait_for([&] { return log_has(log_a, "rendezvous store serving at"); }, 60));
  auto b = run("launch --nnodes 2:2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port " +
               std::to_string(port) + " --rdzv-id b" + train);
  ::kill(a, SIGTERM);
  wait_exit(a);
  INFO(b.out);
  CHECK(b.code == 2);
  CHECK(b.out.find("belongs to run 'a', this launcher is run 'b'") != std::string::npos);
  CHECK(b.out.find("[rank") == std::string::npos);  // never mixed in
}
