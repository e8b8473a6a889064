#pragma once
// `mltrain launch --nproc-per-node N [--max-restarts K] -- CMD...`: a local torchrun. Starts N
// copies of CMD with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT=<a free port>, TORCHELASTIC_RESTART_COUNT,
// MLTRAIN_RUN_ID), streams their stdout and stderr line by line prefixed "[rank i] ", and when a
// worker fails stops the others (SIGTERM, then SIGKILL after a grace period) and restarts the
// whole group, which resumes from its latest checkpoint, up to K times. Then it fails naming the
// rank and its exit status. SIGINT/SIGTERM to the launcher are forwarded to every worker.
//
// Several nodes (torchrun's static rendezvous): one launcher per node with the same --nnodes,
// --master-addr and --master-port and its own --node-rank; ranks are node_rank * N + local rank,
// rank 0 serves the TCPStore. A failure anywhere stops the group on every node (the other nodes'
// workers lose their peers and fail too), and each launcher restarts its workers; attempt k
// meets on master_port + k, so no worker of a new attempt can reach the old attempt's store.
#include <optional>
#include <string>
#include <vector>

#include "mltrain/config/experiment.hpp"

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
};

struct LaunchResult {
  int exit_code = 0;  // 0, or the failing worker's status (1 when it died of a signal)
  int failed_rank = -1;
  std::string failure;  // "rank 1 killed by signal 9" ...
  int restarts = 0;
};

LaunchResult launch(const LaunchOptions& o);

// The launch-or-train decision of `mltrain train`: with distributed.nproc_per_node > 1 and no
// launcher around (neither RANK nor SLURM_PROCID set), this process becomes the launcher of
// nproc_per_node copies of `command` and the launch's exit code is returned (its failure printed);
// nullopt means: train in this process.
std::optional<int> launch_if_configured(const config::DistributedConfig& cfg,
                                        const std::vector<std::string>& command);

}  // namespace mltrain::dist
