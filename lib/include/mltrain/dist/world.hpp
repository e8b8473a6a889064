#pragma once
// Who this process is in a distributed job, from the environment (no LibTorch):
//   torchrun / mltrain launch: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
//                              MASTER_ADDR, MASTER_PORT (and TORCHELASTIC_RUN_ID / MLTRAIN_RUN_ID,
//                              TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_USE_AGENT_STORE)
//   Kubeflow PyTorchJob pod:  RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT without LOCAL_WORLD_SIZE,
//                              in a Kubernetes pod (KUBERNETES_SERVICE_HOST): one process per pod
//   Kubeflow Trainer v2 pod:  PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT with
//                              PET_NPROC_PER_NODE 1 (more per node need a launcher: see
//                              node_contract_from_env)
//   Slurm (srun):             SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//                              SLURM_JOB_NODELIST (expanded here: node[01-04,07],gpu3),
//                              SLURM_NTASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE, SLURM_JOB_ID
//   MPI launchers:            Open MPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE), LSF jsrun
//                              (JSM_NAMESPACE_*, LSB_DJOB_HOSTFILE), Flux (FLUX_TASK_RANK,
//                              FLUX_TASK_LOCAL_ID, FLUX_JOB_SIZE, FLUX_JOB_NNODES), PBS/PALS
//                              (PALS_RANKID, PALS_LOCAL_RANKID, PBS_NODEFILE; the size from Cray
//                              PMI's PMI_SIZE), MPICH/PMI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
//                              MPI_LOCALNRANKS), PMIx (PMIX_RANK, with a size from one of them);
//                              rank 0's host from MASTER_ADDR, else the host file's first host,
//                              else (one node) 127.0.0.1; two of them that disagree: ConfigError
//                              naming both variables
//   neither:                  a world of one.
// torchrun's variables win when both are set (torchrun inside an salloc or under mpirun, one
// launcher per node), then an MPI launcher's, then Slurm's (mpirun inside an sbatch). Inconsistent values
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
  std::string source =
      "single";  // single | torchrun | pytorchjob | trainer | slurm | openmpi | lsf | flux | pals |
                 // mpich | pmix
  std::string run_id;  // names the rendezvous (FileStore path) so a stale store is never reused
  int restart = 0;     // TORCHELASTIC_RESTART_COUNT (mltrain launch sets it too)
  bool agent_store =
      false;  // torchrun hosts the TCPStore at MASTER_ADDR:MASTER_PORT; every rank is a client
  bool single_node() const { return nodes <= 1; }
};

using Getenv = std::function<const char*(const char*)>;
World world_from_env(const Getenv& getenv = nullptr);

// What a cluster tells one node's launcher (`mltrain launch`, or `mltrain train` when it becomes
// the launcher): how many nodes, this node's number, where node 0 serves the rendezvous, and how
// many workers each node runs. Read in this order, the first present wins:
//   Kubeflow Trainer v2 (TrainJob, torch policy): PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR,
//       PET_MASTER_PORT, PET_NPROC_PER_NODE ("4", or torchrun's "auto" | "cpu" | "gpu");
//       elastic: PET_NNODES "MIN:MAX" with PET_RDZV_ENDPOINT and PET_RDZV_ID
//   Kubeflow PyTorchJob, the launcher as the pod's command: WORLD_SIZE = pods (nodes),
//       RANK = this pod's index, MASTER_ADDR, MASTER_PORT (the master pod's service)
//   neither: source "none" (one node unless flags say otherwise).
// Slurm's node count (SLURM_JOB_NUM_NODES, SLURM_NNODES) set to another number is a ConfigError
// naming both variables: two schedulers disagreeing about the world is never guessed between.
struct NodeContract {
  std::string source = "none";  // none | trainer | pytorchjob
  int nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string nproc;  // PET_NPROC_PER_NODE as given; empty when the cluster does not say
  // An elastic job (PET_NNODES "MIN:MAX", as a PyTorchJob's elasticPolicy sets it): the launcher
  // runs the elastic rendezvous at PET_RDZV_ENDPOINT (host:port; else the master's), named by
  // PET_RDZV_ID, and node_rank is the rendezvous's to assign.
  bool elastic = false;
  int min_nodes = 1, max_nodes = 1;
  std::string rdzv_id;
};
NodeContract node_contract_from_env(const Getenv& getenv = nullptr);

// Workers per node for torchrun's PET_NPROC_PER_NODE values: a positive integer, "cpu" (the
// usable cores), "gpu" (the GPUs; none is an error), "auto" (the GPUs, else the cores).
int resolve_nproc(const std::string& value, int cores, int gpus);

// Slurm's compressed host lists: "node[01-04,07],gpu3" -> node01 node02 node03 node04 node07 gpu3;
// several bracket groups multiply ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2); zero padding kept.
// Throws ConfigError on unbalanced brackets or a descending range.
std::vector<std::string> expand_nodelist(const std::string& list);

}  // namespace mltrain::dist
