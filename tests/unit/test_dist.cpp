// The distributed world from launcher environments (torchrun, Slurm) and Slurm host lists.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "mltrain/core/error.hpp"
#include "mltrain/dist/heartbeat.hpp"
#include "mltrain/dist/launch.hpp"
#include "mltrain/dist/pipe_schedule.hpp"
#include "mltrain/dist/world.hpp"

using namespace mltrain::dist;
using mltrain::Phase;

static World from(const std::map<std::string, std::string>& env) {
  return world_from_env([&](const char* k) -> const char* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST_CASE("Slurm node lists expand like scontrol show hostnames", "[dist]") {
  CHECK(expand_nodelist("node[01-04,07],gpu3") ==
        std::vector<std::string>{"node01", "node02", "node03", "node04", "node07", "gpu3"});
  CHECK(expand_nodelist("a") == std::vector<std::string>{"a"});
  CHECK(expand_nodelist("r[1-2]n[08-09]") ==
        std::vector<std::string>{"r1n08", "r1n09", "r2n08", "r2n09"});
  CHECK(expand_nodelist("c[9-11]x,d") == std::vector<std::string>{"c9x", "c10x", "c11x", "d"});
  CHECK(expand_nodelist("n[098-100]") == std::vector<std::string>{"n098", "n099", "n100"});
  CHECK_THROWS_AS(expand_nodelist("node[01-04"), mltrain::ConfigError);
  CHECK_THROWS_AS(expand_nodelist("node[4-1]"), mltrain::ConfigError);
  CHECK_THROWS_AS(expand_nodelist("node[a-b]"), mltrain::ConfigError);
  // A bad list costs an error, never an exception from stol or a billion strings.
  CHECK_THROWS_WITH(expand_nodelist("n[1-99999999999999999999]"),
                    Catch::Contains("more than 9 digits"));
  CHECK_THROWS_WITH(expand_nodelist("n[1-999999999]"), Catch::Contains("more than 65536 hosts"));
  CHECK_THROWS_WITH(expand_nodelist("r[1-300]n[1-300]"), Catch::Contains("more than 65536 hosts"));
  CHECK(expand_nodelist("n[1-65536]").size() == 65536);
  // Found by tests/fuzz/fuzz_hostlist: an empty list after a range looped over the range for
  // nothing (1e9 iterations, a 10 s fuzzer timeout).
  CHECK_THROWS_WITH(expand_nodelist("a[0-999999999]b[,]"), Catch::Contains("lists no numbers"));
  CHECK_THROWS_WITH(expand_nodelist("node[]"), Catch::Contains("lists no numbers"));
  // Long names: capped at 255 characters, before any host is built (many one-number groups made
  // a 3 KB list take gigabytes).
  std::string many = "h";
  for (int i = 0; i < 300; ++i) many += "[1-2]";
  CHECK_THROWS_WITH(expand_nodelist(many), Catch::Contains("more than 65536 hosts"));
  many = "h";
  for (int i = 0; i < 300; ++i) many += "[1]";
  CHECK_THROWS_WITH(expand_nodelist(many), Catch::Contains("longer than 255 characters"));
  CHECK(expand_nodelist(std::string(255, 'x')).size() == 1);
}

TEST_CASE("world from torchrun, Slurm or nothing", "[dist]") {
  const auto none = from({});
  CHECK(none.size == 1);
  CHECK(none.rank == 0);
  CHECK(none.source == "single");
  const auto t = from({{"RANK", "3"},
                       {"WORLD_SIZE", "4"},
                       {"LOCAL_RANK", "1"},
                       {"LOCAL_WORLD_SIZE", "2"},
                       {"GROUP_RANK", "1"},
                       {"MASTER_ADDR", "10.0.0.1"},
                       {"MASTER_PORT", "29400"},
                       {"TORCHELASTIC_RUN_ID", "abc"}});
  CHECK(t.source == "torchrun");
  CHECK((t.rank == 3 && t.size == 4 && t.local_rank == 1 && t.local_size == 2 && t.node_rank == 1 &&
         t.nodes == 2));
  CHECK(t.master_addr == "10.0.0.1");
  CHECK(t.master_port == 29400);
  CHECK(t.run_id == "abc.port29400.attempt0");
  CHECK_FALSE(t.agent_store);
  // torchrun's defaults: run id "none", its own store, a restart count
  const auto a = from({{"RANK", "0"},
                       {"WORLD_SIZE", "2"},
                       {"LOCAL_RANK", "0"},
                       {"LOCAL_WORLD_SIZE", "2"},
                       {"MASTER_PORT", "29500"},
                       {"TORCHELASTIC_RUN_ID", "none"},
                       {"TORCHELASTIC_RESTART_COUNT", "3"},
                       {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  CHECK(a.agent_store);
  CHECK(a.restart == 3);
  CHECK(a.run_id == "none.port29500.attempt3");
  CHECK(a.single_node());
  CHECK_FALSE(from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "False"}})
                  .agent_store);
  CHECK_FALSE(t.single_node());
  const auto s = from({{"SLURM_PROCID", "5"},
                       {"SLURM_NTASKS", "8"},
                       {"SLURM_LOCALID", "1"},
                       {"SLURM_NODEID", "2"},
                       {"SLURM_JOB_NODELIST", "gpu[07-10]"},
                       {"SLURM_NTASKS_PER_NODE", "2"},
                       {"SLURM_JOB_ID", "123456"}});
  CHECK(s.source == "slurm");
  CHECK((s.rank == 5 && s.size == 8 && s.local_rank == 1 && s.local_size == 2 && s.node_rank == 2 &&
         s.nodes == 4));
  CHECK(s.master_addr == "gpu07");
  CHECK(s.master_port == 20000 + 123456 % 20000);
  // The FileStore's name: the same for every task of a step, another for the next srun of a
  // reused job id (a store file a killed run left behind is not read as this run's).
  auto step = [&](const char* procid, const char* launcher_port) {
    return from({{"SLURM_PROCID", procid},
                 {"SLURM_NTASKS", "2"},
                 {"SLURM_JOB_ID", "1"},
                 {"SLURM_STEP_ID", "0"},
                 {"SLURM_STEP_LAUNCHER_PORT", launcher_port}})
        .run_id;
  };
  CHECK(step("0", "41234") == step("1", "41234"));
  CHECK(step("0", "41234") != step("0", "38021"));
  // torchrun inside an allocation: torchrun's variables win.
  CHECK(from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}})
            .source == "torchrun");
  CHECK(from({{"SLURM_PROCID", "0"},
              {"SLURM_NTASKS", "2"},
              {"SLURM_NTASKS_PER_NODE", "2(x3)"},
              {"SLURM_JOB_NODELIST", "n[1-3]"}})
            .local_size == 2);
  CHECK_THROWS_AS(from({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), mltrain::ConfigError);
  CHECK_THROWS_AS(from({{"RANK", "x"}, {"WORLD_SIZE", "4"}}), mltrain::ConfigError);
  CHECK_THROWS_AS(from({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}),
                  mltrain::ConfigError);
  CHECK_THROWS_WITH(from({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}),
                    Catch::Contains("WORLD_SIZE") && Catch::Contains("out of range"));
}

