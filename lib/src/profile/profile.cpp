#include "mltrain/profile/profile.hpp"

#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mltrain/config/format.hpp"
#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/runtime/runtime.hpp"
#include "mltrain/core/svg.hpp"
#include "mltrain/profile/op_profiler.hpp"
#include "mltrain/model/model.hpp"
#include "mltrain/train/pipeline.hpp"

namespace fs = std::filesystem;

namespace mltrain::profile {
using config::format_fixed;
using train::Observer;
using train::PhaseClock;
using train::StepInfo;
using train::Trainer;
namespace {

// "torch::autograd::CppNode<mltrain::model::(anonymous namespace)::DropoutFn>" is the backward of a
// custom autograd function; cut to the table's 44 characters every one read the same.
std::string readable_op_name(const std::string& name) {
  const std::string node = "torch::autograd::CppNode<";
  if (name.rfind(node, 0) != 0 || name.back() != '>') return name;
  const std::string inner = name.substr(node.size(), name.size() - node.size() - 1);
  const auto colon = inner.rfind("::");
  return (colon == std::string::npos ? inner : inner.substr(colon + 2)) + " (backward)";
}

using Clock = std::chrono::steady_clock;
constexpr size_t kPhases = kStepPhases;
static_assert(kPhases == Measure::kPhases, "Measure holds one value per step phase");

double rss_mib() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1 << 20);
}

struct Snapshot {
  std::array<double, kPhases> phases{};
  Clock::time_point t;
  double fill_cpu = 0;
  int64_t faults = 0, samples = 0;
};

// Marks the measurement window on the trainer's own steps.
class Probe : public Observer {
 public:
  Probe(const ProfileOptions& o, PhaseClock& clk, data::Loader& loader, OpProfiler* ops)
      : o_(o), clk_(clk), loader_(loader), ops_(ops) {}
  void on_step_end(Trainer& t, const StepInfo& s) override {
    const int64_t step = t.progress().step;
    if (ops_ && step == o_.wait) ops_->start();
    if (step == o_.wait + o_.warmup) {
      if (ops_) ops_->clear();
      begin = snap();
    }
    if (step > o_.wait + o_.warmup) {
      samples += s.count;
      grad_underflow = std::max(grad_underflow, s.grad_underflow);
      rss.push_back(rss_mib());
    }
    if (step == o_.wait + o_.warmup + o_.active) {
      end = snap();
      if (ops_) ops_->stop();
    }
  }
  Snapshot begin, end;
  int64_t samples = 0;
  double grad_underflow = -1;
  std::vector<double> rss;

 private:
  Snapshot snap() {
    clk_.charge();  // the time since the last mark, to the phase under way, before reading
    Snapshot s;
    s.phases = clk_.seconds;
    s.t = Clock::now();
    s.fill_cpu = loader_.fill_cpu_seconds();
    s.faults = runtime::minor_faults();
    return s;
  }
  const ProfileOptions& o_;
  PhaseClock& clk_;
  data::Loader& loader_;
  OpProfiler* ops_;
};

// The loader alone, with the run's options and augmentation: the rate it can supply.
double loader_rate(const data::Dataset& ds, const data::LoaderOptions& lo,
                   const config::ExperimentConfig& cfg, int64_t batches) {
  const auto l = train::augmented_loader(cfg, ds, lo);
  batches = std::min(batches, l->batches_per_epoch());
  l->start_epoch(0);
  data::Batch b;
  const auto t0 = Clock::now();
  int64_t n = 0, samples = 0;
  while (n < batches && l->next(b)) {
    samples += b.y.size(0);
    ++n;
  }
  return samples / std::max(1e-9, std::chrono::duration<double>(Clock::now() - t0).count());
}

// What the probe saw between the start and the end of the measured steps.
Measure summarise(const Probe& probe, const ProfileOptions& o, int64_t workers) {
  Measure m;
  m.loader.workers = workers;
  const double wall = std::chrono::duration<double>(probe.end.t - probe.begin.t).count();
  for (size_t i = 0; i < kPhases; ++i) {
    const double s = probe.end.phases[i] - probe.begin.phases[i];
    m.phase_ms[i] = s / o.active * 1e3;  // ms per step
    m.phase_share[i] = wall > 0 ? s / wall : 0;
  }
  m.steps = o.active;
  m.step_ms = wall / o.active * 1e3;
  m.samples_per_s = probe.samples / std::max(1e-9, wall);
  m.grad_underflow = probe.grad_underflow;
  m.memory.rss_per_step_mib = probe.rss;
  m.memory.rss_mib = probe.rss.empty() ? rss_mib() : probe.rss.back();
  m.memory.rss_growth_mib = probe.rss.size() > 1 ? probe.rss.back() - probe.rss.front() : 0.0;
  m.memory.peak_rss_mib = runtime::peak_rss_kib() / 1024.0;
  m.memory.page_faults_per_step =
      static_cast<double>(probe.end.faults - probe.begin.faults) / o.active;
  m.loader.cpu_utilisation =
      (probe.end.fill_cpu - probe.begin.fill_cpu) / (wall * std::max<int64_t>(1, m.loader.workers));
  return m;
}

