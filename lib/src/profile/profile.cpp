#include "mltrain/profile/profile.hpp"

#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mltrain/config/format.hpp"
#include "mltrain/core/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/core/runtime.hpp"
#include "mltrain/core/svg.hpp"
#include "mltrain/profile/op_profiler.hpp"
#include "mltrain/train/pipeline.hpp"

namespace fs = std::filesystem;

namespace mltrain::profile {
using config::format_fixed;
using train::Observer;
using train::Phase;
using train::phase_name;
using train::PhaseClock;
using train::StepInfo;
using train::Trainer;
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kPhases = static_cast<size_t>(Phase::kCount);

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
      rss.push_back(rss_mib());
    }
    if (step == o_.wait + o_.warmup + o_.active) {
      end = snap();
      if (ops_) ops_->stop();
    }
  }
  Snapshot begin, end;
  int64_t samples = 0;
  std::vector<double> rss;

 private:
  Snapshot snap() {
    clk_.lap(Phase::kOther);  // charge the step's tail before reading
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

nlohmann::json measure(const config::ExperimentConfig& base, const train::Splits& splits,
                       const ProfileOptions& o, OpProfiler* ops) {
  config::ExperimentConfig cfg = base;
  cfg.train.duration = config::Period::steps(o.wait + o.warmup + o.active);
  cfg.train.eval_every = config::Period::never();
  cfg.train.log_every = config::Period::never();
  cfg.early_stopping.metrics.clear();

  // One evaluation batch is enough: profiling never evaluates.
  train::PipelineOptions po;
  po.splits = &splits;
  po.eval_limit = cfg.data.eval_batch_size;
  const auto p = train::build_pipeline(cfg, dist::World{}, po);
  Trainer& trainer = *p->trainer;
  const torch::Device device = p->device;
  if (trainer.total_steps() < o.wait + o.warmup + o.active)
    throw ConfigError("profile",
                      "the schedule has only " + std::to_string(trainer.total_steps()) + " steps",
                      "lower --wait/--warmup/--active");
  data::Loader& train_loader = *p->train_loader;
  const data::LoaderOptions& lo = train_loader.options();
  PhaseClock clock;
  clock.sync_cuda = device.is_cuda();
  trainer.set_phase_clock(&clock);
  auto probe_owned = std::make_unique<Probe>(o, clock, train_loader, ops);
  Probe* probe = probe_owned.get();
  trainer.add_observer(std::move(probe_owned));
  const auto mem0 = compat::cuda_memory();
  trainer.fit();

  const double wall = std::chrono::duration<double>(probe->end.t - probe->begin.t).count();
  nlohmann::json phases = nlohmann::json::object(), shares = nlohmann::json::object();
  for (size_t i = 0; i < kPhases; ++i) {
    const double s = probe->end.phases[i] - probe->begin.phases[i];
    phases[phase_name(static_cast<Phase>(i))] = s / o.active * 1e3;  // ms per step
    shares[phase_name(static_cast<Phase>(i))] = wall > 0 ? s / wall : 0;
  }
  const int64_t workers = lo.workers;
  const double consumed = probe->samples / std::max(1e-9, wall);
  const double supplied = loader_rate(splits.train, lo, cfg, std::max<int64_t>(20, o.active));
  nlohmann::json m = {
      {"steps", o.active},
      {"batch_size", cfg.data.batch_size},
      {"accumulate", trainer.accumulate()},
      {"step_ms", wall / o.active * 1e3},
      {"samples_per_s", consumed},
      {"phase_ms", phases},
      {"phase_share", shares},
      {"loader",
       {{"workers", workers},
        {"prefetch", lo.prefetch},
        {"supply_samples_per_s", supplied},
        {"cpu_utilisation",
         (probe->end.fill_cpu - probe->begin.fill_cpu) / (wall * std::max<int64_t>(1, workers))}}},
      {"memory",
       {{"rss_mib", probe->rss.empty() ? rss_mib() : probe->rss.back()},
        {"rss_growth_mib", probe->rss.size() > 1 ? probe->rss.back() - probe->rss.front() : 0.0},
        {"rss_per_step_mib", probe->rss},
        {"peak_rss_mib", runtime::peak_rss_kib() / 1024.0},
        {"page_faults_per_step",
         static_cast<double>(probe->end.faults - probe->begin.faults) / o.active}}}};
  if (device.is_cuda()) {
    const auto mem = compat::cuda_memory();
    m["memory"]["cuda_allocated_mib"] = mem.allocated / double(1 << 20);
    m["memory"]["cuda_reserved_mib"] = mem.reserved / double(1 << 20);
    m["memory"]["cuda_peak_allocated_mib"] = mem.peak_allocated / double(1 << 20);
    m["memory"]["cuda_allocated_before_mib"] = mem0.allocated / double(1 << 20);
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
nlohmann::json measure_in_child(const ProfileOptions& o, const std::string& name,
                                const std::string& value) {
  std::vector<std::string> args = {"/proc/self/exe", "profile", o.config_path};
  for (const auto& ov : o.overrides) args.push_back(ov);
  for (auto [flag, n] : {std::pair<const char*, int64_t>{"--wait", o.wait},
                         {"--warmup", o.warmup},
                         {"--active", o.active}}) {
    args.push_back(flag);
    args.push_back(std::to_string(n));
  }
  args.insert(args.end(), {"--no-ops", "--json", "--out",
                           (fs::path(o.out_dir) / ("sweep_" + name + "_" + value)).string()});
  int out_pipe[2];
  if (::pipe(out_pipe) != 0) throw RuntimeError("profile --sweep", "pipe() failed");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    ::setenv(name.c_str(), value.c_str(), 1);
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
  return nlohmann::json::parse(text.substr(start)).at("measure");
}

}  // namespace

nlohmann::json diagnose(const nlohmann::json& m) {
  const auto& sh = m.at("phase_share");
  const double data = sh.value("data", 0.0), comm = sh.value("allreduce", 0.0),
               other = sh.value("other", 0.0);
  const double compute = sh.value("h2d_copy", 0.0) + sh.value("forward", 0.0) +
                         sh.value("backward", 0.0) + sh.value("optimizer", 0.0);
  const double supply = m.at("loader").value("supply_samples_per_s", 0.0);
  const double consume = m.value("samples_per_s", 0.0);
  const int64_t workers = m.at("loader").value("workers", int64_t{0});
  const double util = m.at("loader").value("cpu_utilisation", 0.0);
  nlohmann::json d;
  std::vector<std::string> evidence, advice;
  auto pct = [](double x) { return format_fixed(100 * x) + "%"; };
  if (data >= 0.15) {
    d["verdict"] = "data-bound";
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
    d["verdict"] = "communication-bound";
    evidence.push_back("all-reduce took " + pct(comm) + " of the step (threshold 25%)");
    advice.push_back("larger gradient buckets, overlap with backward, or 1-bit Adam compression");
  } else if (other >= 0.25) {
    d["verdict"] = "host-overhead-bound";
    evidence.push_back(
        pct(other) +
        " of the step went outside data, copy, forward, backward and optimizer (threshold 25%)");
    advice.push_back(
        "fewer host synchronisations per step: raise train.log_every, evaluate less often");
    advice.push_back("a larger data.batch_size amortises per-step overhead");
  } else {
    d["verdict"] = "compute-bound";
    evidence.push_back("forward, backward and optimizer took " + pct(compute) +
                       " of the step; data wait " + pct(data));
    if (supply > 0)
      evidence.push_back("the loader could supply " +
                         format_fixed(supply / std::max(1.0, consume), 1) +
                         "x what the model consumes");
    advice.push_back(
        "bf16 autocast (amp.enabled=true), channels_last, and the oneDNN kernel route cut compute; "
        "see the operator table");
  }
  const auto& mem = m.at("memory");
  const auto rss = mem.value("rss_per_step_mib", std::vector<double>{});
  bool rising = rss.size() >= 4;
  for (size_t i = 1; i < rss.size() && rising; ++i) rising = rss[i] >= rss[i - 1];
  if (rising && mem.value("rss_growth_mib", 0.0) > 32) {
    d["memory"] = "RSS rose at every active step (+" +
                  format_fixed(mem.value("rss_growth_mib", 0.0)) +
                  " MiB): stair-step growth means tensors from earlier steps are kept alive (a "
                  "loss kept with its graph, a list of outputs)";
  }
  if (mem.value("page_faults_per_step", 0.0) > 2000)
    advice.push_back("page faults per step are high (" +
                     format_fixed(mem.value("page_faults_per_step", 0.0), 0) +
                     "): runtime.allocator=retain keeps freed memory");
  d["evidence"] = evidence;
  d["advice"] = advice;
  return d;
}

nlohmann::json profile_config(const config::ExperimentConfig& cfg, const ProfileOptions& o) {
  if (o.active < 1 || o.wait < 0 || o.warmup < 0)
    throw ConfigError("profile", "need --active >= 1 and non-negative --wait/--warmup",
                      "e.g. --wait 5 --warmup 10 --active 30");
  // Runtime, device and splits once; every pass below builds its pipeline on these splits.
  const auto base = train::build_pipeline(cfg, dist::World{}, train::model_only());
  const torch::Device device = base->device;
  const train::Splits& splits = base->splits;
  nlohmann::json report = {
      {"config", o.config_path},
      {"model", cfg.model.name},
      {"device", device.str()},
      {"schedule", {{"wait", o.wait}, {"warmup", o.warmup}, {"active", o.active}}},
      {"runtime", runtime::describe()}};
  spdlog::info("[profile] pass 1: phase clock only ({} + {} + {} steps)", o.wait, o.warmup,
               o.active);
  report["measure"] = measure(cfg, splits, o, nullptr);
  report["diagnosis"] = diagnose(report["measure"]);
  if (o.ops) {
    spdlog::info("[profile] pass 2: with the operator profiler");
    OpProfiler prof({});
    auto m2 = measure(cfg, splits, o, &prof);
    // The phase-only pass again after it: the overhead compares against the faster of the two
    // plain passes, so machine drift between passes is not charged to the profiler.
    spdlog::info("[profile] pass 3: phase clock only again (baseline for the overhead)");
    const auto m3 = measure(cfg, splits, o, nullptr);
    const double base =
        std::min(report["measure"]["step_ms"].get<double>(), m3["step_ms"].get<double>());
    const double with = m2["step_ms"];
    report["profiler_overhead"] = {
        {"step_ms_without", base},
        {"step_ms_without_passes", {report["measure"]["step_ms"], m3["step_ms"]}},
        {"step_ms_with", with},
        {"ratio", with / base}};
    nlohmann::json ops = nlohmann::json::array();
    const double total_self = prof.total_self_us();
    for (const auto& op : prof.top(o.top))
      ops.push_back({{"name", op.name},
                     {"calls_per_step", static_cast<double>(op.calls) / o.active},
                     {"self_ms_per_step", op.self_us / 1e3 / o.active},
                     {"total_ms_per_step", op.total_us / 1e3 / o.active},
                     {"self_share", total_self > 0 ? op.self_us / total_self : 0}});
    report["operators"] = ops;
    report["operator_calls_per_step"] = static_cast<double>(prof.total_calls()) / o.active;
    if (!o.out_dir.empty()) {
      fs::create_directories(o.out_dir);
      const std::string trace = (fs::path(o.out_dir) / "trace.json.gz").string();
      const int64_t n = prof.write_chrome_trace_gz(trace, o.trace_cap_bytes);
      report["trace"] = {{"path", trace},
                         {"events", n},
                         {"bytes", fs::file_size(trace)},
                         {"truncated", prof.truncated() || n < prof.total_calls()}};
    }
  }
  if (!o.sweep.empty()) {
    const auto eq = o.sweep.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 >= o.sweep.size())
      throw ConfigError("--sweep", "expected KEY=v1,v2,... but got '" + o.sweep + "'",
                        "e.g. --sweep data.workers=0,1,2,4");
    const std::string key = o.sweep.substr(0, eq);
    std::vector<std::string> values;
    std::stringstream ss(o.sweep.substr(eq + 1));
    for (std::string v; std::getline(ss, v, ',');)
      if (!v.empty()) values.push_back(v);
    nlohmann::json rows = nlohmann::json::array();
    double best = -1;
    std::string best_v;
    const bool env_key = is_env_name(key);
    for (const auto& v : values) {
      spdlog::info("[profile] sweep {}={}", key, v);
      nlohmann::json m;
      if (env_key) {  // read by runtimes at start-up (OpenMP, glibc): measured in a child process
        m = measure_in_child(o, key, v);
      } else {
        auto ov = o.overrides;
        ov.push_back(key + "=" + v);
        m = measure(config::load_experiment(o.config_path, ov), splits, o, nullptr);
      }
      rows.push_back({{"value", v}, {"measure", m}, {"verdict", diagnose(m)["verdict"]}});
      if (m["samples_per_s"].get<double>() > best) best = m["samples_per_s"], best_v = v;
    }
    const double first = rows[0]["measure"]["samples_per_s"];
    report["sweep"] = {{"key", key},
                       {"rows", rows},
                       {"best", best_v},
                       {"best_samples_per_s", best},
                       {"speedup_vs_first", best / std::max(1e-9, first)}};
  }
  if (!o.out_dir.empty()) {
    fs::create_directories(o.out_dir);
    write_file_atomic((fs::path(o.out_dir) / "profile.json").string(), report.dump(2) + "\n");
    write_file_atomic((fs::path(o.out_dir) / "phases.svg").string(), phases_svg(report));
    write_file_atomic((fs::path(o.out_dir) / "report.txt").string(), profile_text(report));
  }
  return report;
}

std::string profile_text(const nlohmann::json& r) {
  std::ostringstream o;
  const auto& m = r.at("measure");
  o << "mltrain profile: " << r.value("model", "") << " on " << r.value("device", "") << ", batch "
    << m.value("batch_size", 0) << " x accumulate " << m.value("accumulate", 1) << "; "
    << m.value("steps", 0) << " measured steps after " << r["schedule"].value("wait", 0)
    << " skipped and " << r["schedule"].value("warmup", 0) << " warm-up\n";
  o << "step " << format_fixed(m.value("step_ms", 0.0), 2) << " ms, "
    << format_fixed(m.value("samples_per_s", 0.0), 0) << " samples/s";
  if (r.contains("profiler_overhead"))
    o << "; operator profiler overhead "
      << format_fixed(100 * (r["profiler_overhead"].value("ratio", 1.0) - 1)) << "% ("
      << format_fixed(r["profiler_overhead"].value("step_ms_with", 0.0), 2) << " ms/step with it)";
  o << "\n\n  phase          ms/step    share\n";
  for (size_t i = 0; i < kPhases; ++i) {
    const char* n = phase_name(static_cast<Phase>(i));
    char line[96];
    std::snprintf(line, sizeof line, "  %-12s %9.3f  %6.1f%%\n", n, m["phase_ms"].value(n, 0.0),
                  100 * m["phase_share"].value(n, 0.0));
    o << line;
  }
  const auto& l = m.at("loader");
  o << "\nloader: " << l.value("workers", 0) << " worker(s), prefetch " << l.value("prefetch", 0)
    << ": supplies " << format_fixed(l.value("supply_samples_per_s", 0.0), 0)
    << " samples/s alone; threads busy " << format_fixed(100 * l.value("cpu_utilisation", 0.0))
    << "% while training\n";
  const auto& mem = m.at("memory");
  o << "memory: RSS " << format_fixed(mem.value("rss_mib", 0.0)) << " MiB (peak "
    << format_fixed(mem.value("peak_rss_mib", 0.0)) << "), "
    << (mem.value("rss_growth_mib", 0.0) >= 0 ? "+" : "")
    << format_fixed(mem.value("rss_growth_mib", 0.0)) << " MiB over the measured steps; "
    << format_fixed(mem.value("page_faults_per_step", 0.0), 0) << " page faults/step";
  if (mem.contains("cuda_allocated_mib"))
    o << "; CUDA allocated " << format_fixed(mem.value("cuda_allocated_mib", 0.0))
      << " MiB, reserved " << format_fixed(mem.value("cuda_reserved_mib", 0.0)) << " MiB, peak "
      << format_fixed(mem.value("cuda_peak_allocated_mib", 0.0));
  o << "\n";
  if (r.contains("operators")) {
    o << "\ntop operators by self CPU time ("
      << format_fixed(r.value("operator_calls_per_step", 0.0), 0) << " operator calls per step)\n";
    char line[200];
    std::snprintf(line, sizeof line, "  %-44s %8s %10s %10s %7s\n", "operator", "calls", "self ms",
                  "total ms", "self%");
    o << line;
    for (const auto& op : r["operators"]) {
      std::snprintf(line, sizeof line, "  %-44.44s %8.1f %10.3f %10.3f %6.1f%%\n",
                    op.value("name", "").c_str(), op.value("calls_per_step", 0.0),
                    op.value("self_ms_per_step", 0.0), op.value("total_ms_per_step", 0.0),
                    100 * op.value("self_share", 0.0));
      o << line;
    }
    o << "  (per step; CPU time between each op's entry and exit. On CUDA kernels run "
         "asynchronously: the\n"
         "   synchronised phase times above are the GPU's.)\n";
  }
  const auto& d = r.at("diagnosis");
  o << "\ndiagnosis: " << d.value("verdict", "") << "\n";
  for (const auto& e : d["evidence"]) o << "  evidence: " << e.get<std::string>() << "\n";
  if (d.contains("memory")) o << "  memory: " << d["memory"].get<std::string>() << "\n";
  for (const auto& a : d["advice"]) o << "  change: " << a.get<std::string>() << "\n";
  if (r.contains("sweep")) {
    const auto& s = r["sweep"];
    o << "\nsweep " << s.value("key", "") << ":\n";
    char line[200];
    std::snprintf(line, sizeof line, "  %-10s %12s %12s %10s %10s  %s\n", "value", "samples/s",
                  "loader s/s", "data%", "step ms", "verdict");
    o << line;
    for (const auto& row : s["rows"]) {
      const auto& rm = row["measure"];
      std::snprintf(line, sizeof line, "  %-10s %12.0f %12.0f %9.1f%% %10.2f  %s\n",
                    row.value("value", "").c_str(), rm.value("samples_per_s", 0.0),
                    rm["loader"].value("supply_samples_per_s", 0.0),
                    100 * rm["phase_share"].value("data", 0.0), rm.value("step_ms", 0.0),
                    row.value("verdict", "").c_str());
      o << line;
    }
    o << "  best: " << s.value("key", "") << "=" << s.value("best", "") << " at "
      << format_fixed(s.value("best_samples_per_s", 0.0), 0) << " samples/s ("
      << format_fixed(s.value("speedup_vs_first", 1.0), 2) << "x the first value)\n";
  }
  if (r.contains("trace"))
    o << "\ntrace: " << r["trace"].value("path", "") << " (" << r["trace"].value("events", 0)
      << " events" << (r["trace"].value("truncated", false) ? ", capped" : "")
      << "; open in https://ui.perfetto.dev)\n";
  return o.str();
}

std::string phases_svg(const nlohmann::json& r) {
  struct Bar {
    std::string label;
    nlohmann::json ms;
  };
  std::vector<Bar> bars = {{"measured", r["measure"]["phase_ms"]}};
  if (r.contains("sweep"))
    for (const auto& row : r["sweep"]["rows"])
      bars.push_back(
          {r["sweep"].value("key", "") + "=" + row.value("value", ""), row["measure"]["phase_ms"]});
  const char* colours[] = {"#d62728", "#9467bd", "#1f77b4", "#ff7f0e",
                           "#2ca02c", "#8c564b", "#7f7f7f"};
  double max_ms = 1e-9;
  for (const auto& b : bars) {
    double t = 0;
    for (size_t i = 0; i < kPhases; ++i) t += b.ms.value(phase_name(static_cast<Phase>(i)), 0.0);
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
    << xml_escape(r.value("model", "")) << " on " << xml_escape(r.value("device", ""))
    << "</text>\n";
  const double scale = (W - left - right) / max_ms;
  for (size_t b = 0; b < bars.size(); ++b) {
    const int y = top + static_cast<int>(b) * (bar_h + gap);
    s << "<text x=\"" << left - 8 << "\" y=\"" << y + bar_h / 2 + 4 << "\" text-anchor=\"end\">"
      << xml_escape(bars[b].label) << "</text>\n";
    double x = left, total = 0;
    for (size_t i = 0; i < kPhases; ++i) {
      const char* n = phase_name(static_cast<Phase>(i));
      const double ms = bars[b].ms.value(n, 0.0);
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