TEST_CASE("Kubeflow's contracts: PyTorchJob pods and Trainer v2's PET_* variables", "[dist]") {
  // A PyTorchJob pod running mltrain train itself: one process per pod, WORLD_SIZE pods.
  const std::map<std::string, std::string> pod = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                                                  {"MASTER_ADDR", "job-master-0"},
                                                  {"MASTER_PORT", "23456"},
                                                  {"WORLD_SIZE", "3"},
                                                  {"RANK", "2"}};
  const auto p = from(pod);
  CHECK(p.source == "pytorchjob");
  CHECK((p.rank == 2 && p.size == 3 && p.local_rank == 0 && p.local_size == 1 && p.node_rank == 2 &&
         p.nodes == 3));
  CHECK(p.master_addr == "job-master-0");
  CHECK(p.master_port == 23456);
  CHECK_FALSE(p.single_node());  // a TCPStore across pods, never a FileStore
  // The same variables outside a pod stay a hand-set world on one host (as before).
  auto outside = pod;
  outside.erase("KUBERNETES_SERVICE_HOST");
  CHECK(from(outside).source == "torchrun");
  CHECK(from(outside).single_node());
  // Workers of a launcher inside the pod: the launcher's LOCAL_* make them torchrun's.
  auto worker = pod;
  worker["LOCAL_RANK"] = "1", worker["LOCAL_WORLD_SIZE"] = "2", worker["WORLD_SIZE"] = "6";
  worker["RANK"] = "5";
  CHECK(from(worker).source == "torchrun");

  // Trainer v2 (TrainJob): PET_* only.
  const std::map<std::string, std::string> pet = {{"PET_NNODES", "2"},
                                                  {"PET_NODE_RANK", "1"},
                                                  {"PET_MASTER_ADDR", "train-node-0-0.train"},
                                                  {"PET_MASTER_PORT", "29500"},
                                                  {"PET_NPROC_PER_NODE", "1"}};
  const auto t = from(pet);
  CHECK(t.source == "trainer");
  CHECK((t.rank == 1 && t.size == 2 && t.node_rank == 1 && t.nodes == 2 && t.local_size == 1));
  CHECK(t.master_addr == "train-node-0-0.train");
  auto four = pet;
  four["PET_NPROC_PER_NODE"] = "4";
  CHECK_THROWS_WITH(from(four),
                    Catch::Contains("PET_NPROC_PER_NODE") && Catch::Contains("need a launcher"));

  // The node contract a launcher reads.
  auto env_of = [](const std::map<std::string, std::string>& m) {
    return Getenv([m](const char* k) -> const char* {
      auto it = m.find(k);
      return it == m.end() ? nullptr : it->second.c_str();
    });
  };
  const auto c = node_contract_from_env(env_of(pet));
  CHECK((c.source == "trainer" && c.nnodes == 2 && c.node_rank == 1 && c.master_port == 29500 &&
         c.nproc == "1"));
  const auto j = node_contract_from_env(env_of(pod));
  CHECK((j.source == "pytorchjob" && j.nnodes == 3 && j.node_rank == 2 && j.nproc.empty()));
  CHECK(node_contract_from_env(env_of({})).source == "none");
  CHECK(node_contract_from_env(env_of(outside)).source == "none");

  // Flags win; what they leave unset comes from the cluster.
  LaunchOptions lo;
  lo.nproc = 2;
  auto filled = with_node_contract(lo, c, {"--nproc-per-node"}, /*cores=*/16, /*gpus=*/0);
  CHECK((filled.nnodes == 2 && filled.node_rank == 1 && filled.master_port == 29500 &&
         filled.nproc == 2 && filled.master_addr == "train-node-0-0.train"));
  auto eight = c;
  eight.nproc = "auto";
  CHECK(with_node_contract(lo, eight, {}, 8, 0).nproc == 8);
  CHECK(with_node_contract(lo, eight, {}, 8, 4).nproc == 4);
  CHECK(with_node_contract(lo, j, {"--master-port"}, 8, 0).master_port == 0);
  CHECK(with_node_contract(lo, node_contract_from_env(env_of({})), {}, 8, 0).nnodes == 1);

  // torchrun's nproc values: accept / reject.
  CHECK(resolve_nproc("3", 16, 0) == 3);
  CHECK(resolve_nproc("cpu", 6, 2) == 6);
  CHECK(resolve_nproc("gpu", 6, 2) == 2);
  CHECK(resolve_nproc("auto", 6, 0) == 6);
  CHECK_THROWS_WITH(resolve_nproc("gpu", 6, 0), Catch::Contains("no CUDA device"));
  for (const char* bad : {"0", "-1", "x", "2(x3)", ""})
    CHECK_THROWS_AS(resolve_nproc(bad, 6, 0), mltrain::ConfigError);

  // Bad contracts: exit 2 naming the variables.
  auto rank_high = pet;
  rank_high["PET_NODE_RANK"] = "2";
  CHECK_THROWS_WITH(node_contract_from_env(env_of(rank_high)),
                    Catch::Contains("PET_NODE_RANK") && Catch::Contains("not below PET_NNODES=2"));
  // An elastic job (a PyTorchJob's elasticPolicy): the launcher runs the elastic rendezvous.
  auto elastic = pet;
  elastic["PET_NNODES"] = "1:3";
  elastic["PET_RDZV_ENDPOINT"] = "job-master-0:29400";
  elastic["PET_RDZV_ID"] = "job7";
  const auto e = node_contract_from_env(env_of(elastic));
  CHECK((e.elastic && e.min_nodes == 1 && e.max_nodes == 3 && e.master_addr == "job-master-0" &&
         e.master_port == 29400 && e.rdzv_id == "job7"));
  const auto el = with_node_contract(lo, e, {}, 8, 0);
  CHECK((el.elastic && el.min_nodes == 1 && el.max_nodes == 3 && el.rdzv_id == "job7" &&
         el.master_port == 29400));
  CHECK_FALSE(with_node_contract(lo, e, {"--nnodes"}, 8, 0).elastic);  // the flag wins
  CHECK_THROWS_WITH(from(elastic),
                    Catch::Contains("elastic range") && Catch::Contains("mltrain launch"));
  elastic["PET_RDZV_ENDPOINT"] = "nohost";
  CHECK_THROWS_WITH(node_contract_from_env(env_of(elastic)),
                    Catch::Contains("PET_RDZV_ENDPOINT") && Catch::Contains("host:port"));
  elastic["PET_NNODES"] = "3:1";
  CHECK_THROWS_WITH(node_contract_from_env(env_of(elastic)),
                    Catch::Contains("PET_NNODES") && Catch::Contains("MIN 3 is above MAX 1"));
  auto both = pet;
  both["SLURM_JOB_NUM_NODES"] = "4";
  CHECK_THROWS_WITH(node_contract_from_env(env_of(both)),
                    Catch::Contains("PET_NNODES and SLURM_JOB_NUM_NODES") &&
                        Catch::Contains("says 2 nodes, Slurm says 4"));
  CHECK_THROWS_WITH(from(both), Catch::Contains("SLURM_JOB_NUM_NODES"));
  auto pod_slurm = pod;
  pod_slurm["SLURM_NNODES"] = "2";
  CHECK_THROWS_WITH(node_contract_from_env(env_of(pod_slurm)),
                    Catch::Contains("WORLD_SIZE and SLURM_NNODES"));
  auto agree = pet;
  agree["SLURM_JOB_NUM_NODES"] = "2";  // the same world from both: no conflict
  CHECK(node_contract_from_env(env_of(agree)).nnodes == 2);
}