// One pass of the real configuration for wait + warmup + active steps, through the pipeline seam.
Measure measure(const config::ExperimentConfig& base, const train::Splits& splits,
                const ProfileOptions& o, OpProfiler* ops) {
  config::ExperimentConfig cfg = base;
  cfg.train.duration = config::Period::steps(o.wait + o.warmup + o.active);
  cfg.train.eval_every = config::Period::never();
  cfg.train.log_every = config::Period::never();
  cfg.early_stopping.metrics.clear();

  // One evaluation batch is enough: profiling never evaluates.
  train::PipelineOptions po;
  po.splits = &splits;
  po.eval_limit = cfg.data.eval_batch_size.resolve(cfg.data.batch_size);
  const auto p = train::build_pipeline(cfg, dist::World{}, po);
  Trainer& trainer = *p->trainer;
  if (trainer.total_steps() < o.wait + o.warmup + o.active)
    throw ConfigError("profile",
                      "the schedule has only " + std::to_string(trainer.total_steps()) + " steps",
                      "lower --wait/--warmup/--active");
  const data::LoaderOptions& lo = p->train_loader->options();
  PhaseClock clock;
  clock.sync_cuda = p->device.is_cuda();
  trainer.set_phase_clock(&clock);
  auto probe_owned = std::make_unique<Probe>(o, clock, *p->train_loader, ops);
  const Probe* probe = probe_owned.get();
  trainer.add_observer(std::move(probe_owned));
  const auto mem0 = compat::cuda_memory();
  trainer.fit();

  Measure m = summarise(*probe, o, lo.workers);
  m.loader.prefetch = lo.prefetch;
  m.loader.supply_samples_per_s =
      loader_rate(splits.train, lo, cfg, std::max<int64_t>(20, o.active));
  m.batch_size = cfg.data.batch_size;
  m.accumulate = trainer.accumulate();
  if (p->device.is_cuda()) {
    const auto mem = compat::cuda_memory();
    m.memory.cuda = true;
    m.memory.cuda_allocated_mib = mem.allocated / double(1 << 20);
    m.memory.cuda_reserved_mib = mem.reserved / double(1 << 20);
    m.memory.cuda_peak_allocated_mib = mem.peak_allocated / double(1 << 20);
    m.memory.cuda_allocated_before_mib = mem0.allocated / double(1 << 20);
    m.memory.cuda_total_mib =
        compat::cuda_total_memory(std::max<int>(0, p->device.index())) / double(1 << 20);
  }
  return m;
}

