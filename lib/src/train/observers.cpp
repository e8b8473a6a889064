#include "mltrain/train/observers.hpp"
#include "mltrain/train/invariant.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <iostream>

#include "mltrain/config/format.hpp"
#include "mltrain/runtime/compat.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/fault.hpp"
#include "mltrain/dist/heartbeat.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/runtime/runtime.hpp"
#include "mltrain/formats/safetensors.hpp"

namespace mltrain::train {
namespace fs = std::filesystem;

static double epoch_float(Trainer& t) {
  return t.progress().epoch +
         double(t.progress().batch_in_epoch) / std::max<int64_t>(1, t.steps_per_epoch());
}

MetricsWriter::MetricsWriter(const fs::path& run_dir, bool tensorboard, bool eval_to_stdout)
    : dir_(run_dir), eval_to_stdout_(eval_to_stdout) {
  if (tensorboard) tb_ = std::make_unique<formats::TbWriter>(run_dir.string());
  const bool fresh = !fs::exists(run_dir / "metrics.csv");
  jsonl_.open(run_dir / "metrics.jsonl", std::ios::app);
  csv_.open(run_dir / "metrics.csv", std::ios::app);
  if (fresh) csv_ << csv_header() << "\n" << std::flush;
  check_written();
}

// A full disk or a read-only folder must stop the run, not drop its records silently.
void MetricsWriter::check_written() const {
  for (const auto& [stream, name] : {std::pair{&jsonl_, "metrics.jsonl"}, {&csv_, "metrics.csv"}})
    if (!stream->good())
      throw RuntimeError((dir_ / name).string(),
                         std::string("write failed: ") + std::strerror(errno),
                         "free disk space (or make the run folder writable), then run the same "
                         "command again: it resumes from the latest checkpoint");
}

int64_t MetricsWriter::rewind(const fs::path& run_dir, int64_t step) {
  int64_t dropped = 0;  // metrics.jsonl records (metrics.csv holds the same rows)
  auto keep_lines = [&](const fs::path& file, auto keep, bool count) {
    std::ifstream in(file);
    if (!in) return;
    std::string line, out;
    for (bool first = true; std::getline(in, line); first = false) {
      if (keep(line, first))
        out += line + "\n";
      else
        dropped += count;
    }
    in.close();
    write_file_atomic(file.string(), out);
  };
  keep_lines(
      run_dir / "metrics.jsonl",
      [&](const std::string& line, bool) {
        try {
          const auto j = nlohmann::json::parse(line);
          if (j.value("event", "") == "summary") return false;  // the resumed run writes its own
          return !j.contains("step") || j["step"].get<int64_t>() <= step;
        } catch (const std::exception&) {
          return false;  // torn by the kill, or not JSON at all
        }
      },
      true);
  keep_lines(
      run_dir / "metrics.csv",
      [&](const std::string& line, bool first) {
        if (first) return line == csv_header();
        const size_t a = line.find(','), b = line.find(',', a + 1);
        if (a == std::string::npos || b == std::string::npos) return false;
        int64_t s = 0;
        const auto r = std::from_chars(line.data() + a + 1, line.data() + b, s);
        return r.ec == std::errc() && r.ptr == line.data() + b && s <= step &&
               std::count(line.begin(), line.end(), ',') == 9;
      },
      false);
  return dropped;
}

const char* MetricsWriter::csv_header() {
  return "event,step,epoch,loss,accuracy,samples_per_s,data_wait,lr,grad_norm,time_s";
}

void MetricsWriter::write(const nlohmann::json& j) {
  jsonl_ << j.dump() << "\n"
         << std::flush;  // flushed per line: a killed run loses nothing it reported
  if (eval_to_stdout_ && j.value("event", "") == "eval") std::cout << j.dump() << std::endl;
  auto num = [&](const char* k) {
    return j.contains(k) && j[k].is_number() ? config::format_double(j[k].get<double>())
                                             : std::string();
  };
  csv_ << j["event"].get<std::string>() << "," << j["step"].get<int64_t>() << "," << num("epoch")
       << "," << num("loss") << "," << num("accuracy") << "," << num("samples_per_s") << ","
       << num("data_wait") << "," << num("lr") << "," << num("grad_norm") << "," << num("time_s")
       << "\n"
       << std::flush;
  check_written();
  if (tb_) {  // the same record, so TensorBoard and metrics.jsonl cannot disagree
    const std::string ev = j["event"].get<std::string>();
    const int64_t step = j["step"].get<int64_t>();
    for (const auto& [k, v] : j.items())
      if (k != "step" && v.is_number()) tb_->scalar(ev + "/" + k, step, v.get<double>());
    tb_->flush();
  }
}

void MetricsWriter::on_step_end(Trainer& t, const StepInfo& s) {
  w_.add(s);
  const int64_t hist = t.cfg().train.histograms_every.to_steps(t.steps_per_epoch());
  if (tb_ && hist > 0 && t.progress().step % hist == 0) {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : t.model().named_parameters()) {
      auto flat = p.detach().to(torch::kCPU, torch::kDouble).flatten().contiguous();
      tb_->histogram(
          "weights/" + name, t.progress().step,
          std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel()));
    }
  }
  if (!t.logs_step(t.progress().step)) return;
  nlohmann::json j = {{"event", "train"},
                      {"step", t.progress().step},
                      {"epoch", epoch_float(t)},
                      {"loss", w_.loss / w_.steps},
                      {"samples_per_s", w_.count / w_.step_s},
                      {"data_wait", w_.data_s / w_.step_s},
                      {"lr", s.lr},
                      {"grad_norm", w_.grad_norm / w_.steps},
                      {"grad_norm_max", w_.grad_norm_max},
                      {"skipped_steps", t.progress().skipped_steps},
                      {"rss_mib", runtime::current_rss_kib() / 1024.0},
                      {"time_s", t.progress().train_seconds}};
  if (w_.units > 0) j["accuracy"] = w_.accuracy();
  if (t.cfg().task.name == "language_model") j["tokens_per_s"] = w_.units / w_.step_s;
  if (t.cfg().label_smoothing.value > 0) j["label_smoothing"] = s.label_smoothing;
  if (s.loss_scale > 0) j["loss_scale"] = s.loss_scale;
  if (s.grad_underflow > t.cfg().amp.underflow_warn) j["grad_underflow"] = s.grad_underflow;
  if (s.micro_batch > 0 && s.micro_batch < t.cfg().data.batch_size)
    j["micro_batch"] = s.micro_batch;
  if (auto* aug = t.train_loader().augmenter(); aug && t.train_loader().augmented_samples() > 0) {
    j["augment_us_per_sample"] =
        1e6 * t.train_loader().augment_seconds() / t.train_loader().augmented_samples();
    j["augment_strength"] = aug->strength();
  }
  write(j);
  w_ = Window{};
}