TEST_CASE("heartbeat: a rank behind the others and idle past the timeout is hung", "[dist]") {
  // issued, idle seconds
  CHECK(find_hung({{47, 0.2}, {45, 31}}, 30) == 1);
  CHECK(find_hung({{47, 0.2}, {45, 29}}, 30) == -1);  // not idle long enough
  CHECK(find_hung({{47, 40}, {47, 40}}, 30) == -1);   // level: both waiting (or both done)
  CHECK(find_hung({{50, 0}, {48, 35}, {46, 35}, {50, 1}}, 30) == 2);  // the furthest behind
  CHECK(find_hung({{50, 0}, {46, 35}, {46, 35}}, 30) == 1);           // ties: the lowest rank
  CHECK(find_hung({{3, 0}, {0, 100}}, 30) == -1);   // never reached its first collective: starting
  CHECK(find_hung({{3, 100}, {1, 100}}, 30) == 1);  // the front idle too: it waits for rank 1
  CHECK(find_hung({{3, 0}}, 30) == -1);
  CHECK(find_hung({{3, 0}, {1, 100}}, 0) == -1);  // off
}

TEST_CASE("doctor: slow phases, beats round-trip, divergent collectives, stragglers, stuck groups",
          "[dist][doctor]") {
  // A rank in set-up (no step done yet) or in a checkpoint gets kSlowPhaseS, not the timeout.
  Beat behind{45, 31};
  behind.step = 0;
  CHECK(find_hung({{47, 0.2}, behind}, 30) == -1);
  behind.step = 12, behind.where = Phase::kCheckpoint;
  CHECK(find_hung({{47, 0.2}, behind}, 30) == -1);
  behind.idle_s = kSlowPhaseS + 1;
  CHECK(find_hung({{47, 0.2}, behind}, 30) == 1);
  behind.where = Phase::kData, behind.idle_s = 31;
  CHECK(find_hung({{47, 0.2}, behind}, 30) == 1);
  // auto: twice the slowest median step, at least 7 s.
  Beat slow;
  slow.step_s = 5;
  CHECK(auto_hang_timeout({{}, {}}) == 7);
  CHECK(auto_hang_timeout({{}, slow}) == 10);

  Beat b;
  b.issued = 57, b.where = Phase::kBackward, b.step = 12, b.progress = 99, b.step_s = 0.02,
  b.busy_s = 0.015, b.steps = 10;
  b.recent = {{56, "allreduce(stop signal)", 8}, {57, "allreduce(gradient bucket 0)", 2143272}};
  const Beat back = decode_beat(encode_beat(b));
  CHECK(back.issued == 57);
  CHECK(back.where == Phase::kBackward);
  CHECK(back.step == 12);
  CHECK(back.progress == 99);
  CHECK(back.steps == 10);
  CHECK(back.busy_s == Approx(0.015));
  CHECK(back.recent == b.recent);
  CHECK(decode_beat("garbage").issued == 0);
  CHECK(decode_beat("").issued == 0);

  // Divergence: the same #, another name or size; the odd one out is the minority.
  auto at = [](uint64_t seq, const std::string& name, int64_t bytes) {
    Beat x;
    x.issued = seq;
    x.recent = {{seq, name, bytes}};
    return x;
  };
  CHECK_FALSE(find_mismatch({at(9, "a", 4), at(9, "a", 4), at(8, "b", 8)}));
  auto m = find_mismatch({at(9, "a", 4), at(9, "b", 8), at(9, "a", 4)});
  REQUIRE(m);
  CHECK(m->rank == 1);
  CHECK(m->op.name == "b");
  CHECK(m->other_op.name == "a");
  m = find_mismatch({at(9, "a", 4), at(9, "a", 4), at(9, "a", 2)});  // a size only
  REQUIRE(m);
  CHECK(m->rank == 2);
  m = find_mismatch({at(9, "b", 8), at(9, "a", 4), at(9, "a", 4)});  // rank 0 the odd one
  REQUIRE(m);
  CHECK(m->rank == 0);
  m = find_mismatch({at(9, "a", 4), at(9, "b", 4)});  // two ranks: the one without rank 0
  REQUIRE(m);
  CHECK(m->rank == 1);

  // Stragglers: busy time above 1.5x the median of the others, over full windows.
  auto busy = [](double s, int steps = here::kWindow) {
    Beat x;
    x.busy_s = s, x.steps = steps;
    return x;
  };
  CHECK_FALSE(find_straggler({busy(0.010), busy(0.012), busy(0.011)}));
  auto st = find_straggler({busy(0.010), busy(0.021), busy(0.011)});
  REQUIRE(st);
  CHECK(st->rank == 1);
  CHECK(st->others_s == Approx(0.0105));
  CHECK_FALSE(find_straggler({busy(0.010), busy(0.030, 5)}));  // a window not yet full
  CHECK_FALSE(find_straggler({busy(0.0010), busy(0.0025)}));   // under the 2 ms floor
  CHECK(find_straggler({busy(0.020), busy(0.010)})->rank == 0);

  // Stuck: every rank in the same collective, none moving, past its first step.
  auto waiting = [](uint64_t seq, double idle) {
    Beat x;
    x.issued = seq, x.idle_s = idle, x.step = 20, x.where = Phase::kAllreduce;
    return x;
  };
  CHECK(find_stuck({waiting(40, 8), waiting(40, 9)}, 7) == 40);
  CHECK(find_stuck({waiting(40, 8), waiting(41, 9)}, 7) == 0);  // one behind: find_hung's
  CHECK(find_stuck({waiting(40, 8), waiting(40, 3)}, 7) == 0);  // one still moving
}