// OMP_WAIT_POLICY, MALLOC_ARENA_MAX, ...: upper-case names are environment variables.
bool is_env_name(const std::string& k) {
  if (k.empty() || !std::isupper(static_cast<unsigned char>(k[0]))) return false;
  for (char c : k)
    if (!(std::isupper(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '_'))
      return false;
  return true;
}

// Runs `mltrain profile --no-ops --json` on the same config in a child with NAME=value set.
Measure measure_in_child(const ProfileOptions& o, const std::string& name,
                         const std::string& value) {
  std::vector<std::string> args = {"/proc/self/exe", "profile", o.config_path};
  for (const auto& ov : o.overrides) args.push_back(ov);
  for (auto [flag, n] : {std::pair<const char*, int64_t>{"--wait", o.wait},
                         {"--warmup", o.warmup},
                         {"--active", o.active}}) {
    args.push_back(flag);
    args.push_back(std::to_string(n));
  }
  const std::string tag = name.empty() ? "baseline" : name + "_" + value;
  args.insert(args.end(),
              {"--no-ops", "--json", "--out", (fs::path(o.out_dir) / ("sweep_" + tag)).string()});
  int out_pipe[2];
  if (::pipe(out_pipe) != 0) throw RuntimeError("profile --sweep", "pipe() failed");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    if (!name.empty()) ::setenv(name.c_str(), value.c_str(), 1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  std::string text;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(out_pipe[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  ::close(out_pipe[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw RuntimeError("profile --sweep",
                       "the measurement with " + name + "=" + value + " failed (exit " +
                           std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
  // The child's log lines share stdout; the report is the JSON object that starts a line.
  size_t start = text.rfind("\n{\n");
  start = text.compare(0, 2, "{\n") == 0 ? 0 : (start == std::string::npos ? 0 : start + 1);
  return Measure::from_json(nlohmann::json::parse(text.substr(start)).at("measure"));
}

}  // namespace

Diagnosis diagnose(const Measure& m) {
  const double data = m.share("data"), comm = m.share("allreduce"), other = m.share("other");
  const double compute =
      m.share("h2d_copy") + m.share("forward") + m.share("backward") + m.share("optimizer");
  const double supply = m.loader.supply_samples_per_s;
  const double consume = m.samples_per_s;
  const int64_t workers = m.loader.workers;
  const double util = m.loader.cpu_utilisation;
  Diagnosis d;
  std::vector<std::string>& evidence = d.evidence;
  std::vector<std::string>& advice = d.advice;
  auto pct = [](double x) { return format_fixed(100 * x) + "%"; };
  if (data >= 0.15) {
    d.verdict = "data-bound";
    evidence.push_back("the step waited for the next batch " + pct(data) +
                       " of its time (threshold 15%)");
    evidence.push_back("the loader alone supplies " + format_fixed(supply, 0) + " samples/s with " +
                       std::to_string(workers) + " worker(s); training consumed " +
                       format_fixed(consume, 0) + " samples/s");
    evidence.push_back("loader threads were busy " + pct(util) + " of the time");
    const int64_t cores = runtime::usable_cores();
    if (workers + 1 < cores)
      advice.push_back("raise data.workers (this machine has " + std::to_string(cores) + " cores)");
    advice.push_back("raise data.prefetch so bursts are absorbed");
    advice.push_back(
        "loader workers sharing cores with the intra-op threads are starved by OpenMP's "
        "spin-waiting: "
        "measure OMP_WAIT_POLICY=passive with `--sweep OMP_WAIT_POLICY=active,passive` (it slows "
        "compute-bound configs, so it is not the default)");
    advice.push_back(
        "make augmentation cheaper: lower p or narrow the window of the costly ops (see `mltrain "
        "checklist`)");
    advice.push_back("try `mltrain profile CONFIG --sweep data.workers=0,1,2,4`");
  } else if (comm >= 0.25) {
    d.verdict = "communication-bound";
    evidence.push_back("all-reduce took " + pct(comm) + " of the step (threshold 25%)");
    advice.push_back("larger gradient buckets, overlap with backward, or 1-bit Adam compression");
  } else if (other >= 0.25) {
    d.verdict = "host-overhead-bound";
    evidence.push_back(
        pct(other) +
        " of the step went outside data, copy, forward, backward and optimizer (threshold 25%)");
    advice.push_back(
        "fewer host synchronisations per step: raise train.log_every, evaluate less often");
    advice.push_back("a larger data.batch_size amortises per-step overhead");
  } else {
    d.verdict = "compute-bound";
    evidence.push_back("forward, backward and optimizer took " + pct(compute) +
                       " of the step; data wait " + pct(data));
    if (supply > 0)
      evidence.push_back("the loader could supply " +
                         format_fixed(supply / std::max(1.0, consume), 1) +
                         "x what the model consumes");
    advice.push_back(
        "bf16 autocast (amp.enabled=true) on CPUs with native bf16, and channels_last cut compute; "
        "see the operator table");
  }
  if (m.grad_underflow > 0.01)
    advice.push_back("fp16 gradients: " + pct(m.grad_underflow) +
                     " of sampled elements are subnormal at the loss scale (amp.underflow_warn's "
                     "default 1%): raise amp.init_scale / amp.min_scale, or use amp.dtype=bf16");
  const auto& mem = m.memory;
  const auto& rss = mem.rss_per_step_mib;
  bool rising = rss.size() >= 4;
  for (size_t i = 1; i < rss.size() && rising; ++i) rising = rss[i] >= rss[i - 1];
  if (rising && mem.rss_growth_mib > 32) {
    d.memory = "RSS rose at every active step (+" + format_fixed(mem.rss_growth_mib) +
               " MiB): stair-step growth means tensors from earlier steps are kept alive (a "
               "loss kept with its graph, a list of outputs)";
  }
  if (mem.page_faults_per_step > 2000)
    advice.push_back("page faults per step are high (" + format_fixed(mem.page_faults_per_step, 0) +
                     "): runtime.allocator=retain keeps freed memory");
  return d;
}

namespace {

// Passes 2 and 3: with the operator profiler, then the phase clock alone again; the overhead is
// measured against the faster of the two plain passes, so machine drift between passes is not
// charged to the profiler. Fills the operator table and, with out_dir, the Chrome trace.
void operator_passes(const config::ExperimentConfig& cfg, const train::Splits& splits,
                     const ProfileOptions& o, ProfileReport& r) {
  spdlog::info("[profile] pass 2: with the operator profiler");
  OpProfiler prof({.backward_scopes = model::kNodeScope});
  const Measure with = measure(cfg, splits, o, &prof);
  spdlog::info("[profile] pass 3: phase clock only again (baseline for the overhead)");
  const Measure again = measure(cfg, splits, o, nullptr);
  ProfileReport::Overhead ov;
  ov.step_ms_without = std::min(r.measure.step_ms, again.step_ms);
  ov.step_ms_without_passes = {r.measure.step_ms, again.step_ms};
  ov.step_ms_with = with.step_ms;
  r.profiler_overhead = ov;
  const double total_self = prof.total_self_us();
  auto row = [&](const OpStat& op, const std::string& name) {
    return ProfileReport::Operator{name, static_cast<double>(op.calls) / o.active,
                                   op.self_us / 1e3 / o.active, op.total_us / 1e3 / o.active,
                                   total_self > 0 ? op.self_us / total_self : 0};
  };
  // An exported program's nodes are user scopes named model::kNodeScope + "<module>: <op>", and
  // the profiler charges their autograd backward to "<that> (backward)".
  const std::string prefix = model::kNodeScope, bw = " (backward)";
  std::vector<OpStat> nodes, backward;
  for (const auto& op : prof.top(SIZE_MAX)) {
    if (op.name.rfind(prefix, 0) != 0) {
      if (r.operators.size() < o.top) r.operators.push_back(row(op, readable_op_name(op.name)));
      continue;
    }
    const bool b = op.name.size() > bw.size() &&
                   op.name.compare(op.name.size() - bw.size(), bw.size(), bw) == 0;
    (b ? backward : nodes).push_back(op);
  }
  auto by_total = [](const OpStat& a, const OpStat& b) { return a.total_us > b.total_us; };
  std::sort(nodes.begin(), nodes.end(), by_total);
  std::sort(backward.begin(), backward.end(), by_total);
  for (size_t i = 0; i < nodes.size() && i < o.top; ++i)
    r.graph_nodes.push_back(row(nodes[i], nodes[i].name.substr(prefix.size())));
  for (size_t i = 0; i < backward.size() && i < o.top; ++i) {
    const std::string& n = backward[i].name;
    r.graph_nodes_backward.push_back(
        row(backward[i], n.substr(prefix.size(), n.size() - prefix.size() - bw.size())));
  }
  r.operator_calls_per_step = static_cast<double>(prof.total_calls()) / o.active;
  if (o.out_dir.empty()) return;
  fs::create_directories(o.out_dir);
  const std::string trace = (fs::path(o.out_dir) / "trace.json.gz").string();
  const int64_t n = prof.write_chrome_trace_gz(trace, o.trace_cap_bytes);
  r.trace = ProfileReport::Trace{trace, n, static_cast<int64_t>(fs::file_size(trace)),
                                 prof.truncated() || n < prof.total_calls()};
}

// --sweep KEY=v1,v2: one phase pass per value, of a config key (in this process) or of an
// environment variable read at start-up (in a child process).
ProfileReport::Sweep sweep(const train::Splits& splits, const ProfileOptions& o) {
  const auto eq = o.sweep.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 >= o.sweep.size())
    throw ConfigError("--sweep", "expected KEY=v1,v2,... but got '" + o.sweep + "'",
                      "e.g. --sweep data.workers=0,1,2,4");
  ProfileReport::Sweep s;
  s.key = o.sweep.substr(0, eq);
  std::vector<std::string> values;
  std::stringstream ss(o.sweep.substr(eq + 1));
  for (std::string v; std::getline(ss, v, ',');)
    if (!v.empty()) values.push_back(v);
  double best = -1;
  for (const auto& v : values) {
    spdlog::info("[profile] sweep {}={}", s.key, v);
    Measure m;
    if (is_env_name(s.key)) {  // read by runtimes at start-up (OpenMP, glibc): a child process
      m = measure_in_child(o, s.key, v);
    } else {
      auto ov = o.overrides;
      ov.push_back(s.key + "=" + v);
      m = measure(config::load_experiment(o.config_path, ov), splits, o, nullptr);
    }
    s.rows.push_back({v, m, diagnose(m).verdict});
    if (m.samples_per_s > best) best = m.samples_per_s, s.best = v;
  }
  s.best_samples_per_s = best;
  s.speedup_vs_first = best / std::max(1e-9, s.rows.front().measure.samples_per_s);
  return s;
}

}  // namespace

std::vector<FixProposal> propose_fixes(const config::ExperimentConfig& cfg, const Measure& m,
                                       const Diagnosis& d, int cores, bool bf16_native) {
  std::vector<FixProposal> out;
  auto add = [&out](std::string key, std::string value, std::string why) {
    FixProposal p{std::move(key), std::move(value), std::move(why)};
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(std::move(p));
  };
  const int64_t threads = cfg.runtime.threads.resolve(cores);
  if (d.verdict == "data-bound") {
    const int64_t w = m.loader.workers,
                  more = std::min<int64_t>(2 * std::max<int64_t>(w, 1), cores);
    if (more > w) add("data.workers", std::to_string(more), "the loader is the bottleneck");
    add("data.prefetch", std::to_string(std::max<int64_t>(2, 2 * m.loader.prefetch)),
        "absorb bursts of slow batches");
    add("OMP_WAIT_POLICY", "passive",
        "spin-waiting intra-op threads starve loader workers that share their cores");
    if (threads > 1)
      add("runtime.threads", std::to_string(threads - 1), "leave a core to the loader");
  } else if (d.verdict == "compute-bound") {
    if (!cfg.amp.enabled && bf16_native)
      add("amp.enabled", "true", "bf16 autocast: this machine runs bf16 matmuls natively");
    if ((cfg.model.name == "cnn" || cfg.model.name == "resnet") && !cfg.model.channels_last)
      add("model.channels_last", "true", "NHWC convolutions (oneDNN's native layout)");
    if (cfg.runtime.kernel_route == "native")
      add("runtime.kernel_route", "onednn", "oneDNN sgemm for fp32 Linear/matmul");
  } else if (d.verdict == "host-overhead-bound" && !cfg.data.batch_size.is_auto()) {
    add("data.batch_size", std::to_string(2 * cfg.data.batch_size),
        "amortise per-step overhead (changes the optimisation: revisit optim.lr)");
  }
  // Memory-bound on a GPU (the step's peak near the device's memory): checkpointing frees room for
  // a larger micro-batch. On its own it is slower per step, so the keep rule usually refuses it.
  const auto& mem = m.memory;
  if (mem.cuda && mem.cuda_total_mib > 0 &&
      mem.cuda_peak_allocated_mib > 0.9 * mem.cuda_total_mib &&
      (cfg.model.name == "resnet" || cfg.model.name == "gpt") && cfg.memory.checkpoint == "none")
    add("memory.checkpoint", "blocks",
        "memory-bound: recomputed activations leave room for a larger data.batch_size");
  if (cfg.runtime.allocator == "system" && m.memory.page_faults_per_step > 2000)
    add("runtime.allocator", "retain", "freed memory kept: no page faults per step");
  return out;
}

bool proven_faster(const std::vector<double>& baseline, const std::vector<double>& candidate) {
  if (baseline.empty() || candidate.empty()) return false;
  return *std::min_element(candidate.begin(), candidate.end()) >
         *std::max_element(baseline.begin(), baseline.end());
}

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// samples/s of the config with a set of proposals applied: config keys as overrides, at most one
// environment variable; in a child process when `in_child` (all of a --fix run's measurements
// are, when any proposal is an environment variable, so none has a process advantage).
double measure_with(const train::Splits& splits, const ProfileOptions& o,
                    const std::vector<FixProposal>& ps, bool in_child) {
  ProfileOptions po = o;
  std::string env, value;
  for (const auto& p : ps) {
    if (is_env_name(p.key))
      env = p.key, value = p.value;
    else
      po.overrides.push_back(p.key + "=" + p.value);
  }
  if (in_child) return measure_in_child(po, env, value).samples_per_s;
  return measure(config::load_experiment(o.config_path, po.overrides), splits, o, nullptr)
      .samples_per_s;
}

// --fix: the diagnosis's proposals against the baseline in interleaved rounds; those whose every
// round beats every baseline round are kept, then measured together (kept only if the combination
// also proves itself and beats the best single one; otherwise the best single change is kept).
ProfileReport::Fix prove_fixes(const train::Splits& splits, const ProfileOptions& o,
                               const ProfileReport& r, const config::ExperimentConfig& cfg) {
  ProfileReport::Fix f;
  const bool bf16 = r.device.rfind("cuda", 0) == 0 || runtime::cpu_has_native_bf16();
  for (auto& p : propose_fixes(cfg, r.measure, r.diagnosis, runtime::usable_cores(), bf16))
    f.rows.push_back({p, {}, 0, 0, false});
  bool in_child = false;
  for (const auto& row : f.rows) in_child = in_child || is_env_name(row.proposal.key);
  for (int64_t round = 0; round < o.fix_rounds && !f.rows.empty(); ++round) {
    spdlog::info("[profile] --fix round {}/{}: baseline and {} proposal(s)", round + 1,
                 o.fix_rounds, f.rows.size());
    f.baseline.push_back(measure_with(splits, o, {}, in_child));
    for (auto& row : f.rows)
      row.samples_per_s.push_back(measure_with(splits, o, {row.proposal}, in_child));
  }
  f.baseline_median = median_of(f.baseline);
  if (!f.baseline.empty())
    f.noise = (*std::max_element(f.baseline.begin(), f.baseline.end()) -
               *std::min_element(f.baseline.begin(), f.baseline.end())) /
              std::max(1e-9, f.baseline_median);
  std::vector<FixProposal> winners;
  const ProfileReport::FixRow* best = nullptr;
  bool env_taken = false;
  for (auto& row : f.rows) {
    row.median = median_of(row.samples_per_s);
    row.gain = row.median / std::max(1e-9, f.baseline_median) - 1;
    row.kept = proven_faster(f.baseline, row.samples_per_s);
    if (!row.kept) continue;
    if (!best || row.median > best->median) best = &row;
  }
  // Winners in order of gain; one environment variable at most (the child takes one).
  std::vector<const ProfileReport::FixRow*> order;
  for (const auto& row : f.rows)
    if (row.kept) order.push_back(&row);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->median > b->median; });
  for (const auto* row : order) {
    if (is_env_name(row->proposal.key) && env_taken) continue;
    env_taken = env_taken || is_env_name(row->proposal.key);
    winners.push_back(row->proposal);
  }
  if (winners.size() >= 2) {
    ProfileReport::FixRow combo{{"", "", "the kept changes together"}, {}, 0, 0, false};
    for (const auto& w : winners)
      combo.proposal.key += (combo.proposal.key.empty() ? "" : " ") + w.key + "=" + w.value;
    std::vector<double> base;
    for (int64_t round = 0; round < o.fix_rounds; ++round) {
      spdlog::info("[profile] --fix round {}/{}: the {} kept changes together", round + 1,
                   o.fix_rounds, winners.size());
      base.push_back(measure_with(splits, o, {}, in_child));
      combo.samples_per_s.push_back(measure_with(splits, o, winners, in_child));
    }
    combo.median = median_of(combo.samples_per_s);
    combo.gain = combo.median / std::max(1e-9, median_of(base)) - 1;
    combo.kept = proven_faster(base, combo.samples_per_s) && combo.median > best->median;
    if (!combo.kept) winners = {best->proposal};
    f.rows.push_back(combo);
  }
  for (const auto& w : winners) f.kept.push_back(w.key + "=" + w.value);
  return f;
}

// fixed.yaml: the config with the kept config-key changes; environment variables in its header.
std::string fixed_yaml(const ProfileOptions& o, const ProfileReport::Fix& f) {
  std::ostringstream head;
  auto ov = o.overrides;
  head << "# mltrain profile --fix: " << o.config_path << " with the changes proven faster ("
       << o.fix_rounds << " interleaved rounds; kept only when every round beat every baseline "
       << "round; baseline " << format_fixed(f.baseline_median, 0) << " samples/s, noise "
       << format_fixed(100 * f.noise) << "%)\n";
  if (f.kept.empty()) head << "# no change proven: the config as it is\n";
  for (const auto& k : f.kept) {
    const std::string key = k.substr(0, k.find('='));
    if (is_env_name(key))
      head << "# environment (set it before mltrain starts): " << k << "\n";
    else
      ov.push_back(k), head << "# " << k << "\n";
  }
  return head.str() + config::to_yaml(config::load_experiment(o.config_path, ov));
}

}  // namespace

// One forward of a few real samples under the config's autocast, recording each named module's
// output dtype (fp32 islands stay Float, autocast-lowered modules come out BFloat16/Half).
static void autocast_coverage(const config::ExperimentConfig& cfg, train::Pipeline& base,
                              ProfileReport& r) {
  if (!cfg.amp.enabled) return;
  data::Loader loader(base.splits.train,
                      train::plain_loader_options(cfg, 8, /*shuffle=*/false, /*drop_last=*/false));
  loader.start_epoch(0);
  data::Batch b;
  if (!loader.next(b)) return;
  torch::NoGradGuard no_grad;
  base.model->set_training(false);
  base.model->record_dtypes(true);
  {
    const task::Amp a = task::amp_of(cfg.amp, base.device.is_cuda());
    compat::AutocastGuard amp(true, a.dtype, a.cuda);
    base.model->forward(b.x.to(base.device));
  }
  r.autocast_dtypes = base.model->recorded_dtypes();
  base.model->record_dtypes(false);
  r.fp32_islands = cfg.amp.fp32_modules;
}

// --apply: the config file with the sweep's fastest value, resolved, as a new file.
static void apply_sweep(const ProfileOptions& o, ProfileReport::Sweep& sw) {
  auto ov = o.overrides;
  ov.push_back(sw.key + "=" + sw.best);
  const auto best = config::load_experiment(o.config_path, ov);
  write_file_atomic(o.apply, "# " + o.config_path + " with " + sw.key + "=" + sw.best +
                                 ", the fastest of `mltrain profile --sweep " + o.sweep + "`\n" +
                                 config::to_yaml(best));
  sw.applied = o.apply;
  spdlog::info("[profile] wrote {} ({}={})", o.apply, sw.key, sw.best);
}

ProfileReport profile_config(const config::ExperimentConfig& cfg, const ProfileOptions& o) {
  if (o.active < 1 || o.wait < 0 || o.warmup < 0)
    throw ConfigError("profile", "need --active >= 1 and non-negative --wait/--warmup",
                      "e.g. --wait 5 --warmup 10 --active 30");
  if (!o.apply.empty() && o.sweep.empty())
    throw ConfigError("--apply", "needs --sweep KEY=v1,v2,...",
                      "add e.g. --sweep data.workers=0,1,2");
  if (!o.apply.empty() && !o.config_path.empty() &&
      fs::weakly_canonical(o.apply) == fs::weakly_canonical(o.config_path))
    throw ConfigError("--apply", "would overwrite " + o.config_path,
                      "name a new file, e.g. " + o.config_path + ".tuned.yaml");
  if (o.fix && o.fix_rounds < 2)
    throw ConfigError("--fix-rounds", "needs at least 2 rounds to measure the noise",
                      "use --fix-rounds 3");
  // Runtime, device and splits once; every pass below builds its pipeline on these splits.
  const auto base = train::build_pipeline(cfg, dist::World{}, train::model_only());
  const train::Splits& splits = base->splits;
  ProfileReport r;
  r.config = o.config_path;
  r.model = cfg.model.name;
  r.device = base->device.str();
  r.wait = o.wait, r.warmup = o.warmup, r.active = o.active;
  r.runtime = runtime::describe();
  if (cfg.task.name != "custom") autocast_coverage(cfg, *base, r);
  spdlog::info("[profile] pass 1: phase clock only ({} + {} + {} steps)", o.wait, o.warmup,
               o.active);
  r.measure = measure(cfg, splits, o, nullptr);
  r.diagnosis = diagnose(r.measure);
  if (o.ops) operator_passes(cfg, splits, o, r);
  if (!o.sweep.empty()) r.sweep = sweep(splits, o);
  if (r.sweep && !o.apply.empty()) apply_sweep(o, *r.sweep);
  if (o.fix) r.fix = prove_fixes(splits, o, r, cfg);
  if (!o.out_dir.empty()) {
    fs::create_directories(o.out_dir);
    if (r.fix) {
      r.fix->fixed_yaml = (fs::path(o.out_dir) / "fixed.yaml").string();
      write_file_atomic(r.fix->fixed_yaml, fixed_yaml(o, *r.fix));
    }
    write_file_atomic((fs::path(o.out_dir) / "profile.json").string(), r.to_json().dump(2) + "\n");
    write_file_atomic((fs::path(o.out_dir) / "phases.svg").string(), r.phases_svg());
    write_file_atomic((fs::path(o.out_dir) / "report.txt").string(), r.to_text());
  }
  return r;
}

double Measure::share(const char* phase) const {
  for (size_t i = 0; i < kPhases; ++i)
    if (std::string(phase_name(static_cast<Phase>(i))) == phase) return phase_share[i];
  return 0;
}

nlohmann::json Measure::to_json() const {
  nlohmann::json ms = nlohmann::json::object(), sh = nlohmann::json::object();
  for (size_t i = 0; i < kPhases; ++i) {
    ms[phase_name(static_cast<Phase>(i))] = phase_ms[i];
    sh[phase_name(static_cast<Phase>(i))] = phase_share[i];
  }
  nlohmann::json mem = {{"rss_mib", memory.rss_mib},
                        {"rss_growth_mib", memory.rss_growth_mib},
                        {"rss_per_step_mib", memory.rss_per_step_mib},
                        {"peak_rss_mib", memory.peak_rss_mib},
                        {"page_faults_per_step", memory.page_faults_per_step}};
  if (memory.cuda) {
    mem["cuda_allocated_mib"] = memory.cuda_allocated_mib;
    mem["cuda_reserved_mib"] = memory.cuda_reserved_mib;
    mem["cuda_peak_allocated_mib"] = memory.cuda_peak_allocated_mib;
    mem["cuda_allocated_before_mib"] = memory.cuda_allocated_before_mib;
    mem["cuda_total_mib"] = memory.cuda_total_mib;
  }
  nlohmann::json out = {{"steps", steps},
                        {"batch_size", batch_size},
                        {"accumulate", accumulate},
                        {"step_ms", step_ms},
                        {"samples_per_s", samples_per_s},
                        {"phase_ms", ms},
                        {"phase_share", sh},
                        {"loader",
                         {{"workers", loader.workers},
                          {"prefetch", loader.prefetch},
                          {"supply_samples_per_s", loader.supply_samples_per_s},
                          {"cpu_utilisation", loader.cpu_utilisation}}},
                        {"memory", mem}};
  if (grad_underflow >= 0) out["grad_underflow"] = grad_underflow;
  return out;
}

Measure Measure::from_json(const nlohmann::json& j) {
  Measure m;
  j.at("steps").get_to(m.steps);
  j.at("batch_size").get_to(m.batch_size);
  j.at("accumulate").get_to(m.accumulate);
  j.at("step_ms").get_to(m.step_ms);
  j.at("samples_per_s").get_to(m.samples_per_s);
  for (size_t i = 0; i < kPhases; ++i) {
    const char* n = phase_name(static_cast<Phase>(i));
    j.at("phase_ms").at(n).get_to(m.phase_ms[i]);
    j.at("phase_share").at(n).get_to(m.phase_share[i]);
  }
  const auto& l = j.at("loader");
  l.at("workers").get_to(m.loader.workers);
  l.at("prefetch").get_to(m.loader.prefetch);
  l.at("supply_samples_per_s").get_to(m.loader.supply_samples_per_s);
  l.at("cpu_utilisation").get_to(m.loader.cpu_utilisation);
  m.grad_underflow = j.value("grad_underflow", -1.0);
  const auto& mem = j.at("memory");
  mem.at("rss_mib").get_to(m.memory.rss_mib);
  mem.at("rss_growth_mib").get_to(m.memory.rss_growth_mib);
  mem.at("rss_per_step_mib").get_to(m.memory.rss_per_step_mib);
  mem.at("peak_rss_mib").get_to(m.memory.peak_rss_mib);
  mem.at("page_faults_per_step").get_to(m.memory.page_faults_per_step);
  m.memory.cuda = mem.contains("cuda_allocated_mib");
  if (m.memory.cuda) {
    mem.at("cuda_allocated_mib").get_to(m.memory.cuda_allocated_mib);
    mem.at("cuda_reserved_mib").get_to(m.memory.cuda_reserved_mib);
    mem.at("cuda_peak_allocated_mib").get_to(m.memory.cuda_peak_allocated_mib);
    mem.at("cuda_allocated_before_mib").get_to(m.memory.cuda_allocated_before_mib);
    m.memory.cuda_total_mib = mem.value("cuda_total_mib", 0.0);
  }
  return m;
}

nlohmann::json Diagnosis::to_json() const {
  nlohmann::json d = {{"verdict", verdict}, {"evidence", evidence}, {"advice", advice}};
  if (memory) d["memory"] = *memory;
  return d;
}

nlohmann::json ProfileReport::to_json() const {
  nlohmann::json j = {{"config", config},
                      {"model", model},
                      {"device", device},
                      {"schedule", {{"wait", wait}, {"warmup", warmup}, {"active", active}}},
                      {"runtime", runtime},
                      {"measure", measure.to_json()},
                      {"diagnosis", diagnosis.to_json()}};
  if (fix) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : fix->rows)
      rows.push_back({{"key", row.proposal.key},
                      {"value", row.proposal.value},
                      {"why", row.proposal.why},
                      {"samples_per_s", row.samples_per_s},
                      {"median", row.median},
                      {"gain", row.gain},
                      {"kept", row.kept}});
    j["fix"] = {{"baseline_samples_per_s", fix->baseline},
                {"baseline_median", fix->baseline_median},
                {"noise", fix->noise},
                {"proposals", rows},
                {"kept", fix->kept},
                {"fixed_yaml", fix->fixed_yaml}};
  }
  if (!autocast_dtypes.empty())
    j["autocast_coverage"] = {{"modules", autocast_dtypes}, {"fp32_islands", fp32_islands}};
  if (profiler_overhead)
    j["profiler_overhead"] = {{"step_ms_without", profiler_overhead->step_ms_without},
                              {"step_ms_without_passes", profiler_overhead->step_ms_without_passes},
                              {"step_ms_with", profiler_overhead->step_ms_with},
                              {"ratio", profiler_overhead->ratio()}};
  if (profiler_overhead) {
    nlohmann::json ops = nlohmann::json::array();
    for (const auto& op : operators)
      ops.push_back({{"name", op.name},
                     {"calls_per_step", op.calls_per_step},
                     {"self_ms_per_step", op.self_ms_per_step},
                     {"total_ms_per_step", op.total_ms_per_step},
                     {"self_share", op.self_share}});
    j["operators"] = ops;
    auto node_rows = [&](const std::vector<Operator>& rows, const char* key) {
      if (rows.empty()) return;
      nlohmann::json out = nlohmann::json::array();
      for (const auto& op : rows)
        out.push_back({{"name", op.name},
                       {"calls_per_step", op.calls_per_step},
                       {"total_ms_per_step", op.total_ms_per_step}});
      j[key] = out;
    };
    node_rows(graph_nodes, "graph_nodes");
    node_rows(graph_nodes_backward, "graph_nodes_backward");
    j["operator_calls_per_step"] = operator_calls_per_step;
  }
  if (trace)
    j["trace"] = {{"path", trace->path},
                  {"events", trace->events},
                  {"bytes", trace->bytes},
                  {"truncated", trace->truncated}};
  if (sweep) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : sweep->rows)
      rows.push_back(
          {{"value", row.value}, {"measure", row.measure.to_json()}, {"verdict", row.verdict}});
    j["sweep"] = {{"key", sweep->key},
                  {"rows", rows},
                  {"best", sweep->best},
                  {"best_samples_per_s", sweep->best_samples_per_s},
                  {"speedup_vs_first", sweep->speedup_vs_first}};
    if (!sweep->applied.empty()) j["sweep"]["applied"] = sweep->applied;
  }
  return j;
}

