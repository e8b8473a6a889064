#include "mltrain/dist/world.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "mltrain/core/error.hpp"
#include "mltrain/dist/rendezvous.hpp"

namespace mltrain::dist {
namespace {

std::vector<std::string> split_top(const std::string& s) {  // commas outside brackets
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) throw ConfigError("SLURM_JOB_NODELIST", "unbalanced ']' in '" + s + "'");
    if (c == ',' && depth == 0) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) throw ConfigError("SLURM_JOB_NODELIST", "unbalanced '[' in '" + s + "'");
  if (!cur.empty()) out.push_back(cur);
  return out;
}

constexpr size_t kMaxHosts = 65536;  // above any Slurm allocation; caps what a bad list can cost

constexpr size_t kMaxName = 255;  // a DNS name's limit: caps each host name (and the memory)

// One bracket group's numbers: "01-04,07" gives {01, 02, 03, 04, 07}, zero-padded as written.
struct Group {
  struct Range {
    long lo, hi;
    size_t width;  // digits as written: "08" pads to 2
  };
  std::string literal;  // the text before the group
  std::vector<Range> ranges;
  size_t count = 0, max_digits = 0;
};

Group parse_group(const std::string& item, const std::string& literal, const std::string& body) {
  Group g;
  g.literal = literal;
  size_t pos = 0;
  while (pos <= body.size()) {
    const auto comma = body.find(',', pos);
    const std::string r =
        body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? body.size() + 1 : comma + 1;
    if (r.empty()) continue;
    const auto dash = r.find('-');
    const std::string a = r.substr(0, dash), b = dash == std::string::npos ? a : r.substr(dash + 1);
    if (a.empty() || b.empty() || a.find_first_not_of("0123456789") != std::string::npos ||
        b.find_first_not_of("0123456789") != std::string::npos)
      throw ConfigError("SLURM_JOB_NODELIST",
                        "'" + r + "' in '" + item + "' is not a number or range");
    if (a.size() > 9 || b.size() > 9)  // also keeps stol below its range
      throw ConfigError("SLURM_JOB_NODELIST",
                        "'" + r + "' in '" + item + "' has more than 9 digits");
    const long lo = std::stol(a), hi = std::stol(b);
    if (hi < lo)
      throw ConfigError("SLURM_JOB_NODELIST", "descending range '" + r + "' in '" + item + "'");
    g.ranges.push_back({lo, hi, a.size()});
    g.count += size_t(hi - lo + 1);
    g.max_digits = std::max({g.max_digits, a.size(), std::to_string(hi).size()});
  }
  // An empty list ("node[]", "node[,]") names no host; left in, it made the ranges before it loop
  // over every number for nothing (found by tests/fuzz/fuzz_hostlist: a 10 s timeout).
  if (g.ranges.empty())
    throw ConfigError("SLURM_JOB_NODELIST", "'[" + body + "]' in '" + item + "' lists no numbers",
                      "check the node list");
  return g;
}

// "r[1-2]n[08-09]" -> r1n08 r1n09 r2n08 r2n09. Every group is read and the host count and name
// length checked before anything is built, and the names grow one group at a time: a recursive
// expansion held a copy of every host per group (a 3 KB list of groups took over 2 GB, found by
// tests/fuzz/fuzz_hostlist).
std::vector<std::string> expand_one(const std::string& item) {
  std::vector<Group> groups;
  std::string tail;
  size_t pos = 0;
  while (pos <= item.size()) {
    const auto open = item.find('[', pos);
    if (open == std::string::npos) {
      tail = item.substr(pos);
      break;
    }
    const auto close = item.find(']', open);
    groups.push_back(
        parse_group(item, item.substr(pos, open - pos), item.substr(open + 1, close - open - 1)));
    pos = close == std::string::npos ? item.size() + 1 : close + 1;
  }
  double hosts = 1;
  size_t name = tail.size();
  for (const auto& g : groups) hosts *= double(g.count), name += g.literal.size() + g.max_digits;
  if (hosts > double(kMaxHosts))
    throw ConfigError("SLURM_JOB_NODELIST",
                      "'" + item + "' expands to more than " + std::to_string(kMaxHosts) + " hosts",
                      "check the node list (Slurm allocates at most 65 533 nodes to a job)");
  if (name > kMaxName)
    throw ConfigError("SLURM_JOB_NODELIST",
                      "'" + item.substr(0, 80) + "...' names hosts longer than " +
                          std::to_string(kMaxName) + " characters",
                      "check the node list");
  std::vector<std::string> out{""};
  for (const auto& g : groups) {
    std::vector<std::string> next;
    next.reserve(out.size() * g.count);
    for (const auto& h : out)
      for (const auto& r : g.ranges)
        for (long v = r.lo; v <= r.hi; ++v) {
          std::string num = std::to_string(v);
          if (num.size() < r.width) num = std::string(r.width - num.size(), '0') + num;
          next.push_back(h + g.literal + num);
        }
    out.swap(next);
  }
  for (auto& h : out) h += tail;
  return out;
}