TEST_CASE("pipeline schedules: GPipe and 1F1B orders, activations held, bubble formula",
          "[dist][pipeline]") {
  using Ops = std::vector<PipeOp>;
  // GPipe: every forward, then the backwards in reverse (Huang et al. 2019, figure 2).
  CHECK(pipe_schedule(PipeKind::kGPipe, 2, 0, 3) ==
        Ops{{true, 0}, {true, 1}, {true, 2}, {false, 2}, {false, 1}, {false, 0}});
  // 1F1B (PipeDream-Flush), 4 stages, 6 micro-batches: stage 0 warms up with 3 forwards, the
  // last stage alternates from the start.
  CHECK(pipe_schedule(PipeKind::k1F1B, 4, 0, 6) == Ops{{true, 0},
                                                       {true, 1},
                                                       {true, 2},
                                                       {true, 3},
                                                       {false, 0},
                                                       {true, 4},
                                                       {false, 1},
                                                       {true, 5},
                                                       {false, 2},
                                                       {false, 3},
                                                       {false, 4},
                                                       {false, 5}});
  CHECK(pipe_schedule(PipeKind::k1F1B, 4, 3, 3) ==
        Ops{{true, 0}, {false, 0}, {true, 1}, {false, 1}, {true, 2}, {false, 2}});
  // Fewer micro-batches than the warm-up: all forwards, then all backwards.
  CHECK(pipe_schedule(PipeKind::k1F1B, 4, 0, 2) ==
        Ops{{true, 0}, {true, 1}, {false, 0}, {false, 1}});
  for (const auto kind : {PipeKind::kGPipe, PipeKind::k1F1B})
    for (int64_t S : {1, 2, 4})
      for (int64_t s = 0; s < S; ++s)
        for (int64_t M : {1, 4, 16}) {
          const auto ops = pipe_schedule(kind, S, s, M);
          REQUIRE(ops.size() == size_t(2 * M));
          std::vector<int> seen(size_t(M), 0);  // 1 after the forward, 2 after the backward
          for (const auto& op : ops) {
            CHECK(seen[size_t(op.micro)] == (op.forward ? 0 : 1));
            seen[size_t(op.micro)] += 1;
          }
          CHECK(std::count(seen.begin(), seen.end(), 2) == M);
          // 1F1B holds at most S - s activations; GPipe all M.
          CHECK(pipe_in_flight(ops) ==
                (kind == PipeKind::kGPipe ? M : std::min<int64_t>(S - s, M)));
        }
  CHECK(theoretical_bubble(4, 4) == Approx(3.0 / 7));
  CHECK(theoretical_bubble(2, 16) == Approx(1.0 / 17));
  CHECK(theoretical_bubble(1, 1) == 0);
  CHECK(pipe_kind("gpipe") == PipeKind::kGPipe);
  CHECK_THROWS_AS(pipe_kind("interleaved"), mltrain::ConfigError);
}