// The --fix table of the text report.
static void write_fix_text(std::ostringstream& o, const ProfileReport::Fix& f,
                           const std::string& verdict) {
  o << "\nfix (--fix: " << f.baseline.size() << " interleaved rounds; baseline "
    << format_fixed(f.baseline_median, 0) << " samples/s, run-to-run noise "
    << format_fixed(100 * f.noise) << "%; kept: every round faster than every baseline "
    << "round)\n";
  if (f.rows.empty()) o << "  nothing to propose for a " << verdict << " step\n";
  for (const auto& row : f.rows) {
    std::string change =
        row.proposal.value.empty() ? row.proposal.key : row.proposal.key + "=" + row.proposal.value;
    o << "  " << change << std::string(change.size() < 34 ? 34 - change.size() : 1, ' ')
      << format_fixed(row.median, 0) << " samples/s  " << (row.gain >= 0 ? "+" : "")
      << format_fixed(100 * row.gain) << "%  " << (row.kept ? "kept" : "not proven") << "  ("
      << row.proposal.why << ")\n";
  }
  std::string kept;
  for (const auto& k : f.kept) kept += " " + k;
  o << "  -> " << (kept.empty() ? "no change proven" : "kept:" + kept)
    << (f.fixed_yaml.empty() ? "" : "; " + f.fixed_yaml) << "\n";
}