void MetricsWriter::on_eval_end(Trainer& t, const EvalResult& r) {
  nlohmann::json j = {{"event", "eval"},
                      {"step", t.progress().step},
                      {"epoch", epoch_float(t)},
                      {"samples", r.count},  // over every rank
                      {"samples_per_s", r.count / std::max(1e-9, r.seconds)},
                      {"time_s", t.progress().train_seconds}};
  for (const auto& [k, v] : r.metrics) j[k] = v;  // loss, accuracy, r2, ...
  write(j);
}

// "loss 0.3120 accuracy 0.9012" or, for other tasks, their headline metrics.
static std::string metrics_text(const EvalResult& r) {
  std::string out;
  for (const auto& [k, v] : r.metrics)
    if (k.rfind("roc_auc_class", 0) != 0)
      out += (out.empty() ? "" : " ") + k + " " + fmt::format("{:.4f}", v);
  return out;
}

ConsoleReporter::ConsoleReporter(bool tty) : tty_(tty) {}

void ConsoleReporter::on_train_begin(Trainer& t) {
  spdlog::info("[train] {} steps ({} per epoch), starting at step {} (epoch {})", t.total_steps(),
               t.steps_per_epoch(), t.progress().step, t.progress().epoch);
}

void ConsoleReporter::on_step_end(Trainer& t, const StepInfo& s) {
  w_.add(s);
  const auto& p = t.progress();
  // Accuracy where the task counts it; language models: tokens/s next to samples/s.
  const std::string acc = w_.units > 0 ? fmt::format(" acc {:.4f}", w_.accuracy()) : "";
  const std::string rate = t.cfg().task.name == "language_model"
                               ? fmt::format("{:.0f} tokens/s", w_.units / w_.step_s)
                               : fmt::format("{:.0f} samples/s", w_.count / w_.step_s);
  if (tty_) {
    if (p.train_seconds - last_draw_ < 0.2 && p.step != t.total_steps()) return;
    last_draw_ = p.train_seconds;
    const int width = 30;
    const int filled = static_cast<int>(width * double(p.step) / t.total_steps());
    std::fprintf(stderr, "\r[%.*s%*s] %lld/%lld  ep %lld  loss %.4f %s  %s  ", filled,
                 "##############################", width - filled, "", (long long)p.step,
                 (long long)t.total_steps(), (long long)p.epoch, w_.loss / w_.steps, acc.c_str(),
                 rate.c_str());
    if (w_.steps >= 50) w_ = Window{};
    return;
  }
  if (!t.logs_step(p.step)) return;
  spdlog::info("[train] step {}/{} epoch {:.2f} loss {:.4f}{} {} data-wait {:.1f}%", p.step,
               t.total_steps(), epoch_float(t), w_.loss / w_.steps, acc, rate,
               100.0 * w_.data_s / w_.step_s);
  w_ = Window{};
}