TEST_CASE("pipeline balance: contiguous stages minimising the slowest one", "[dist][pipeline]") {
  using B = std::vector<int64_t>;
  // By hand: cutting {3,1,1,1,2} after 2 units gives stages of 4 and 4 (after 1: 3 and 5).
  CHECK(balance_stages({3, 1, 1, 1, 2}, 2) == B{0, 2, 5});
  CHECK(balance_stages({1, 1, 1, 1}, 4) == B{0, 1, 2, 3, 4});
  CHECK(balance_stages({1, 1, 1, 1}, 1) == B{0, 4});
  // A heavy first unit stands alone; the rest share the other stages: slowest 9 (of the ties,
  // any), where an even split by count (3, 2, 2 units) would give 13.
  const std::vector<double> heavy = {9, 2, 2, 2, 2, 2, 2};
  const B h = balance_stages(heavy, 3);
  REQUIRE(h.size() == 4);
  CHECK(h[1] == 1);
  for (size_t s = 0; s + 1 < h.size(); ++s) {
    double t = 0;
    for (int64_t u = h[s]; u < h[s + 1]; ++u) t += heavy[size_t(u)];
    CHECK(t <= 9);
  }
  // Zero-cost units still land in non-empty stages.
  const B z = balance_stages({0, 0, 5, 0}, 3);
  REQUIRE(z.size() == 4);
  for (size_t s = 0; s + 1 < z.size(); ++s) CHECK(z[s] < z[s + 1]);
  CHECK_THROWS_AS(balance_stages({1, 1}, 3), mltrain::ConfigError);
}