std::string ProfileReport::to_text() const {
  std::ostringstream o;
  const Measure& m = measure;
  o << "mltrain profile: " << model << " on " << device << ", batch " << m.batch_size
    << " x accumulate " << m.accumulate << "; " << m.steps << " measured steps after " << wait
    << " skipped and " << warmup << " warm-up\n";
  o << "step " << format_fixed(m.step_ms, 2) << " ms, " << format_fixed(m.samples_per_s, 0)
    << " samples/s";
  if (profiler_overhead)
    o << "; operator profiler overhead " << format_fixed(100 * (profiler_overhead->ratio() - 1))
      << "% (" << format_fixed(profiler_overhead->step_ms_with, 2) << " ms/step with it)";
  if (!autocast_dtypes.empty()) {
    std::map<std::string, std::vector<std::string>> by_dtype;
    for (const auto& [name, dt] : autocast_dtypes) by_dtype[dt].push_back(name);
    o << "\nautocast coverage (output dtype of each named module):";
    for (const auto& [dt, names] : by_dtype) {
      o << "\n  " << dt << " (" << names.size() << "):";
      for (size_t i = 0; i < names.size() && i < 12; ++i) o << " " << names[i];
      if (names.size() > 12) o << " ...";
    }
    if (!fp32_islands.empty()) {
      o << "\n  fp32 islands (amp.fp32_modules):";
      for (const auto& p : fp32_islands) o << " " << p;
    }
  }
  o << "\n\n  phase          ms/step    share\n";
  for (size_t i = 0; i < kPhases; ++i) {
    char line[96];
    std::snprintf(line, sizeof line, "  %-12s %9.3f  %6.1f%%\n", phase_name(static_cast<Phase>(i)),
                  m.phase_ms[i], 100 * m.phase_share[i]);
    o << line;
  }
  o << "\nloader: " << m.loader.workers << " worker(s), prefetch " << m.loader.prefetch
    << ": supplies " << format_fixed(m.loader.supply_samples_per_s, 0)
    << " samples/s alone; threads busy " << format_fixed(100 * m.loader.cpu_utilisation)
    << "% while training\n";
  const auto& mem = m.memory;
  o << "memory: RSS " << format_fixed(mem.rss_mib) << " MiB (peak "
    << format_fixed(mem.peak_rss_mib) << "), " << (mem.rss_growth_mib >= 0 ? "+" : "")
    << format_fixed(mem.rss_growth_mib) << " MiB over the measured steps; "
    << format_fixed(mem.page_faults_per_step, 0) << " page faults/step";
  if (mem.cuda)
    o << "; CUDA allocated " << format_fixed(mem.cuda_allocated_mib) << " MiB, reserved "
      << format_fixed(mem.cuda_reserved_mib) << " MiB, peak "
      << format_fixed(mem.cuda_peak_allocated_mib);
  o << "\n";
  if (profiler_overhead) {
    o << "\ntop operators by self CPU time (" << format_fixed(operator_calls_per_step, 0)
      << " operator calls per step)\n";
    char line[200];
    std::snprintf(line, sizeof line, "  %-44s %8s %10s %10s %7s\n", "operator", "calls", "self ms",
                  "total ms", "self%");
    o << line;
    for (const auto& op : operators) {
      // A long name loses its middle, not its end: ATen's forward and backward kernels often
      // differ only there (..._flash_attention_for_cpu and ..._for_cpu_backward).
      const std::string name = op.name.size() <= 44 ? op.name
                                                    : op.name.substr(0, 20) + "..." +
                                                          op.name.substr(op.name.size() - 21);
      std::snprintf(line, sizeof line, "  %-44.44s %8.1f %10.3f %10.3f %6.1f%%\n", name.c_str(),
                    op.calls_per_step, op.self_ms_per_step, op.total_ms_per_step,
                    100 * op.self_share);
      o << line;
    }
    o << "  (per step; CPU time between each op's entry and exit. On CUDA kernels run "
         "asynchronously: the\n"
         "   synchronised phase times above are the GPU's.)\n";
    auto node_table = [&](const std::vector<Operator>& rows, const char* title) {
      if (rows.empty()) return;
      o << title;
      std::snprintf(line, sizeof line, "  %-56s %8s %10s\n", "module: operator", "calls",
                    "total ms");
      o << line;
      for (const auto& op : rows) {
        std::snprintf(line, sizeof line, "  %-56.56s %8.1f %10.3f\n", op.name.c_str(),
                      op.calls_per_step, op.total_ms_per_step);
        o << line;
      }
    };
    node_table(graph_nodes,
               "\ntop graph nodes by forward CPU time (the exported program's nodes by module)\n");
    node_table(graph_nodes_backward,
               "\ntop graph nodes by backward CPU time (the autograd functions each node's "
               "operators made)\n");
  }
  o << "\ndiagnosis: " << diagnosis.verdict << "\n";
  for (const auto& e : diagnosis.evidence) o << "  evidence: " << e << "\n";
  if (diagnosis.memory) o << "  memory: " << *diagnosis.memory << "\n";
  for (const auto& a : diagnosis.advice) o << "  change: " << a << "\n";
  if (sweep) {
    o << "\nsweep " << sweep->key << ":\n";
    char line[200];
    std::snprintf(line, sizeof line, "  %-10s %12s %12s %10s %10s  %s\n", "value", "samples/s",
                  "loader s/s", "data%", "step ms", "verdict");
    o << line;
    for (const auto& row : sweep->rows) {
      const Measure& rm = row.measure;
      std::snprintf(line, sizeof line, "  %-10s %12.0f %12.0f %9.1f%% %10.2f  %s\n",
                    row.value.c_str(), rm.samples_per_s, rm.loader.supply_samples_per_s,
                    100 * rm.share("data"), rm.step_ms, row.verdict.c_str());
      o << line;
    }
    o << "  best: " << sweep->key << "=" << sweep->best << " at "
      << format_fixed(sweep->best_samples_per_s, 0) << " samples/s ("
      << format_fixed(sweep->speedup_vs_first, 2) << "x the first value)\n";
    if (!sweep->applied.empty())
      o << "  wrote " << sweep->applied << " (" << sweep->key << "=" << sweep->best << ")\n";
  }
  if (trace)
    o << "\ntrace: " << trace->path << " (" << trace->events << " events"
      << (trace->truncated ? ", capped" : "") << "; open in https://ui.perfetto.dev)\n";
  if (fix) write_fix_text(o, *fix, diagnosis.verdict);
  return o.str();
}

