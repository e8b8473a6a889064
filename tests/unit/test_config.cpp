// Config: periods, overrides, YAML reading (accept/reject tables), print-config round trip.
#include <catch2/catch.hpp>

#include "temp_dir.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "mltrain/config/experiment.hpp"
#include "mltrain/config/reader.hpp"
#include "mltrain/core/error.hpp"

using namespace mltrain;
using namespace mltrain::config;

static std::string write_tmp(const std::string& name, const std::string& text) {
  static const auto dir = mltrain::testing::fresh_temp_dir("config");
  auto p = (dir / name).string();
  std::ofstream(p) << text;
  return p;
}

static std::string config_error(const std::string& path, const std::vector<std::string>& ov = {}) {
  try {
    load_experiment(path, ov);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("periods: accept table", "[period]") {
  struct Row {
    const char* text;
    Period::Unit unit;
    double value;
    int64_t steps_at_100;
  };
  const Row rows[] = {
      {"10ep", Period::Unit::kEpochs, 10, 1000},    {"2e", Period::Unit::kEpochs, 2, 200},
      {"0.5ep", Period::Unit::kEpochs, 0.5, 50},    {"500u", Period::Unit::kSteps, 500, 500},
      {"3steps", Period::Unit::kSteps, 3, 3},       {"1 ep", Period::Unit::kEpochs, 1, 100},
      {"never", Period::Unit::kNever, 0, 0},        {"0.001ep", Period::Unit::kEpochs, 0.001, 1},
      {".0005e", Period::Unit::kEpochs, 0.0005, 1},  // printed 0.0005ep (once 5e-04ep: unreadable)
      {"0u", Period::Unit::kNever, 0, 0},            // zero is how users turn a period off
      {"0ep", Period::Unit::kNever, 0, 0},          {"0.0 ep", Period::Unit::kNever, 0, 0},
  };
  for (const auto& r : rows) {
    INFO(r.text);
    std::string why;
    auto p = Period::try_parse(r.text, &why);
    REQUIRE(p.has_value());
    CHECK(p->unit == r.unit);
    CHECK(p->value == r.value);
    CHECK(p->to_steps(100) == r.steps_at_100);
    CHECK(Period::parse(p->str()) == *p);  // canonical text round-trips
  }
}

TEST_CASE("periods: reject table", "[period]") {
  const std::pair<const char*, const char*> rows[] = {
      {"10", "has no unit"},
      {"ep", "expected a number"},
      {"1.5u", "whole number"},
      {"-3ep", "expected a number"},
      {"0", "has no unit"},
      {"0min", "unknown unit"},
      {"5min", "unknown unit"},
      {"", "expected a number"},
      {"1e3u", "unknown unit"},
      {"2000000000000000u", "more than 10^15 steps"},  // found by fuzz_period: past int64 as 1e21u
      {"99999999999ep", "more than 10^9 epochs"},
  };
  for (const auto& [text, why_part] : rows) {
    INFO(text);
    std::string why;
    CHECK_FALSE(Period::try_parse(text, &why).has_value());
    CHECK_THAT(why, Catch::Contains(why_part));
  }
}

TEST_CASE("overrides: accept and reject table", "[overrides]") {
  Issues issues;
  auto ov = parse_overrides(
      {"optim.lr=0.01", "model.hidden=[64, 32]", "run.name=", "train.duration=3ep"}, issues);
  CHECK(issues.empty());
  CHECK(ov.size() == 4);
  CHECK(ov.at("model.hidden").value.IsSequence());

  const std::pair<const char*, const char*> bad[] = {
      {"optim.lr", "expected key.path=value"}, {"=3", "expected key.path=value"},
      {"optim..lr=1", "malformed key path"},   {"optim.lr=[1,", "not valid YAML"},
      {"opt-im.lr=1", "malformed key path"},
  };
  for (const auto& [text, why] : bad) {
    INFO(text);
    Issues is;
    parse_overrides({text}, is);
    REQUIRE(is.list().size() == 1);
    CHECK_THAT(is.list()[0].message, Catch::Contains(why));
  }
  Issues twice;
  auto later = parse_overrides({"optim.lr=1", "optim.lr=2"}, twice);  // the later one wins
  CHECK(twice.empty());
  CHECK(later.at("optim.lr").value.as<std::string>() == "2");
}

TEST_CASE("defaults alone are valid and overrides apply with precedence", "[config]") {
  auto cfg = load_experiment(
      "", {"optim.lr=0.5", "model.hidden=[8]", "data.workers=3", "train.duration=7u"});
  CHECK(cfg.optim.lr == 0.5);
  CHECK(cfg.model.hidden == std::vector<int64_t>{8});
  CHECK(cfg.data.workers.value == 3);
  CHECK(cfg.train.duration == Period::steps(7));
  CHECK(cfg.data.eval_batch_size.is_auto());  // auto: the training batch (pipeline resolves it)
  CHECK(load_experiment("", {"data.eval_batch_size=300"}).data.eval_batch_size.value == 300);
  auto file = write_tmp("prec.yaml", "optim:\n  lr: 0.2\n  name: sgd\n");
  auto from_file = load_experiment(file, {});
  CHECK(from_file.optim.lr == 0.2);
  auto overridden = load_experiment(file, {"optim.lr=0.3"});  // override beats the file
  CHECK(overridden.optim.lr == 0.3);
  CHECK(overridden.optim.name == "sgd");  // untouched keys keep the file's value
  CHECK(overridden.run.name == "prec");   // empty run.name falls back to the file stem
  // Zero warm-up is how a user turns it off (it was refused as "not a positive number").
  CHECK_FALSE(load_experiment("", {"schedule.warmup=0u"}).schedule.warmup.enabled());
  CHECK_FALSE(load_experiment("", {"schedule.warmup=0ep"}).schedule.warmup.enabled());
  try {
    load_experiment("", {"train.duration=0ep"});
    FAIL("a zero duration was accepted");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("train.duration: must not be 'never' or 0"));
  }
}

TEST_CASE("config reject table: every error names file:line:col and the key path", "[config]") {
  struct Row {
    const char* yaml;
    std::vector<std::string> expect;
  };
  const Row rows[] = {
      {"optim:\n  lrr: 0.1\n", {"bad.yaml:2:3: optim.lrr: unknown key (did you mean 'lr'?)"}},
      {"optim:\n  lr: 0.1\n  lr: 0.2\n",
       {"bad.yaml:3:3: optim.lr: duplicate key (first set at line 2)"}},
      {"optim:\n  lr: fast\n", {"bad.yaml:2:7: optim.lr: expected a number, got 'fast'"}},
      {"optim:\n  lr: -1\n", {"bad.yaml:2:7: optim.lr: must be > 0"}},
      {"optim:\n  name: lbfgs\n", {"optim.name: 'lbfgs' is not one of: sgd, adam, adamw"}},
      {"data:\n  batch_size: 12.5\n",
       {"bad.yaml:2:15: data.batch_size: expected a non-negative integer or auto, got '12.5'"}},
      {"data:\n  batch_size: auto\n",
       {"data.batch_size: auto needs train.global_batch", "set train.global_batch"}},
      {"data:\n  batch_size: auto\ntrain:\n  global_batch: 256\n  accumulate: 4\n",
       {"train.accumulate: with data.batch_size=auto"}},
      {"runtime:\n  memory_budget: 2 gigs\n",
       {"bad.yaml:2:18: runtime.memory_budget: '2 gigs' is not a size: write e.g. 512MiB"}},
      {"runtime:\n  memory_budget: -1GiB\n", {"runtime.memory_budget: '-1GiB' is not a size"}},
      {"memory:\n  checkpoint: some\n",
       {"memory.checkpoint: 'some' is not one of: none, blocks, every_n"}},
      {"memory:\n  micro_batch: 0\n", {"memory.micro_batch: must be > 0 or auto"}},
      {"data:\n  workers: many\n", {"data.workers: expected a non-negative integer or auto"}},
      {"data:\n  eval_batch_size: 0\n",
       {"bad.yaml:2:20: data.eval_batch_size: must be > 0 or auto"}},
      {"model:\n  script_executor: simple\n",
       {"model.script_executor: 'simple' is not one of: legacy, profiling"}},
      {"train:\n  final_eval: partial\n",
       {"bad.yaml:2:15: train.final_eval: 'partial' is not one of: full, sample, none"}},
      {"train:\n  final_eval_samples: 0\n", {"train.final_eval_samples: must be > 0"}},
      {"data:\n  image:\n    cache: disk\n",
       {"bad.yaml:3:12: data.image.cache: 'disk' is not one of: none, memory"}},
      {"train:\n  duration: 10\n",
       {"train.duration: '10' has no unit: write 10ep (epochs) or 10u"}},
      {"train:\n  duration: never\n", {"train.duration: must not be 'never'"}},
      {"model:\n  hidden: 5\n", {"model.hidden: expected a list"}},
      {"model:\n  hidden: [5, 0]\n", {"model.hidden: every entry must be > 0"}},
      {"data: 5\n", {"bad.yaml:1:7: data: expected a mapping"}},
      {"modle:\n  name: cnn\n", {"bad.yaml:1:1: modle: unknown key (did you mean 'model'?)"}},
      {"data:\n  shuffle: maybe\n", {"data.shuffle: expected true or false, got 'maybe'"}},
      {"optim:\n  param_groups:\n    - pattern: '*.bias'\n      lr_mul: 2\n",
       {"bad.yaml:4:7: optim.param_groups[0].lr_mul: unknown key (did you mean 'lr_mult'?)"}},
      // Several problems: all are reported at once.
      {"optim:\n  lr: 0\n  betaa1: 0.9\ndata:\n  batch_size: 0\n",
       {"3 config errors", "optim.lr: must be > 0",
        "optim.betaa1: unknown key (did you mean 'beta1'?)", "data.batch_size: must be > 0"}},
      {"model:\n  name: torchscript\n", {"model.path: required when model.name is torchscript"}},
      // The field guide's recipes: percentiles in (0, 100], noise only where there are embeddings.
      {"clip:\n  element_percentile: 0\n",
       {"bad.yaml:2:23: clip.element_percentile: must be in (0, 100]"}},
      {"clip:\n  element_percentile: 100.5\n", {"clip.element_percentile: must be in (0, 100]"}},
      {"data:\n  sampler:\n    name: weighted\n    oversample: [10, 3]\n",
       {"data.sampler.oversample: class 10 does not exist: classes are 0..9"}},
      {"data:\n  sampler:\n    name: weighted\n    class_weights: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]\n",
       {"data.sampler.class_weights: the weights sum to zero"}},
      {"data:\n  sampler:\n    name: weighted\n    class_weights: [1, 2]\n",
       {"data.sampler.class_weights: 2 weights for 10 classes"}},
      {"data:\n  sampler:\n    class_weights: [1, 2]\n",
       {"data.sampler.name: class_weights and oversample are for the weighted sampler"}},
      {"data:\n  augment:\n    curriculum: three_phase\n    mixup: {p: 0.5, window: [0.5, 1]}\n",
       {"data.augment.mixup.window: data.augment.curriculum sets this window"}},
      {"optim:\n  name: adam\n  momentum_reference_batch: 256\n",
       {"optim.momentum_reference_batch: momentum compensation rescales SGD's momentum"}},
      {"model:\n  name: mlp\n  embedding_noise: 0.1\n",
       {"model.embedding_noise: model mlp has no token embeddings"}},
      {"model:\n  name: cnn\n  share: gated\n",
       {"model.share: gated weight sharing is built for gpt's repeated transformer blocks; model "
        "cnn has none"}},
      {"task:\n  name: language_model\ndata:\n  dataset: tokens\nmodel:\n  name: gpt\n  "
       "n_layer: 1\n  share: gated\n",
       {"model.share: a gpt with n_layer 1 has no repeated blocks"}},
      {"model:\n  name: mlp\n  share: gated_input\n",
       {"model.share: gated weight sharing is built for gpt's repeated transformer blocks; model "
        "mlp"}},
      {"model:\n  share: tied\n", {"model.share"}},
  };
  for (const auto& r : rows) {
    INFO(r.yaml);
    auto path = write_tmp("bad.yaml", r.yaml);
    auto err = config_error(path);
    REQUIRE_FALSE(err.empty());
    for (const auto& e : r.expect) CHECK_THAT(err, Catch::Contains(e));
  }
}

TEST_CASE("recipe notes: an SGD weight decay on Adam is flagged, with its fix", "[config]") {
  auto notes = [](const std::vector<std::string>& ov) {
    return config::recipe_notes(config::load_experiment("", ov));
  };
  const auto adam = notes({"optim.name=adam", "optim.weight_decay=5e-4"});
  REQUIRE(adam.size() == 1);
  CHECK_THAT(adam[0], Catch::Contains("optim.weight_decay 0.0005 with adam") &&
                          Catch::Contains("(5e-05)") && Catch::Contains("use adamw"));
  const auto adamw = notes({"optim.name=adamw", "optim.weight_decay=1e-4"});
  REQUIRE(adamw.size() == 1);
  CHECK_THAT(adamw[0], Catch::Contains("decoupled"));
  CHECK(notes({"optim.name=sgd", "optim.weight_decay=5e-4"}).empty());
  CHECK(notes({"optim.name=adamw", "optim.weight_decay=0.01"}).empty());
  CHECK(notes({"optim.name=adam", "optim.weight_decay=0"}).empty());
}

TEST_CASE("memory sizes: units, and what is refused", "[config][memory]") {
  int64_t b = -1;
  CHECK(config::parse_memory_size("none", b).empty());
  CHECK(b == 0);
  CHECK(config::parse_memory_size("512MiB", b).empty());
  CHECK(b == 512LL << 20);
  CHECK(config::parse_memory_size("1.5GiB", b).empty());
  CHECK(b == 3LL << 29);
  CHECK(config::parse_memory_size("2GB", b).empty());
  CHECK(b == 2000000000LL);
  CHECK(config::parse_memory_size("64KiB", b).empty());
  CHECK(b == 65536);
  for (const char* bad : {"", "12", "MiB", "0MiB", "-5MiB", "5 MiB", "1e30GB", "5mib", "nanGiB"}) {
    INFO(bad);
    CHECK_FALSE(config::parse_memory_size(bad, b).empty());
  }
  // data.batch_size reads as a number, prints `auto` back.
  auto cfg = config::load_experiment("", {"data.batch_size=auto", "train.global_batch=512"});
  CHECK(cfg.data.batch_size.is_auto());
  CHECK_THAT(config::to_yaml(cfg), Catch::Contains("batch_size: auto"));
  auto again = config::load_experiment("", {"data.batch_size=64"});
  CHECK(again.data.batch_size == 64);
}

TEST_CASE("override errors name the override", "[config]") {
  auto err = config_error("", {"optim.lrr=0.1"});
  CHECK_THAT(err,
             Catch::Contains(
                 "override 'optim.lrr=0.1': optim.lrr: unknown key (did you mean 'optim.lr'?)"));
  err = config_error("", {"optim.lr=abc"});
  CHECK_THAT(err,
             Catch::Contains("override 'optim.lr=abc': optim.lr: expected a number, got 'abc'"));
}

TEST_CASE("YAML syntax errors name the line", "[config]") {
  auto path = write_tmp("syntax.yaml", "optim:\n  lr: [0.1\n");
  auto err = config_error(path);
  CHECK_THAT(err, Catch::Contains("syntax.yaml:"));
  CHECK_THAT(err, Catch::Contains("not valid YAML"));
  CHECK_THAT(config_error("/nonexistent/x.yaml"), Catch::Contains("config file not found"));
}

TEST_CASE("print-config round-trips byte for byte", "[config]") {
  auto path = write_tmp(
      "rt.yaml",
      "optim:\n  lr: 0.003\n  param_groups:\n    - pattern: '*.bias'\n      lr_mult: 2\n"
      "model:\n  hidden: [7, 3]\n  name: mlp\ntrain:\n  duration: 2.5ep\ndata:\n  workers: auto\n"
      "run:\n  name: \"quote\\\"d\"\n");
  auto cfg = load_experiment(path, {"data.mean=0.1"});
  const std::string once = to_yaml(cfg);
  auto path2 = write_tmp("rt2.yaml", once);
  const std::string twice = to_yaml(load_experiment(path2, {}));
  CHECK(once == twice);
  CHECK_THAT(once, Catch::Contains("lr: 0.003"));
  CHECK_THAT(once, Catch::Contains("duration: 2.5ep"));
  CHECK_THAT(once, Catch::Contains("- pattern: \"*.bias\""));
  CHECK_THAT(once, Catch::Contains("name: \"quote\\\"d\""));
}

TEST_CASE("schema lists every key with type, default and doc", "[config]") {
  const std::string s = schema_text();
  for (const char* key : {"run.seed", "runtime.allocator", "data.workers", "model.init",
                          "optim.param_groups[].lr_mult", "train.duration", "checkpoint.resume"})
    CHECK_THAT(s, Catch::Contains(key));
  CHECK_THAT(s, Catch::Contains("optim.lr"));
  CHECK_THAT(s, Catch::Contains("0.001"));  // the real default, from the one declaration
}

TEST_CASE("did-you-mean uses edit distance", "[config]") {
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(did_you_mean("batchsize", {"batch_size", "workers"}) == "batch_size");
  CHECK(did_you_mean("zzzzzz", {"lr", "name"}).empty());
}