TEST_CASE("world from MPI launchers: Open MPI, MPICH/PMI, PMIx, PBS/PALS, LSF jsrun, Flux",
          "[dist][launchers]") {
  // Open MPI 4.1's variables as mpirun sets them for rank 3 of 4 (2 per node), PMIX_RANK too.
  World w = from({{"OMPI_COMM_WORLD_RANK", "3"},
                  {"OMPI_COMM_WORLD_SIZE", "4"},
                  {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                  {"OMPI_MCA_ess_base_jobid", "1541144577"},
                  {"PMIX_RANK", "3"},
                  {"PMIX_NAMESPACE", "1541144577"},
                  {"MASTER_ADDR", "node01"}});
  CHECK(w.source == "openmpi");
  CHECK((w.rank == 3 && w.size == 4 && w.local_rank == 1 && w.local_size == 2));
  CHECK((w.node_rank == 1 && w.nodes == 2));
  CHECK(w.master_addr == "node01");
  CHECK((w.master_port >= 20000 && w.master_port < 40000));  // a port per job
  CHECK(w.run_id.find("1541144577") != std::string::npos);
  // Two nodes and no MASTER_ADDR: Open MPI does not say where rank 0 is.
  CHECK_THROWS_WITH(from({{"OMPI_COMM_WORLD_RANK", "0"},
                          {"OMPI_COMM_WORLD_SIZE", "4"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
                    Catch::Contains("MASTER_ADDR") && Catch::Contains("mpirun -x MASTER_ADDR"));
  // One node: loopback.
  w = from({{"OMPI_COMM_WORLD_RANK", "1"},
            {"OMPI_COMM_WORLD_SIZE", "2"},
            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  CHECK((w.master_addr == "127.0.0.1" && w.single_node()));

  // MPICH's Hydra: PMI_RANK/PMI_SIZE and MPI_LOCALRANKID/MPI_LOCALNRANKS, no job id.
  w = from({{"PMI_RANK", "1"},
            {"PMI_SIZE", "2"},
            {"MPI_LOCALRANKID", "1"},
            {"MPI_LOCALNRANKS", "2"},
            {"PMI_FD", "6"}});
  CHECK(w.source == "mpich");
  CHECK((w.rank == 1 && w.size == 2 && w.local_rank == 1 && w.nodes == 1));
  CHECK(w.master_port == 29500);
  CHECK(w.run_id.find("mpich.parent") == 0);

  // PMIx alone gives no size; with Open MPI's it is the same process.
  CHECK_THROWS_WITH(from({{"PMIX_RANK", "0"}}), Catch::Contains("no world size"));

  // PBS/PALS (Cray MPICH: PMI_SIZE too) with a node file of 2 nodes x 2 slots.
  const auto dir = std::filesystem::temp_directory_path() / "mltrain_test_launchers";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "nodefile") << "x1001c0s0b0n0.hsn\nx1001c0s0b0n0.hsn\nx1001c0s1b0n0.hsn\n"
                                     "x1001c0s1b0n0.hsn\n";
  const std::string nodefile = (dir / "nodefile").string();
  w = from({{"PALS_RANKID", "2"},
            {"PALS_LOCAL_RANKID", "0"},
            {"PMI_RANK", "2"},
            {"PMI_SIZE", "4"},
            {"PBS_NODEFILE", nodefile.c_str()},
            {"PBS_JOBID", "4242.pbs01"}});
  CHECK(w.source == "pals");
  CHECK((w.rank == 2 && w.size == 4 && w.nodes == 2 && w.local_size == 2 && w.node_rank == 1));
  CHECK(w.master_addr == "x1001c0s0b0n0.hsn");
  CHECK_THROWS_WITH(
      from({{"PALS_RANKID", "0"}, {"PMI_SIZE", "2"}, {"PBS_NODEFILE", (dir / "missing").c_str()}}),
      Catch::Contains("PBS_NODEFILE") && Catch::Contains("cannot be read"));

  // LSF jsrun: the host file lists the launch node first, once per slot.
  std::ofstream(dir / "djob") << "batch3\nh01\nh01\nh02\nh02\n";
  const std::string djob = (dir / "djob").string();
  w = from({{"JSM_NAMESPACE_RANK", "1"},
            {"JSM_NAMESPACE_SIZE", "4"},
            {"JSM_NAMESPACE_LOCAL_RANK", "1"},
            {"JSM_NAMESPACE_LOCAL_SIZE", "2"},
            {"LSB_DJOB_HOSTFILE", djob.c_str()},
            {"LSB_JOBID", "77"},
            {"MASTER_ADDR", "h01"}});
  CHECK(w.source == "lsf");
  CHECK(
      (w.rank == 1 && w.size == 4 && w.local_size == 2 && w.nodes == 2 && w.master_addr == "h01"));

  // Flux: FLUX_TASK_RANK, FLUX_TASK_LOCAL_ID, FLUX_JOB_SIZE, FLUX_JOB_NNODES.
  w = from({{"FLUX_TASK_RANK", "5"},
            {"FLUX_TASK_LOCAL_ID", "1"},
            {"FLUX_JOB_SIZE", "8"},
            {"FLUX_JOB_NNODES", "4"},
            {"FLUX_JOB_ID", "f3ETxsR9H"},
            {"MASTER_ADDR", "tioga1"}});
  CHECK(w.source == "flux");
  CHECK((w.rank == 5 && w.size == 8 && w.local_rank == 1 && w.local_size == 2 && w.nodes == 4 &&
         w.node_rank == 2));

  // Conflicting sources: exit 2 (ConfigError) naming both variables.
  CHECK_THROWS_WITH(from({{"OMPI_COMM_WORLD_RANK", "1"},
                          {"OMPI_COMM_WORLD_SIZE", "4"},
                          {"PMI_RANK", "2"},
                          {"PMI_SIZE", "4"}}),
                    Catch::Contains("OMPI_COMM_WORLD_RANK and PMI_RANK") &&
                        Catch::Contains("Open MPI says rank 1 of 4, MPICH/PMI says rank 2 of 4"));
  CHECK_THROWS_WITH(from({{"FLUX_TASK_RANK", "0"},
                          {"FLUX_JOB_SIZE", "2"},
                          {"JSM_NAMESPACE_RANK", "0"},
                          {"JSM_NAMESPACE_SIZE", "4"}}),
                    Catch::Contains("JSM_NAMESPACE_RANK and FLUX_TASK_RANK"));
  CHECK_THROWS_WITH(from({{"PMI_RANK", "x"}, {"PMI_SIZE", "2"}}),
                    Catch::Contains("PMI_RANK") && Catch::Contains("not an integer"));
  // An MPI launcher inside an sbatch: its ranks win over the batch step's SLURM_PROCID 0; torchrun
  // under mpirun (one launcher per node) is torchrun's world.
  w = from({{"OMPI_COMM_WORLD_RANK", "1"},
            {"OMPI_COMM_WORLD_SIZE", "2"},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
            {"SLURM_PROCID", "0"},
            {"SLURM_NTASKS", "1"},
            {"SLURM_JOB_ID", "9"}});
  CHECK((w.source == "openmpi" && w.rank == 1));
  w = from({{"RANK", "5"},
            {"WORLD_SIZE", "8"},
            {"LOCAL_RANK", "1"},
            {"LOCAL_WORLD_SIZE", "4"},
            {"OMPI_COMM_WORLD_RANK", "1"},
            {"OMPI_COMM_WORLD_SIZE", "2"}});
  CHECK((w.source == "torchrun" && w.rank == 5));
  std::filesystem::remove_all(dir);
}

TEST_CASE("pipeline micro-batches for a target bubble: the fewest M with (S-1)/(M+S-1) <= target",
          "[dist][pipeline]") {
  CHECK(microbatches_for_bubble(2, 0.1, 1000) == 9);   // 1/10
  CHECK(microbatches_for_bubble(4, 0.1, 1000) == 27);  // 3/30
  CHECK(microbatches_for_bubble(4, 0.25, 1000) == 9);  // 3/12
  CHECK(microbatches_for_bubble(2, 0.05, 8) == 8);     // capped at the batch
  CHECK(microbatches_for_bubble(1, 0.1, 64) == 1);     // one stage has no bubble
  for (const int64_t s : {2, 3, 8})
    for (const double t : {0.05, 0.2, 0.5}) {
      const int64_t m = microbatches_for_bubble(s, t, 100000);
      CHECK(theoretical_bubble(s, m) <= t);
      CHECK(theoretical_bubble(s, m - 1) > t);  // and no fewer would do
    }
}
