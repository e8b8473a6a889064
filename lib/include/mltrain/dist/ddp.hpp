#pragma once
// Data parallelism on c10d (LibTorch has no C++ DistributedDataParallel):
//   Comm          a process group (Gloo; NCCL when compiled) over a FileStore (one node), a
//                 TCPStore (several; its port is unauthenticated and open on all interfaces, which
//                 is logged) or torchrun's own store, with a timeout on every collective, and a
//                 ring buffer of the last collectives (sequence number, op, bytes) dumped when one
//                 fails. With NCCL, CPU tensors (metrics, 1-bit packets) go through the GPU.
//                 With the doctor, a watchdog thread publishes this rank's beat (collectives,
//                 phase, step, progress, step times) to the store and names a rank that stopped
//                 while the others wait, ranks whose collectives diverged, and stragglers
//                 (heartbeat.hpp).
//   DataParallel  broadcasts parameters and buffers from rank 0 once; all-reduces gradients in
//                 buckets launched from autograd hooks as each bucket's last gradient arrives, so
//                 communication overlaps the rest of the backward pass; does nothing on
//                 non-final accumulation micro-steps; averages and writes the gradients back
//                 after backward. Every rank receives the same reduced bytes, so parameters stay
//                 bitwise equal across ranks.
//
//   auto comm = Comm::create(world, {.backend = "gloo", .timeout_s = 300});
//   DataParallel dp(*comm, model.named_parameters(), model.named_buffers(), 25 << 20);
//   dp.broadcast_initial();
//   dp.begin_backward(/*final_micro_step=*/true); loss.backward(); dp.finish_backward();
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mltrain/dist/heartbeat.hpp"
#include "mltrain/dist/world.hpp"
#include "mltrain/model/model.hpp"

namespace mltrain::dist {

bool gloo_compiled();
bool nccl_group_compiled();  // distributed.backend=nccl available: the CUDA plugin loaded, built with nccl.h

struct CommOptions {
  std::string backend = "gloo";  // gloo | nccl
  double timeout_s = 300;
  std::string store_dir;  // FileStore folder (default: $TMPDIR)
  torch::Device device =
      torch::kCPU;  // nccl: this rank's GPU; CPU tensors handed to Comm are staged through it
  // The doctor's watchdog (heartbeat.hpp), in a world > 1: hang_timeout_s > 0 names a rank idle
  // that long; with doctor and hang_timeout_s 0, the timeout follows the step time.
  double hang_timeout_s = 0;
  bool doctor = false;
};

class Comm {
 public:
  static std::unique_ptr<Comm> create(const World& w, const CommOptions& o);
  ~Comm();
  const World& world() const { return world_; }
  int rank() const { return world_.rank; }
  int size() const { return world_.size; }
  bool nccl() const;  // the group is NCCL (else Gloo)
  // Blocking collectives (timeouts raise a RuntimeError naming the op and dumping the ring buffer).
  void allreduce_sum(std::vector<torch::Tensor>& ts, const char* what);
  void broadcast(std::vector<torch::Tensor>& ts, int root, const char* what);
  void barrier(const char* what);
  // Every rank's tensor (same size and dtype on every rank), in rank order.
  std::vector<torch::Tensor> allgather(const torch::Tensor& t, const char* what);
  // Point to point (pipeline stages): send returns at once (wait() before reusing the tensor);
  // recv blocks until the tensor, of the size and dtype the receiver expects, has arrived. Tags
  // keep messages between the same two ranks apart.
  struct Pending;
  std::shared_ptr<Pending> send(const torch::Tensor& t, int dst, int tag, const char* what);
  void recv(torch::Tensor& t, int src, int tag, const char* what);
  // A group of some of this group's ranks (every rank in `ranks` calls it with the same list and
  // name; others do not): its rank numbers are positions in `ranks`.
  std::unique_ptr<Comm> subgroup(const std::vector<int>& ranks, const std::string& name);
  // Asynchronous all-reduce (sum): wait with wait().
  std::shared_ptr<Pending> allreduce_async(torch::Tensor& t, const char* what);
  void wait(const std::shared_ptr<Pending>& p);
  std::string recent() const;  // the ring buffer, oldest first
  int64_t bytes_sent() const { return bytes_; }
  void publish_beat() const;  // this rank's beat to the store now (the doctor)
  // Seconds this rank has spent waiting inside collectives (the doctor's busy time is a step's
  // wall time less this).
  double blocked_seconds() const { return blocked_s_; }
  struct Impl;  // the c10d store and process group (their headers stay out of every other file)

 private:
  Comm();
  void record(const char* op, int64_t bytes);
  template <class F>
  void blocked(F&& f);  // runs a collective's wait, adding its time to blocked_s_
  [[noreturn]] void fail(const std::string& op, const std::exception& e);
  void watch(double hang_timeout_s);  // the watchdog thread's loop (heartbeat.hpp); 0: auto
  [[noreturn]] void report_hang(int hung, const Beat& beat, const Beat& front, double limit_s,
                                bool automatic);
  [[noreturn]] void report_mismatch(const Mismatch& m);
  [[noreturn]] void report_store_lost(const std::string& what);
  std::string who(int rank) const;  // "host H, pid P" from the rendezvous
  Beat own_beat() const;
  std::unique_ptr<Impl> impl_;
  World world_;
  double timeout_s_ = 300;
  mutable std::mutex mu_;
  std::deque<Op> ring_;
  uint64_t seq_ = 0;
  int64_t bytes_ = 0;
  double blocked_s_ = 0;
  std::atomic<int64_t> blocked_since_ms_{0};  // steady clock; 0: not in a collective
};

// 1-bit Adam's momentum exchange: compress with error feedback, all-gather the packed signs and
// scales (n / 8 + 4 bytes per rank instead of 4n), average the unpacked tensors in rank order.
void onebit_average(Comm& comm, torch::Tensor& momentum, torch::Tensor& error);

class DataParallel {
 public:
  // compress: "none", or "fp16"/"bf16": each bucket is divided by the world size and sent in that
  // type (every rank decodes the same reduced bytes, so parameters stay bitwise equal).
  DataParallel(Comm& comm, const model::NamedTensors& params, const model::NamedTensors& buffers,
               int64_t bucket_bytes, bool overlap = true, const std::string& compress = "none");
  ~DataParallel();
  void broadcast_initial();
  void
  broadcast_buffers();  // rank 0's BatchNorm statistics to every rank (PyTorch DDP's broadcast_buffers)
  void begin_backward(bool final_micro_step);
  void finish_backward();
  double comm_wait_seconds() const { return wait_s_; }
  size_t buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<size_t> params;
    torch::Tensor flat;
    torch::Tensor wire;  // compress: what is sent (flat / world in fp16 or bf16)
    std::vector<int64_t> offset;
    size_t ready = 0;
    std::shared_ptr<Comm::Pending> work;
    bool skipped = false;  // MLTRAIN_FAULT=skip_bucket: this step's all-reduce never issued
  };
  void on_grad(size_t p, const torch::Tensor& g);
  void launch(Bucket& b);
  Comm& comm_;
  c10::optional<torch::ScalarType> wire_type_;  // compress
  std::vector<torch::Tensor> params_, buffers_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> where_;  // param -> (bucket, slot)
  std::vector<bool> seen_;
  bool sync_ = false, overlap_ = true;
  double wait_s_ = 0;
};

}  // namespace mltrain::dist
