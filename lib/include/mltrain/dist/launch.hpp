#pragma once
// `mltrain launch --nproc-per-node N [--max-restarts K] -- CMD...`: a local torchrun. Starts N
// copies of CMD with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT=<a free port>, TORCHELASTIC_RESTART_COUNT,
// MLTRAIN_RUN_ID), streams their stdout and stderr line by line prefixed "[rank i] ", and when a
// worker fails stops the others (SIGTERM, then SIGKILL after a grace period) and restarts the
// whole group, which resumes from its latest checkpoint, up to K times. Then it fails naming the
// rank and its exit status. SIGINT/SIGTERM to the launcher are forwarded to every worker.
//
// Elastic (--nnodes MIN:MAX): rounds of a rendezvous at --master-addr:--master-port
// (rendezvous.hpp): a node that fails or leaves makes the next round smaller (at least MIN), a
// node that arrives joins the next one, and the workers resume from the latest checkpoint in the
// round's world (train re-shards the rest of the epoch).
//
// Several nodes (torchrun's static rendezvous): one launcher per node with the same --nnodes,
// --master-addr and --master-port and its own --node-rank; ranks are node_rank * N + local rank,
// rank 0 serves the TCPStore. A failure anywhere stops the group on every node (the other nodes'
// workers lose their peers and fail too), and each launcher restarts its workers; attempt k
// meets on master_port + k, so no worker of a new attempt can reach the old attempt's store.
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mltrain/config/experiment.hpp"
#include "mltrain/dist/world.hpp"

namespace mltrain::dist {

struct LaunchOptions {
  int nproc = 2;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port (one node only)
  int max_restarts = 0;
  double grace_s = 10;  // after SIGTERM, before SIGKILL
  std::vector<std::string> command;
  // --nnodes MIN:MAX: the elastic rendezvous (rendezvous.hpp) assigns node ranks and the world
  // per round, at --master-addr:--master-port; nnodes and node_rank are then the round's.
  bool elastic = false;
  int min_nodes = 1, max_nodes = 1;
  std::string rdzv_id;      // the job's name in the store (default: launch-<addr>-<port>)
  double last_call_s = 10;  // after MIN nodes joined, how long others may still join a round
  double join_timeout_s = 600;
};

struct LaunchResult {
  int exit_code = 0;  // 0, or the failing worker's status (1 when it died of a signal)
  int failed_rank = -1;
  std::string failure;  // "rank 1 killed by signal 9" ...
  int restarts = 0;
};

LaunchResult launch(const LaunchOptions& o);

// The cluster's node contract (node_contract_from_env: Kubeflow Trainer v2's PET_*, a PyTorchJob
// pod's WORLD_SIZE/RANK/MASTER_*) filled into the options a flag did not set (`given` holds the
// flags the user passed: "--nnodes", "--node-rank", "--master-addr", "--master-port",
// "--nproc-per-node"). Flags win; `cores` and `gpus` resolve PET_NPROC_PER_NODE's auto/cpu/gpu.
LaunchOptions with_node_contract(LaunchOptions o, const NodeContract& c,
                                 const std::set<std::string>& given, int cores, int gpus);

// One line on stderr saying which cluster contract set the launch (nothing for "none").
void log_contract(const NodeContract& c, const LaunchOptions& o);

// The launch-or-train decision of `mltrain train`: with distributed.nproc_per_node > 1 (or a
// TrainJob's PET_NPROC_PER_NODE above 1) and no launcher around (no LOCAL_RANK, no SLURM_PROCID,
// no RANK outside a PyTorchJob pod), this process becomes the launcher of that many copies of
// `command` on the node contract's nodes, and the launch's exit code is returned (its failure
// printed); nullopt means: train in this process.
std::optional<int> launch_if_configured(const config::DistributedConfig& cfg,
                                        const std::vector<std::string>& command);

}  // namespace mltrain::dist
