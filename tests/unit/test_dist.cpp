// The distributed world from launcher environments (torchrun, Slurm) and Slurm host lists.
#include <catch2/catch.hpp>

#include <map>

#include "mltrain/core/error.hpp"
#include "mltrain/dist/world.hpp"

using namespace mltrain::dist;

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
