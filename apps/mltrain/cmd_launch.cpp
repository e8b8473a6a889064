#include <iostream>

#include "commands.hpp"
#include "mltrain/core/process.hpp"
#include "mltrain/dist/launch.hpp"

namespace mltrain::cli {

void setup_launch(CLI::App& app, Action& run) {
  auto o = std::make_shared<dist::LaunchOptions>();
  auto* sub = app.add_subcommand(
      "launch",
      "run N local ranks with torchrun's environment: mltrain launch --nproc-per-node N "
      "[--nnodes M --node-rank I --master-addr HOST --master-port P] [--max-restarts K] -- "
      "mltrain train cfg.yaml ...");
  sub->add_option("--nproc-per-node", o->nproc, "workers on this node")->capture_default_str();
  sub->add_option("--nnodes", o->nnodes, "nodes, one launcher on each")->capture_default_str();
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
  sub->callback([o, &run] {
    run = [o] {
      auto cmd = o->command;
      if (!cmd.empty() && cmd[0] == "mltrain")
        cmd[0] = self_exe();  // the same binary, wherever it was started from
      auto lo = *o;
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