void ConsoleReporter::on_eval_end(Trainer& t, const EvalResult& r) {
  if (tty_) std::fprintf(stderr, "\n");
  spdlog::info("[eval] step {} epoch {:.2f} {} ({:.1f}s elapsed)", t.progress().step,
               epoch_float(t), metrics_text(r), t.progress().train_seconds);
}

void ConsoleReporter::on_train_end(Trainer&) {
  if (tty_) std::fprintf(stderr, "\n");
}

void CheckpointWriter::save(Trainer& t) {
  const auto& p = t.progress();
  if (last_saved_ == p.step) return;
  // The doctor: the others wait for this rank while it writes; a phase given longer.
  t.enter(Phase::kCheckpoint);
  struct Back {
    Trainer& t;
    ~Back() { t.enter(Phase::kOther); }
  } back{t};
  nlohmann::json ts = {{"epoch", p.epoch},
                       {"batch_in_epoch", p.batch_in_epoch},
                       {"epoch_skip", p.epoch_skip},
                       {"world", t.world()},
                       {"batch_size", t.train_loader().options().batch_size},
                       {"train_seconds", p.train_seconds},
                       {"optimizer_steps", t.optimizer().steps()},
                       {"lr_scale", p.lr_scale},
                       {"skipped_steps", p.skipped_steps},
                       {"techniques", t.technique_state()}};
  if (t.cfg().distributed.invariance == "bitwise")
    ts["virtual_shards"] = t.cfg().distributed.virtual_shards;
  ts["invariance"] = t.cfg().distributed.invariance;
  if (p.time_to_target) ts["time_to_target"] = *p.time_to_target;
  ts["schedule_history"] = t.schedule().history();
  std::optional<double> monitor;
  if (auto e = t.last_eval()) {
    monitor = e->metric(config::checkpoint_monitor(t.cfg()), "checkpoint.monitor");
    ts["eval"] = e->metrics;
  }
  auto writer = [&](const fs::path& dir) {
    model::NamedTensors weights = t.model().named_parameters();
    for (auto& b : t.model().named_buffers()) weights.push_back(b);
    for (auto& [name, w] : weights)
      if (w.is_floating_point() && !torch::isfinite(w).all().item<bool>())
        throw RuntimeError(
            name, "is not finite at step " + std::to_string(p.step) + "; refusing to checkpoint it",
            "lower optim.lr; the previous checkpoint is intact");
    // A tied tensor under its other state_dict names too (checked once, above).
    for (const auto& [alias, owner] : t.model().tied_names())
      for (size_t i = 0, n = weights.size(); i < n; ++i)
        if (weights[i].first == owner) weights.emplace_back(alias, weights[i].second);
    formats::save_safetensors((dir / "model.safetensors").string(), weights,
                              {{"format", "pt"}, {"step", std::to_string(p.step)}});
    fault::pause("ckpt.write");  // the preemption tests signal here, mid-write
    auto state = t.optimizer().state();
    for (auto& e : t.technique_tensors()) state.push_back(e);
    for (auto& [name, w] : state)
      if (w.is_floating_point() && !torch::isfinite(w).all().item<bool>())
        throw RuntimeError(
            name, "is not finite at step " + std::to_string(p.step) + "; refusing to checkpoint it",
            "lower optim.lr; the previous checkpoint is intact");
    state.emplace_back("__rng_cpu__", compat::cpu_rng_state());
    if (t.device().is_cuda()) state.emplace_back("__rng_cuda__", compat::cuda_rng_state());
    formats::save_safetensors((dir / "state.safetensors").string(), state);
  };
  store_.save(p.step, writer, ts, monitor);
  last_saved_ = p.step;
}

bool checkpoint_due(Trainer& t) {
  const int64_t every = t.cfg().checkpoint.every.to_steps(t.steps_per_epoch());
  return every > 0 && t.progress().step % every == 0;
}

void CheckpointWriter::on_step_end(Trainer& t, const StepInfo&) {
  if (checkpoint_due(t)) save(t);
}

void CheckpointWriter::on_stop_request(Trainer& t, int signal) {
  spdlog::warn("[checkpoint] signal {} received: saving at step {} before stopping", signal,
               t.progress().step);
  save(t);
}

