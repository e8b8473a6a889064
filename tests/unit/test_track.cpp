// The MLflow sink's pure parts: the URI check, params from a config, points from a record, the
// cursor, the git commit and the server target from settings and MLflow's variables. The sink
// against a real server is tests/cli/test_cli_track.cpp.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>

#include "mltrain/config/schema.hpp"
#include "mltrain/core/error.hpp"
#include "mltrain/track/mlflow.hpp"
#include "temp_dir.hpp"

using namespace mltrain;
namespace fs = std::filesystem;

TEST_CASE("tracking URIs: accepted and refused", "[track]") {
  struct Row {
    const char* uri;
    const char* problem;  // "" = accepted, else a piece of the message
  };
  const Row rows[] = {
      {"", ""},
      {"http://127.0.0.1:5000", ""},
      {"https://mlflow.example.org/prefix", ""},
      {"localhost:5000", "has no scheme: write http://localhost:5000"},
      {"file:///tmp/mlruns", "only http:// and https://"},
      {"databricks://profile", "only http:// and https://"},
      {"http://", "names no host"},
  };
  for (const auto& r : rows) {
    INFO(r.uri);
    const std::string p = config::tracking_uri_problem(r.uri);
    if (*r.problem == 0)
      CHECK(p.empty());
    else
      CHECK(p.find(r.problem) != std::string::npos);
  }
}

TEST_CASE("params: dotted keys, lists as flow YAML, long values cut", "[track]") {
  const std::string yaml =
      "optim:\n  lr: 0.001\n  name: adam\n  param_groups: []\n"
      "model:\n  hidden: [512, 256]\n  dropout: 0.1\n"
      "data:\n  csv: {}\n  root: /data\n  augment:\n    flip: {p: 0.5}\n"
      "run:\n  name: ''\n  note: " +
      std::string(7000, 'x') + "\n";
  const auto params = track::flatten_params(yaml);
  std::map<std::string, std::string> m(params.begin(), params.end());
  CHECK(m.at("optim.lr") == "0.001");
  CHECK(m.at("optim.name") == "adam");
  CHECK(m.at("optim.param_groups") == "[]");
  CHECK(m.at("model.hidden") == "[512, 256]");
  CHECK(m.at("data.csv") == "{}");
  CHECK(m.at("data.augment.flip.p") == "0.5");
  CHECK(m.at("run.name") == "");
  CHECK(m.at("run.note").size() == 6000);
  CHECK(m.at("run.note").substr(5997) == "...");
  CHECK(params.size() == m.size());  // no key twice
}

TEST_CASE("a record's points: numeric fields but step, named <event>/<field>", "[track]") {
  const auto rec = nlohmann::json::parse(
      R"({"event":"eval","step":40,"loss":0.5,"accuracy":0.75,"samples":1000,"final_eval":"full","ok":true})");
  const auto pts = track::points_of(rec);
  std::map<std::string, double> m;
  for (const auto& p : pts) {
    CHECK(p.step == 40);
    m[p.key] = p.value;
  }
  CHECK(m == std::map<std::string, double>{
                 {"eval/accuracy", 0.75}, {"eval/loss", 0.5}, {"eval/samples", 1000}});
}

TEST_CASE("the cursor: acknowledged steps per event, round trip", "[track]") {
  track::Cursor c;
  c.run_id = "r1";
  c.acked = {{"train", 120}, {"eval", 100}};
  c.pending = {{"events", {{"train", 125}}}, {"key", "train/loss"}, {"step", 125}};
  c.params = {{"optim.lr", "0.1"}};
  CHECK(c.is_acked("train", 120));
  CHECK(!c.is_acked("train", 125));
  CHECK(c.is_acked("eval", 0));
  CHECK(!c.is_acked("summary", 0));
  const auto back = track::Cursor::from_json(nlohmann::json::parse(c.to_json().dump()));
  CHECK(back.to_json() == c.to_json());
  CHECK(track::Cursor::from_json(nlohmann::json::object()).acked.empty());
}

TEST_CASE("git commit of a config's folder, read from .git", "[track]") {
  const fs::path d = mltrain::testing::fresh_temp_dir("track_git");
  const std::string sha = "0123456789abcdef0123456789abcdef01234567";
  CHECK(track::git_commit_of(d / "configs").empty() == (track::git_commit_of(d) == ""));
  fs::create_directories(d / "repo" / ".git" / "refs" / "heads");
  fs::create_directories(d / "repo" / "configs" / "sub");
  std::ofstream(d / "repo" / ".git" / "HEAD") << "ref: refs/heads/main\n";
  std::ofstream(d / "repo" / ".git" / "refs" / "heads" / "main") << sha << "\n";
  CHECK(track::git_commit_of(d / "repo" / "configs" / "sub") == sha);
  fs::remove(d / "repo" / ".git" / "refs" / "heads" / "main");
  std::ofstream(d / "repo" / ".git" / "packed-refs") << "# pack-refs with: peeled\n"
                                                     << sha << " refs/heads/main\n";
  CHECK(track::git_commit_of(d / "repo" / "configs") == sha);
  std::ofstream(d / "repo" / ".git" / "HEAD") << sha << "\n";  // detached
  CHECK(track::git_commit_of(d / "repo") == sha);
}

TEST_CASE("the server: config over MLFLOW_TRACKING_URI; a bad variable is exit 2", "[track]") {
  config::MlflowConfig c;
  ::unsetenv("MLFLOW_TRACKING_URI");
  ::unsetenv("MLFLOW_EXPERIMENT_NAME");
  CHECK(!track::mlflow_target(c, "exp"));
  ::setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000/", 1);
  auto t = track::mlflow_target(c, "exp");
  REQUIRE(t);
  CHECK(t->uri == "http://127.0.0.1:5000");
  CHECK(t->experiment == "exp");
  ::setenv("MLFLOW_EXPERIMENT_NAME", "team", 1);
  ::setenv("MLFLOW_TRACKING_TOKEN", "tok", 1);
  t = track::mlflow_target(c, "exp");
  CHECK(t->experiment == "team");
  CHECK(t->token == "tok");
  c.uri = "https://other:443";
  c.experiment = "mine";
  t = track::mlflow_target(c, "exp");
  CHECK(t->uri == "https://other:443");
  CHECK(t->experiment == "mine");
  c.uri = "";
  ::setenv("MLFLOW_TRACKING_URI", "localhost:5000", 1);
  try {
    track::mlflow_target(c, "exp");
    FAIL("a URI without a scheme was accepted");
  } catch (const ConfigError& e) {
    CHECK(e.exit_code() == 2);
    CHECK(std::string(e.what()).find("MLFLOW_TRACKING_URI") != std::string::npos);
  }
  for (const char* v : {"MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_TRACKING_TOKEN"})
    ::unsetenv(v);
}
