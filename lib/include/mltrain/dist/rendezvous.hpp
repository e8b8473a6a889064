#pragma once
// The elastic rendezvous of `mltrain launch --nnodes MIN:MAX` (torchrun's c10d rendezvous, done
// our way): one TCPStore at --master-addr:--master-port, served by the first launcher on that
// host to bind it, and a sequence of rounds. Each launcher joins the open round (an atomic counter
// gives it its node rank); once MIN nodes have joined, the round stays open for the last call
// (MAX closes it at once), then its size is fixed by compare-and-set, so every node reads the
// same world. Nodes that arrive after the close join the next round and wait there; the running
// nodes see them and open that round, restarting their workers from the latest checkpoint (a
// SIGTERM: every rank stops at one step and rank 0 checkpoints). A node whose workers fail opens
// the next round too; a node that is gone simply does not join it, so the next world is smaller.
// Every key holds its round number; the store also records the run id, and a launcher of another
// run is refused (ConfigError) instead of being mixed in.
//
//   Rendezvous rdzv({.host = "10.0.0.1", .port = 29400, .run_id = "job7", .min_nodes = 2,
//                    .max_nodes = 4});
//   for (;;) {
//     const Round r = rdzv.next_round();          // blocks until this node is in a closed round
//     if (r.done) break;                          // the job finished while this node waited
//     ... start workers with WORLD_SIZE = r.nnodes * nproc ...
//     if (rdzv.superseded(r.number)) ...          // another node opened the next round
//     if (rdzv.waiting(r.number) > 0) rdzv.open_next(r.number);   // admit the newcomers
//   }
//   rdzv.finish(r.number);                        // workers done: late and waiting nodes exit 0
#include <functional>
#include <memory>
#include <string>

namespace mltrain::dist {

struct RendezvousOptions {
  std::string host = "127.0.0.1";
  int port = 29400;
  std::string run_id;  // the same on every node of the job
  int min_nodes = 1, max_nodes = 1;
  double last_call_s = 3;           // after MIN nodes joined, how long others may still join
  double join_timeout_s = 600;      // fewer than MIN nodes for this long: a RuntimeError
  std::function<bool()> cancelled;  // asked while waiting: true ends next_round() (a signal)
};

struct Round {
  int number = 0;
  int node_rank = 0, nnodes = 0;
  bool done = false;       // the job finished before this node got into a round
  bool cancelled = false;  // RendezvousOptions::cancelled said so while waiting
};

class Rendezvous {
 public:
  explicit Rendezvous(const RendezvousOptions& o);
  ~Rendezvous();
  bool serving() const;  // this launcher hosts the store (its exit ends the rendezvous)
  Round next_round();
  bool superseded(int round);  // a later round is open
  int waiting(int round);      // nodes already joined to the round after `round`
  void open_next(int round);   // moves every node to round + 1 (no-op if someone already did)
  // Marks the job done and, when this launcher hosts the store, waits (up to `wait_s`) until
  // every node of the round has said so too, so nobody loses the store mid-goodbye.
  void finish(int round, int nnodes, double wait_s = 60);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  RendezvousOptions o_;
};

// "4" -> {4, 4, false}; "2:4" -> {2, 4, true} (elastic). Throws ConfigError naming --nnodes.
struct NodeRange {
  int min = 1, max = 1;
  bool elastic = false;
};
NodeRange parse_nnodes(const std::string& text);

}  // namespace mltrain::dist