void CheckpointWriter::on_train_end(Trainer& t) { save(t); }

// A checkpoint continues bitwise only in the mode, and with the virtual shards, that wrote it.
static void check_invariance(const LoadedCheckpoint& ck, const config::ExperimentConfig& cfg) {
  const auto& ts = ck.trainer_state;
  const std::string was = ts.value("invariance", std::string("none"));
  const std::string now = cfg.distributed.invariance;
  const std::string file = (ck.dir / "trainer.json").string();
  if (was != now)
    throw ConfigError("distributed.invariance",
                      "is " + now + ", and the checkpoint " + file + " was written with " + was,
                      "resume with distributed.invariance=" + was +
                          ", or start a new run (checkpoint.resume=never or another run.name)");
  if (now != "bitwise") return;
  const int64_t v = ts.value("virtual_shards", int64_t{0});
  if (v != cfg.distributed.virtual_shards)
    throw ConfigError("distributed.virtual_shards",
                      "is " + std::to_string(cfg.distributed.virtual_shards) +
                          ", and the checkpoint " + file + " was written with " +
                          std::to_string(v) + " virtual shards",
                      "resume with distributed.virtual_shards=" + std::to_string(v) + " (worlds " +
                          invariant_worlds(v) + ")");
}

void restore_checkpoint(const LoadedCheckpoint& ck, Trainer& t) {
  const std::string mpath = (ck.dir / "model.safetensors").string();
  auto weights = formats::load_safetensors(mpath);
  torch::NoGradGuard no_grad;
  model::NamedTensors targets = t.model().named_parameters();
  for (auto& b : t.model().named_buffers()) targets.push_back(b);
  for (auto& [name, dst] : targets) {
    auto it = weights.find(name);
    if (it == weights.end())
      throw CheckpointError(mpath, "has no tensor '" + name + "' (written for another model?)",
                            "resume with the config that wrote it, or set checkpoint.resume=never");
    if (it->second.sizes() != dst.sizes())
      throw CheckpointError(mpath,
                            "tensor '" + name + "' has shape " + c10::str(it->second.sizes()) +
                                ", the model expects " + c10::str(dst.sizes()),
                            "resume with the config that wrote it, or set checkpoint.resume=never");
    dst.copy_(it->second);
  }
  const std::string spath = (ck.dir / "state.safetensors").string();
  auto state = formats::load_safetensors(spath);
  auto rng = state.find("__rng_cpu__");
  if (rng == state.end()) throw CheckpointError(spath, "missing the RNG state");
  compat::set_cpu_rng_state(rng->second);
  state.erase(rng);
  if (auto cu = state.find("__rng_cuda__"); cu != state.end()) {
    if (t.device().is_cuda()) compat::set_cuda_rng_state(cu->second);
    state.erase(cu);
  }
  t.load_technique_tensors(state);
  t.optimizer().load_state(state);
  const auto& ts = ck.trainer_state;
  check_invariance(ck, t.cfg());
  auto& p = t.progress();
  p.step = ck.step;
  p.epoch = ts.at("epoch").get<int64_t>();
  p.batch_in_epoch = ts.at("batch_in_epoch").get<int64_t>();
  p.epoch_skip = ts.value("epoch_skip", int64_t{0});
  // Written by a world of another size (or another per-rank batch): the rest of the epoch is
  // re-sharded (a checkpoint from before the world was recorded is taken as this world's).
  const int64_t old_world = ts.value("world", t.world());
  const int64_t old_batch = ts.value("batch_size", t.train_loader().options().batch_size);
  if (old_world < 1 || old_batch < 1)
    throw CheckpointError((ck.dir / "trainer.json").string(),
                          "records a world of " + std::to_string(old_world) + " and a batch of " +
                              std::to_string(old_batch),
                          "resume from an earlier checkpoint, or set checkpoint.resume=never");
  if (old_world != t.world() || old_batch != t.train_loader().options().batch_size)
    t.reshard(old_world, old_batch);
  p.train_seconds = ts.value("train_seconds", 0.0);
  if (ts.contains("time_to_target")) p.time_to_target = ts["time_to_target"].get<double>();
  p.lr_scale = ts.value("lr_scale", 1.0);
  p.skipped_steps = ts.value("skipped_steps", int64_t{0});
  if (ts.contains("techniques")) t.load_technique_state(ts["techniques"]);
  if (ts.contains("schedule_history"))
    t.schedule().set_history(ts["schedule_history"].get<std::vector<std::pair<int64_t, double>>>());
}

}  // namespace mltrain::train