int to_int(const Getenv& env, const char* name, int fallback) {
  const char* v = env(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (end == v || (*end != '\0' && *end != '('))
    throw ConfigError(name, std::string("'") + v + "' is not an integer",
                      "unset it or fix the launcher");
  if (errno == ERANGE || x < INT_MIN || x > INT_MAX)
    throw ConfigError(name, std::string("'") + v + "' is out of range",
                      "unset it or fix the launcher");
  return int(x);
}

}  // namespace

std::vector<std::string> expand_nodelist(const std::string& list) {
  std::vector<std::string> out;
  for (const auto& item : split_top(list)) {
    for (auto& h : expand_one(item)) out.push_back(std::move(h));
    if (out.size() > kMaxHosts)
      throw ConfigError(
          "SLURM_JOB_NODELIST",
          "'" + list + "' expands to more than " + std::to_string(kMaxHosts) + " hosts",
          "check the node list");
  }
  return out;
}

namespace {

Getenv or_process(const Getenv& g) {
  return g ? g : Getenv([](const char* k) { return std::getenv(k); });
}

std::string str_of(const Getenv& env, const char* k, const std::string& fallback) {
  const char* v = env(k);
  return v && *v ? std::string(v) : fallback;
}

// In a Kubernetes pod with RANK and WORLD_SIZE but no LOCAL_* (which torchrun and mltrain launch
// always set): the PyTorchJob operator's variables, one pod each.
bool pytorchjob_pod(const Getenv& env) {
  return env("KUBERNETES_SERVICE_HOST") && env("RANK") && env("WORLD_SIZE") && !env("LOCAL_RANK") &&
         !env("LOCAL_WORLD_SIZE");
}

}  // namespace

