#include <iostream>
#include <set>

#include "commands.hpp"
#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/process.hpp"
#include "mltrain/runtime/runtime.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/dist/launch.hpp"
#include "mltrain/dist/rendezvous.hpp"

namespace mltrain::cli {

void setup_launch(CLI::App& app, Action& run) {
  auto o = std::make_shared<dist::LaunchOptions>();
  auto nnodes = std::make_shared<std::string>("1");
  auto* sub = app.add_subcommand(
      "launch",
      "run N local ranks with torchrun's environment: mltrain launch --nproc-per-node N "
      "[--nnodes M --node-rank I --master-addr HOST --master-port P] [--max-restarts K] -- "
      "mltrain train cfg.yaml ... (flags not given come from a Kubeflow TrainJob's PET_* or a "
      "PyTorchJob pod's WORLD_SIZE/RANK/MASTER_*)");
  sub->add_option("--nproc-per-node", o->nproc, "workers on this node")->capture_default_str();
  sub->add_option("--nnodes", *nnodes,
                  "nodes, one launcher on each; MIN:MAX: an elastic rendezvous (nodes may leave "
                  "and join; each round has MIN..MAX nodes)")
      ->capture_default_str();
  sub->add_option("--rdzv-id", o->rdzv_id,
                  "elastic: the job's name in the rendezvous, the same on every node (default: "
                  "launch-<master-addr>-<master-port>); another job's launcher is refused");
  sub->add_option("--rdzv-last-call", o->last_call_s,
                  "elastic: seconds a round stays open for more nodes once MIN have joined")
      ->capture_default_str();
  sub->add_option("--rdzv-join-timeout", o->join_timeout_s,
                  "elastic: seconds to wait for MIN nodes before failing")
      ->capture_default_str();
  sub->add_option("--node-rank", o->node_rank, "this node's number, 0 .. nnodes-1")
      ->capture_default_str();
  sub->add_option("--master-addr", o->master_addr, "where rank 0 (on node 0) serves the rendezvous")
      ->capture_default_str();
  sub->add_option(
         "--master-port", o->master_port,
         "its port (several nodes: required, the same on every node; attempt k uses port + k); "
         "0: a free port")
      ->capture_default_str();
  sub->add_option("--max-restarts", o->max_restarts,
                  "restart the whole group after a worker fails, this many times")
      ->capture_default_str();
  sub->add_option("--grace", o->grace_s,
                  "seconds between SIGTERM and SIGKILL when stopping workers")
      ->capture_default_str();
  sub->add_option("command", o->command, "the worker command (after --)")->required();
  sub->callback([o, nnodes, sub, &run] {
    std::set<std::string> given;  // flags on the command line win over the cluster's variables
    for (const char* f :
         {"--nnodes", "--node-rank", "--master-addr", "--master-port", "--nproc-per-node"})
      if (sub->count(f)) given.insert(f);
    run = [o, nnodes, given] {
      const auto range = dist::parse_nnodes(*nnodes);
      if (range.elastic && given.count("--node-rank"))
        throw ConfigError("--node-rank",
                          "an elastic rendezvous (--nnodes MIN:MAX) numbers the nodes itself",
                          "drop --node-rank");
      auto cmd = o->command;
      if (!cmd.empty() && cmd[0] == "mltrain")
        cmd[0] = self_exe();  // the same binary, wherever it was started from
      const dist::NodeContract contract = dist::node_contract_from_env();
      auto lo = dist::with_node_contract(*o, contract, given, runtime::usable_cores(),
                                         compat::cuda_device_count());
      if (given.count("--nnodes") || contract.source == "none")
        lo.nnodes = range.max, lo.min_nodes = range.min, lo.max_nodes = range.max,
        lo.elastic = range.elastic;
      if (lo.rdzv_id.empty())
        lo.rdzv_id = "launch-" + lo.master_addr + "-" + std::to_string(lo.master_port);
      dist::log_contract(contract, lo);
      lo.command = cmd;
      const auto r = dist::launch(lo);
      if (r.exit_code != 0 && !r.failure.empty())
        std::cerr << "error: launch: " << r.failure
                  << (r.restarts ? " (after " + std::to_string(r.restarts) + " restarts)" : "")
                  << "\n  fix: read that rank's lines above (prefixed [rank N]); rerun with "
                     "--max-restarts to resume from the latest checkpoint\n";
      return r.exit_code;
    };
  });
}

}  // namespace mltrain::cli
