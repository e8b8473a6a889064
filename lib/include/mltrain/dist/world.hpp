#pragma once
// Who this process is in a distributed job, from the environment (no LibTorch):
//   torchrun / mltrain launch: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
//                              MASTER_ADDR, MASTER_PORT (and TORCHELASTIC_RUN_ID / MLTRAIN_RUN_ID,
//                              TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_USE_AGENT_STORE)
//   Slurm (srun):             SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//                              SLURM_JOB_NODELIST (expanded here: node[01-04,07],gpu3),
//                              SLURM_NTASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE, SLURM_JOB_ID
//   neither:                  a world of one.
// torchrun's variables win when both are set (torchrun inside an salloc). Inconsistent values
// (rank >= world size, a port that is not a number) are ConfigErrors naming the variable.
//
//   World w = world_from_env();
//   if (w.size > 1) ...   w.agent_store   -> a client of torchrun's own TCPStore (static rendezvous,
//                                             torchrun's default), keys under the attempt's prefix
//                         w.single_node() -> FileStore, else TCPStore on w.master_addr:w.master_port
#include <functional>
#include <string>
#include <vector>

namespace mltrain::dist {

struct World {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int node_rank = 0, nodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single";  // single | torchrun | slurm
  std::string run_id;  // names the rendezvous (FileStore path) so a stale store is never reused
  int restart = 0;     // TORCHELASTIC_RESTART_COUNT (mltrain launch sets it too)
  bool agent_store =
      false;  // torchrun hosts the TCPStore at MASTER_ADDR:MASTER_PORT; every rank is a client
  bool single_node() const { return nodes <= 1; }
};

using Getenv = std::function<const char*(const char*)>;
World world_from_env(const Getenv& getenv = nullptr);

// Slurm's compressed host lists: "node[01-04,07],gpu3" -> node01 node02 node03 node04 node07 gpu3;
// several bracket groups multiply ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2); zero padding kept.
// Throws ConfigError on unbalanced brackets or a descending range.
std::vector<std::string> expand_nodelist(const std::string& list);

}  // namespace mltrain::dist