NodeContract node_contract_from_env(const Getenv& getenv_in) {
  const Getenv env = or_process(getenv_in);
  NodeContract c;
  const char* nodes_var = "";
  const char *rank_var = "", *port_var = "";
  if (env("PET_NNODES")) {
    c.source = "trainer";
    nodes_var = "PET_NNODES", rank_var = "PET_NODE_RANK", port_var = "PET_MASTER_PORT";
    c.master_addr = str_of(env, "PET_MASTER_ADDR", "127.0.0.1");
    c.master_port = to_int(env, "PET_MASTER_PORT", 29500);
    const std::string nnodes = str_of(env, "PET_NNODES", "");
    if (nnodes.find(':') != std::string::npos) {
      NodeRange range;
      try {
        range = parse_nnodes(nnodes);
      } catch (const ConfigError& e) {
        throw ConfigError("PET_NNODES", e.message(), e.fix());
      }
      c.elastic = true;
      c.min_nodes = range.min, c.max_nodes = c.nnodes = range.max;
      c.rdzv_id = str_of(env, "PET_RDZV_ID", "");
      if (const std::string ep = str_of(env, "PET_RDZV_ENDPOINT", ""); !ep.empty()) {
        const auto colon = ep.rfind(':');
        if (colon == std::string::npos || colon == 0)
          throw ConfigError("PET_RDZV_ENDPOINT", "'" + ep + "' is not host:port");
        c.master_addr = ep.substr(0, colon);
        c.master_port =
            to_int([&](const char*) { return ep.c_str() + colon + 1; }, "PET_RDZV_ENDPOINT", 0);
      }
      port_var = "PET_RDZV_ENDPOINT";
    } else {
      c.nnodes = to_int(env, "PET_NNODES", 1);
      c.node_rank = to_int(env, "PET_NODE_RANK", 0);
    }
    c.nproc = str_of(env, "PET_NPROC_PER_NODE", "");
  } else if (pytorchjob_pod(env)) {
    c.source = "pytorchjob";
    nodes_var = "WORLD_SIZE", rank_var = "RANK", port_var = "MASTER_PORT";
    c.nnodes = to_int(env, "WORLD_SIZE", 1);
    c.node_rank = to_int(env, "RANK", 0);
    c.master_addr = str_of(env, "MASTER_ADDR", "127.0.0.1");
    c.master_port = to_int(env, "MASTER_PORT", 23456);  // the operator's default port
  } else {
    return c;
  }
  const std::string who = c.source == "trainer" ? "the TrainJob" : "the PyTorchJob";
  if (c.nnodes < 1) throw ConfigError(nodes_var, "must be at least 1", "check " + who);
  if (c.node_rank < 0 || c.node_rank >= c.nnodes)
    throw ConfigError(
        rank_var,
        std::to_string(c.node_rank) + " is not below " + nodes_var + "=" + std::to_string(c.nnodes),
        "check " + who);
  if (c.master_port <= 0 || c.master_port > 65535)
    throw ConfigError(port_var, std::to_string(c.master_port) + " is not a TCP port");
  for (const char* slurm : {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"}) {
    if (!env(slurm)) continue;
    const int n = to_int(env, slurm, c.nnodes);
    if (n != c.nnodes)
      throw ConfigError(
          std::string(nodes_var) + " and " + slurm,
          who + " says " + std::to_string(c.nnodes) + " nodes, Slurm says " + std::to_string(n),
          "run under one scheduler: unset the other's variables in the job's environment");
    break;
  }
  return c;
}

int resolve_nproc(const std::string& value, int cores, int gpus) {
  if (value == "cpu") return std::max(1, cores);
  if (value == "auto") return gpus > 0 ? gpus : std::max(1, cores);
  if (value == "gpu") {
    if (gpus < 1)
      throw ConfigError("PET_NPROC_PER_NODE", "'gpu' but this node has no CUDA device",
                        "give the job GPUs, or a number of CPU workers");
    return gpus;
  }
  const char* name = "PET_NPROC_PER_NODE";
  const int n = to_int([&](const char*) { return value.c_str(); }, name, 1);
  if (n < 1 || value.empty() || value.find('(') != std::string::npos)
    throw ConfigError(name, "'" + value + "' is not a positive number of workers",
                      "use a number, auto, cpu or gpu");
  return n;
}

namespace {

// One MPI-family launcher's variables for the rank of this process. A source names its variables;
// empty names are not set by that launcher.
struct MpiSource {
  const char* name;  // as World::source
  const char* who;   // in messages
  const char *rank, *size, *local_rank, *local_size, *nodes, *hostfile, *job;
  const char* alt_local_rank = "";  // a second spelling some builds use
  const char* alt_local_size = "";
};

// In priority order when several agree (they describe the same process: Open MPI 5 also sets
// PMIX_RANK, Cray MPICH under PALS also PMI_RANK).
const MpiSource kMpiSources[] = {
    {"openmpi", "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "", "", "OMPI_MCA_ess_base_jobid"},
    {"lsf", "LSF jsrun", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_RANK",
     "JSM_NAMESPACE_LOCAL_SIZE", "", "LSB_DJOB_HOSTFILE", "LSB_JOBID"},
    {"flux", "Flux", "FLUX_TASK_RANK", "FLUX_JOB_SIZE", "FLUX_TASK_LOCAL_ID", "", "FLUX_JOB_NNODES",
     "", "FLUX_JOB_ID"},
    {"pals", "PBS/PALS", "PALS_RANKID", "PMI_SIZE", "PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE", "",
     "PBS_NODEFILE", "PBS_JOBID"},
    {"mpich", "MPICH/PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "", "", "",
     "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"},
    {"pmix", "PMIx", "PMIX_RANK", "", "", "", "", "", "PMIX_NAMESPACE"},
};

// The distinct host names of a host file (one per line, repeated per slot; PBS_NODEFILE,
// LSB_DJOB_HOSTFILE), in order.
std::vector<std::string> hosts_of(const char* var, const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw ConfigError(var, "'" + path + "' cannot be read",
                      "run inside the job's allocation, or unset it");
  std::vector<std::string> hosts;
  for (std::string line; std::getline(in, line);) {
    const auto end = line.find_first_of(" \t\r");
    line = line.substr(0, end);
    if (!line.empty() && std::find(hosts.begin(), hosts.end(), line) == hosts.end())
      hosts.push_back(line);
  }
  if (hosts.empty()) throw ConfigError(var, "'" + path + "' lists no host", "check the job");
  return hosts;
}

// The world from the first MPI-family launcher present; nullopt without one. Two present that
// disagree on this process's rank or the world size: ConfigError naming both.
std::optional<World> mpi_world(const Getenv& env) {
  const MpiSource* first = nullptr;
  int rank = 0, size = 0;
  for (const auto& src : kMpiSources) {
    if (!env(src.rank)) continue;
    const int r = to_int(env, src.rank, 0);
    const int n = *src.size ? to_int(env, src.size, 0) : 0;
    if (!first) {
      first = &src, rank = r, size = n;
      continue;
    }
    if (r != rank || (n > 0 && size > 0 && n != size))
      throw ConfigError(
          std::string(first->rank) + " and " + src.rank,
          std::string(first->who) + " says rank " + std::to_string(rank) + " of " +
              (size > 0 ? std::to_string(size) : "?") + ", " + src.who + " says rank " +
              std::to_string(r) + " of " + (n > 0 ? std::to_string(n) : "?"),
          "launch with one launcher: unset the other's variables in the job's environment");
    if (size <= 0) size = n;
  }
  if (!first) return std::nullopt;
  const MpiSource& src = *first;
  if (size <= 0)
    throw ConfigError(src.rank,
                      std::string(src.who) + " gives this process's rank but no world size",
                      "launch through mpirun/mpiexec/srun, which also set the size, or set "
                      "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
  World w;
  w.source = src.name;
  w.rank = rank, w.size = size;
  std::vector<std::string> hosts;
  if (*src.hostfile && env(src.hostfile)) hosts = hosts_of(src.hostfile, env(src.hostfile));
  auto local = [&](const char* a, const char* b, int fallback) {
    return *a && env(a)   ? to_int(env, a, fallback)
           : *b && env(b) ? to_int(env, b, fallback)
                          : fallback;
  };
  // Nodes: the launcher's count, else the world over the local size it gives, else the host
  // file's hosts (LSF's lists the launch node too), else one.
  const int given_local = local(src.local_size, src.alt_local_size, 0);
  w.nodes = *src.nodes && env(src.nodes) ? to_int(env, src.nodes, 1)
            : given_local > 0            ? (size + given_local - 1) / given_local
            : !hosts.empty()             ? int(hosts.size())
                                         : 0;
  w.local_size = given_local > 0 ? given_local
                 : w.nodes > 0   ? (size + w.nodes - 1) / w.nodes
                                 : size;
  w.local_rank = local(src.local_rank, src.alt_local_rank, rank % std::max(1, w.local_size));
  if (w.nodes <= 0) w.nodes = (size + w.local_size - 1) / std::max(1, w.local_size);
  w.node_rank = rank / std::max(1, w.local_size);  // ranks placed by node, in blocks
  const std::string job = *src.job ? str_of(env, src.job, "") : "";
  if (const char* addr = env("MASTER_ADDR"); addr && *addr)
    w.master_addr = addr;
  else if (!hosts.empty())
    w.master_addr = hosts.front();
  else if (w.nodes > 1)
    throw ConfigError("MASTER_ADDR",
                      std::string(src.who) + " does not say where rank 0 runs, and this job has " +
                          std::to_string(w.nodes) + " nodes",
                      "export MASTER_ADDR=<the first node's host name> (and MASTER_PORT) to every "
                      "rank, e.g. mpirun -x MASTER_ADDR");
  // A port per job, the same on every rank; the job id also names the FileStore of one node
  // (MPICH's Hydra exports none: its proxy, every local rank's parent, stands in).
  const uint64_t h = std::hash<std::string>{}(job);
  w.master_port = to_int(env, "MASTER_PORT", job.empty() ? 29500 : 20000 + int(h % 20000));
  w.run_id = str_of(env, "MLTRAIN_RUN_ID",
                    std::string(src.name) + "." +
                        (job.empty() ? "parent" + std::to_string(getppid()) : job) + ".port" +
                        std::to_string(w.master_port));
  return w;
}

}  // namespace

World world_from_env(const Getenv& getenv_in) {
  const Getenv env = or_process(getenv_in);
  World w;
  auto str = [&](const char* k, const std::string& d) { return str_of(env, k, d); };
  if (pytorchjob_pod(env) || (env("PET_NNODES") && !env("RANK"))) {
    // One process per pod: the node contract is this process's world.
    const NodeContract c = node_contract_from_env(env);
    if (c.elastic)
      throw ConfigError("PET_NNODES", "'" + str("PET_NNODES", "") + "' is an elastic range",
                        "make the container's command `mltrain launch -- mltrain train ...`: the "
                        "launcher runs the elastic rendezvous");
    if (c.source == "trainer" && !c.nproc.empty() && c.nproc != "1")
      throw ConfigError("PET_NPROC_PER_NODE", "'" + c.nproc + "' workers per node need a launcher",
                        "make the container's command `mltrain train` or `mltrain launch -- "
                        "mltrain train ...` (either starts the workers), or torchrun --no-python");
    w.source = c.source;
    w.rank = w.node_rank = c.node_rank;
    w.size = w.nodes = c.nnodes;
    w.local_rank = 0, w.local_size = 1;
    w.master_addr = c.master_addr;
    w.master_port = c.master_port;
    w.run_id = str("MLTRAIN_RUN_ID", c.source + ".port" + std::to_string(c.master_port));
  } else if (env("RANK") && env("WORLD_SIZE")) {
    w.source = "torchrun";
    w.rank = to_int(env, "RANK", 0);
    w.size = to_int(env, "WORLD_SIZE", 1);
    w.local_rank = to_int(env, "LOCAL_RANK", w.rank);
    w.local_size = to_int(env, "LOCAL_WORLD_SIZE", w.size);
    w.node_rank = to_int(env, "GROUP_RANK", w.local_size ? w.rank / w.local_size : 0);
    w.nodes = w.local_size > 0 ? (w.size + w.local_size - 1) / w.local_size : 1;
    w.master_addr = str("MASTER_ADDR", "127.0.0.1");
    w.master_port = to_int(env, "MASTER_PORT", 29500);
    w.restart = to_int(env, "TORCHELASTIC_RESTART_COUNT", 0);
    w.agent_store = str("TORCHELASTIC_USE_AGENT_STORE", "") == "True";
    // torchrun's run id is "none" unless --rdzv_id is given: the port and the attempt make it this run's.
    w.run_id = str("MLTRAIN_RUN_ID", str("TORCHELASTIC_RUN_ID", "run") + ".port" +
                                         std::to_string(w.master_port) + ".attempt" +
                                         std::to_string(w.restart));
  } else if (auto mpi = mpi_world(env)) {  // an MPI launcher's ranks win over Slurm's task ids
    w = *mpi;
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    w.source = "slurm";
    w.rank = to_int(env, "SLURM_PROCID", 0);
    w.size = to_int(env, "SLURM_NTASKS", 1);
    w.local_rank = to_int(env, "SLURM_LOCALID", 0);
    w.node_rank = to_int(env, "SLURM_NODEID", 0);
    const auto nodes =
        expand_nodelist(str("SLURM_JOB_NODELIST", str("SLURM_NODELIST", "localhost")));
    w.nodes = std::max<int>(1, int(nodes.size()));
    // "2(x3)" or "2,1": the first node's count is this layout's local size when uniform.
    w.local_size = to_int(env, "SLURM_STEP_TASKS_PER_NODE",
                          to_int(env, "SLURM_NTASKS_PER_NODE", (w.size + w.nodes - 1) / w.nodes));
    w.master_addr = str("MASTER_ADDR", nodes.empty() ? "127.0.0.1" : nodes.front());
    const int job = to_int(env, "SLURM_JOB_ID", 0);
    w.master_port =
        to_int(env, "MASTER_PORT", 20000 + job % 20000);  // a port per job, the same on every task
    // The run id names the one-node FileStore. Job ids come round again (a controller whose state
    // was reset starts at 1; MaxJobId wraps), and a killed run leaves its store file behind, so the
    // id also carries the step's launcher port, which each srun draws and exports to all its tasks.
    w.run_id = "slurm" + std::to_string(job) + "." + str("SLURM_STEP_ID", "0") + "." +
               str("SLURM_RESTART_COUNT", "0") + ".srun" + str("SLURM_STEP_LAUNCHER_PORT", "0");
  }
  if (w.size < 1)
    throw ConfigError(w.source == "slurm" ? "SLURM_NTASKS" : "WORLD_SIZE", "must be at least 1");
  if (w.rank < 0 || w.rank >= w.size)
    throw ConfigError(
        w.source == "slurm"      ? "SLURM_PROCID"
        : w.source == "torchrun" ? "RANK"
                                 : w.source + " rank",
        std::to_string(w.rank) + " is not below the world size " + std::to_string(w.size),
        "check the launcher's variables");
  if (w.local_rank < 0 || w.local_rank >= std::max(1, w.local_size))
    throw ConfigError(w.source == "slurm"      ? "SLURM_LOCALID"
                      : w.source == "torchrun" ? "LOCAL_RANK"
                                               : w.source + " local rank",
                      std::to_string(w.local_rank) + " is not below the local size " +
                          std::to_string(w.local_size));
  if (w.master_port <= 0 || w.master_port > 65535)
    throw ConfigError("MASTER_PORT", std::to_string(w.master_port) + " is not a TCP port");
  return w;
}

}  // namespace mltrain::dist