std::string ProfileReport::phases_svg() const {
  struct Bar {
    std::string label;
    std::array<double, kPhases> ms;
  };
  std::vector<Bar> bars = {{"measured", measure.phase_ms}};
  if (sweep)
    for (const auto& row : sweep->rows)
      bars.push_back({sweep->key + "=" + row.value, row.measure.phase_ms});
  const char* colours[] = {"#d62728", "#9467bd", "#1f77b4", "#ff7f0e",
                           "#2ca02c", "#8c564b", "#7f7f7f"};
  double max_ms = 1e-9;
  for (const auto& b : bars) {
    double t = 0;
    for (double ms : b.ms) t += ms;
    max_ms = std::max(max_ms, t);
  }
  const int W = 760, left = 190, right = 40, bar_h = 26, gap = 12, top = 50;
  const int H = top + static_cast<int>(bars.size()) * (bar_h + gap) + 70;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
       "fill=\"white\"/>\n";
  s << "<text x=\"" << W / 2
    << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">time per training step by phase (ms), "
    << xml_escape(model) << " on " << xml_escape(device) << "</text>\n";
  const double scale = (W - left - right) / max_ms;
  for (size_t b = 0; b < bars.size(); ++b) {
    const int y = top + static_cast<int>(b) * (bar_h + gap);
    s << "<text x=\"" << left - 8 << "\" y=\"" << y + bar_h / 2 + 4 << "\" text-anchor=\"end\">"
      << xml_escape(bars[b].label) << "</text>\n";
    double x = left, total = 0;
    for (size_t i = 0; i < kPhases; ++i) {
      const char* n = phase_name(static_cast<Phase>(i));
      const double ms = bars[b].ms[i];
      total += ms;
      if (ms <= 0) continue;
      s << "<rect x=\"" << format_fixed(x, 2) << "\" y=\"" << y << "\" width=\""
        << format_fixed(ms * scale, 2) << "\" height=\"" << bar_h << "\" fill=\"" << colours[i]
        << "\"><title>" << n << ": " << format_fixed(ms, 3) << " ms</title></rect>\n";
      x += ms * scale;
    }
    s << "<text x=\"" << format_fixed(x + 4, 1) << "\" y=\"" << y + bar_h / 2 + 4 << "\">"
      << format_fixed(total, 2) << "</text>\n";
  }
  int lx = left;
  const int ly = H - 30;
  for (size_t i = 0; i < kPhases; ++i) {
    s << "<rect x=\"" << lx << "\" y=\"" << ly - 10 << "\" width=\"12\" height=\"12\" fill=\""
      << colours[i] << "\"/>"
      << "<text x=\"" << lx + 16 << "\" y=\"" << ly << "\">" << phase_name(static_cast<Phase>(i))
      << "</text>\n";
    lx += 80;
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace mltrain::profile
