#include <iostream>

#include "commands.hpp"
#include "mltrain/tune/analysis.hpp"
#include "mltrain/core/fs.hpp"
#include "mltrain/report/runs.hpp"

namespace mltrain::cli {

void setup_runs(CLI::App& app, Action& run) {
  auto dir = std::make_shared<std::string>("runs");
  auto* sub = app.add_subcommand(
      "runs", "table of runs: status, best metric, steps, time: mltrain runs [DIR]");
  sub->add_option("dir", *dir, "runs folder (run.dir) or one run folder")->capture_default_str();
  sub->callback([dir, &run] {
    run = [dir] {
      std::cout << report::runs_table(report::find_runs(*dir));
      return 0;
    };
  });
}

void setup_report(CLI::App& app, Action& run) {
  struct Opts {
    std::vector<std::string> dirs;
    std::string out = "report.html";
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("report",
                                 "one self-contained HTML page comparing runs and tuning studies: "
                                 "mltrain report RUN_DIR|STUDY_DIR... [-o report.html]");
  sub->add_option("runs", o->dirs,
                  "run folders (runs/<name>/v<N>) and study folders (runs/tune/<name>)")
      ->required();
  sub->add_option("-o,--output", o->out, "HTML file to write")->capture_default_str();
  sub->callback([o, &run] {
    run = [o] {
      // Study folders (mltrain tune) become sections with their plots; everything else is a run.
      std::vector<std::filesystem::path> dirs;
      std::vector<std::string> sections;
      for (const auto& d : o->dirs) {
        if (std::filesystem::exists(std::filesystem::path(d) / "study.yaml"))
          sections.push_back(tune::study_html(d));
        else
          dirs.emplace_back(d);
      }
      write_file_atomic(o->out, report::html_report(dirs, sections));
      std::cout << "wrote " << o->out << " (" << dirs.size() << " run"
                << (dirs.size() == 1 ? "" : "s");
      if (!sections.empty())
        std::cout << ", " << sections.size() << " stud" << (sections.size() == 1 ? "y" : "ies");
      std::cout << ")\n";
      return 0;
    };
  });
}

}  // namespace mltrain::cli
