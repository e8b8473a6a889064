// `data tokenize --sentencepiece`: the helper mltrain_spm does the work in a process without
// LibTorch (dataset.hpp says why); this side passes the arguments and turns its answer back into
// a result or the same typed error.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mltrain/core/error.hpp"
#include "mltrain/core/process.hpp"
#include "mltrain/data/dataset.hpp"

namespace fs = std::filesystem;

namespace mltrain::data {

TokenizeResult tokenize_sentencepiece(const std::vector<std::string>& files, const std::string& out,
                                      double val_fraction, const SentencePieceOptions& sp) {
  const fs::path helper = fs::path(self_exe()).parent_path() / "mltrain_spm";
  std::error_code ec;
  if (!fs::exists(helper, ec))
    throw ConfigError("--sentencepiece",
                      "this mltrain has no SentencePiece helper (" + helper.string() + ")",
                      "install libsentencepiece-dev (scripts/install-deps.sh) and rebuild");
  std::vector<std::string> argv = {
      helper.string(), out, std::to_string(val_fraction), sp.model, std::to_string(sp.train_vocab),
      sp.model_type};
  argv.insert(argv.end(), files.begin(), files.end());
  int fd = -1;
  const pid_t pid = spawn_child(argv, environment_with({}), &fd, "", false);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) != 0;)
    if (n > 0) text.append(buf, static_cast<size_t>(n));
  ::close(fd);
  int status = 0;
  ::waitpid(pid, &status, 0);
  // The answer is the last line that is JSON; anything before it is the library's own output.
  nlohmann::json answer;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line.front() == '{')
      answer = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (answer.is_object() && answer.contains("error")) {
    const auto& e = answer["error"];
    const std::string kind = e.value("kind", "runtime"), where = e.value("where", ""),
                      message = e.value("message", ""), fix = e.value("fix", "");
    if (kind == "data") throw DataError(where, message, fix);
    if (kind == "config") throw ConfigError(where, message, fix);
    throw RuntimeError(where, message, fix);
  }
  if (!answer.is_object() || !answer.contains("ok") || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0)
    throw RuntimeError(helper.string(), "stopped without an answer: " + text.substr(0, 2000),
                       "run it again; if it repeats, report it with this output");
  const auto& ok = answer["ok"];
  TokenizeResult r{ok.at("train_tokens").get<int64_t>(), ok.at("val_tokens").get<int64_t>()};
  r.vocab = ok.at("vocab").get<int64_t>();
  r.dtype = ok.at("dtype").get<std::string>();
  return r;
}

}  // namespace mltrain::data
