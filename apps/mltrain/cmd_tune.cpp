#include <unistd.h>

#include <climits>
#include <filesystem>
#include <iostream>

#include "commands.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/core/process.hpp"
#include "mltrain/tune/analysis.hpp"
#include "mltrain/tune/array.hpp"
#include "mltrain/tune/export.hpp"
#include "mltrain/tune/folds.hpp"
#include "mltrain/tune/study.hpp"

namespace fs = std::filesystem;

namespace mltrain::cli {

void setup_tune(CLI::App& app, Action& run) {
  struct Opts {
    std::string study;
    std::vector<std::string> overrides;
    bool json = false, quiet = false;
    std::string report_dir, export_dir, journal_out;
    tune::ArrayOptions array;
    bool submit = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("tune",
                                 "hyperparameter search: mltrain tune STUDY.yaml [key.path=value "
                                 "...]; mltrain tune report STUDY_DIR");
  auto* rep = sub->add_subcommand(
      "report",
      "summarise a study folder (tables, importance, SVG plots): mltrain tune report STUDY_DIR");
  rep->add_option("study_dir", o->report_dir, "the study folder (runs/tune/<name>)")->required();
  rep->add_flag("--json", o->json, "print the JSON summary");
  auto* exp = sub->add_subcommand(
      "export",
      "a study folder in Optuna's JournalStorage format, for optuna.load_study and "
      "optuna-dashboard: mltrain tune export STUDY_DIR --optuna-journal OUT.log");
  exp->add_option("study_dir", o->export_dir, "the study folder (runs/tune/<name>)")->required();
  exp->add_option("--optuna-journal", o->journal_out, "the journal file to write")->required();
  auto fo = std::make_shared<tune::FoldGroupOptions>();
  auto* folds = sub->add_subcommand(
      "folds",
      "one cross-validated trial (run by the study driver): mltrain tune folds --k K --seed S "
      "--metric M -- COMMAND...; the folds' JSON lines averaged per step");
  folds->add_option("--k", fo->folds, "folds (children run at once)")
      ->required()
      ->check(CLI::Range(2, 1000));
  folds->add_option("--seed", fo->seed, "the fold permutation's seed");
  folds->add_option("--metric", fo->metrics, "metric to average (repeatable)")->required();
  folds->add_flag(
      "--train-overrides", fo->train_overrides,
      "append data.folds/fold/fold_seed and run.name=<--run-name>_f<i> (mltrain train)");
  folds->add_option("--run-name", fo->run_name, "the group's run name");
  folds->add_option("--log-dir", fo->log_dir, "each fold's stderr as <dir>/fold<i>.log");
  folds->add_option("command", fo->argv, "the trial's command, after --")->required();
  sub->add_option("study", o->study, "study file (see configs/tune/*.yaml)");
  sub->add_option(
      "overrides", o->overrides,
      "key.path=value overrides of the study file, e.g. sampler.name=gp study.n_trials=50");
  sub->add_flag("--json", o->json, "print the JSON summary");
  sub->add_flag("-q,--quiet", o->quiet, "no per-trial lines on stderr");
  auto* arr = sub->add_option("--slurm-array", o->array.tasks,
                              "write (--submit: submit) a Slurm array job of N study drivers on "
                              "the shared journal, <study dir>/tune-array.sbatch")
                  ->check(CLI::Range(1, 100000));
  sub->add_option("--time", o->array.time, "--slurm-array: each task's time limit")
      ->capture_default_str();
  sub->add_option("--partition", o->array.partition, "--slurm-array: partition");
  sub->add_option("--cpus-per-task", o->array.cpus_per_task,
                  "--slurm-array: CPUs per task (0: max_concurrent x trial.threads)");
  sub->add_flag("--submit", o->submit, "--slurm-array: submit with sbatch, print the job id");
  sub->add_flag("--allow-local-journal", o->array.allow_local,
                "--slurm-array: accept a node-local study.dir (every task on this node)");
  sub->callback([o, &run, rep, folds, fo, arr, exp] {
    run = [o, rep, folds, fo, arr, exp] {
      if (folds->parsed()) return tune::run_fold_group(*fo);
      if (exp->parsed()) {
        const auto r = tune::export_optuna_journal(o->export_dir, o->journal_out);
        std::cout << "wrote " << o->journal_out << ": study " << r.study_name << ", " << r.trials
                  << " trial(s) (optuna.load_study(study_name=\"" << r.study_name
                  << "\", storage=JournalStorage(JournalFileBackend(\"" << o->journal_out
                  << "\"))))\n";
        return 0;
      }
      if (rep->parsed()) {
        auto cfg = tune::study_config_from_folder(o->report_dir);
        const auto trials = tune::read_trials(cfg.study_dir(), cfg.space);
        const auto s = tune::write_study_outputs(cfg, trials);
        std::cout << (o->json ? s.dump(2) + "\n" : tune::study_text(s));
        return 0;
      }
      if (o->study.empty())
        throw ConfigError("mltrain tune", "no study file given",
                          "mltrain tune STUDY.yaml, or mltrain tune report STUDY_DIR");
      const auto cfg = tune::load_study_config(o->study, o->overrides);
      if (arr->count() > 0) {
        tune::check_shared_study_dir(cfg, o->array.allow_local);
        auto a = o->array;
        a.mltrain = self_exe();
        a.study_file = fs::absolute(o->study).string();
        a.workdir = fs::current_path().string();
        for (const auto& ov : o->overrides)
          if (ov.rfind("study.dir=", 0) != 0) a.overrides.push_back(ov);
        const auto path = tune::write_array_script(cfg, a);
        std::cout << "wrote " << path << "\n";
        if (o->submit) std::cout << "submitted job " << sbatch_submit(path) << "\n";
        return 0;
      }
      const auto s = tune::run_study(cfg, {self_exe(), o->quiet});
      std::cout << (o->json ? s.dump(2) + "\n" : tune::study_text(s));
      if (s.value("complete", 0) == 0)  // a study with no result is a failure, whatever the cause
        throw RuntimeError(s.value("dir", cfg.name()),
                           "no trial completed (" + std::to_string(s.value("failed", 0)) +
                               " failed, " + std::to_string(s.value("pruned", 0)) + " pruned)",
                           "see trials.csv and trials/<trial>.log in the study folder");
      return 0;
    };
  });
}

}  // namespace mltrain::cli
