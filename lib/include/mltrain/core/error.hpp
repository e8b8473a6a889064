#pragma once
// Typed user/input errors and the exit codes they map to. Only apps/mltrain/main.cpp catches them.
//
//   throw mltrain::DataError(path, "truncated: expected 47040016 bytes, found 1024",
//                            "re-download or re-run `mltrain data convert`");
//   // main: "error: /data/x.idx: truncated: ...\n  fix: re-download ..." ; exit 3
#include <stdexcept>
#include <string>

namespace mltrain {

enum ExitCode : int {
  kExitOk = 0,
  kExitRuntime = 1,      // anything unexpected while running
  kExitUsage = 2,        // command line or config error
  kExitBadInput = 3,     // bad data file or checkpoint
  kExitCheckFailed = 4,  // `mltrain checklist` found a FAIL item
  kExitSignalBase = 128  // 128 + N: stopped cleanly (after a checkpoint) on signal N
};

// Every exit code with its meaning, in order: `mltrain --help` prints this table, so the help and
// the code cannot disagree.
struct ExitCodeDoc {
  const char* code;
  const char* meaning;
};
inline constexpr ExitCodeDoc kExitCodeDocs[] = {
    {"0", "ok"},
    {"1", "runtime failure"},
    {"2", "usage or config error"},
    {"3", "bad data or checkpoint"},
    {"4", "`mltrain checklist` found a FAIL item"},
    {"128+N", "stopped cleanly (checkpoint written) by signal N"},
};
static_assert(kExitCheckFailed == 4 && kExitSignalBase == 128, "update kExitCodeDocs");
inline std::string exit_codes_text() {
  std::string t = "Exit codes:";
  for (const auto& e : kExitCodeDocs) t += std::string(" ") + e.code + " " + e.meaning + ";";
  t.back() = '.';
  return t;
}

// what(): "<where>: <message>" plus an optional "fix:" line.
class Error : public std::runtime_error {
 public:
  Error(std::string where, std::string message, std::string fix = "")
      : std::runtime_error(compose(where, message, fix)),
        where_(std::move(where)),
        message_(std::move(message)),
        fix_(std::move(fix)) {}
  virtual int exit_code() const { return kExitRuntime; }
  const std::string& where() const { return where_; }
  const std::string& message() const { return message_; }
  const std::string& fix() const { return fix_; }

 private:
  static std::string compose(const std::string& w, const std::string& m, const std::string& f) {
    std::string s = w.empty() ? m : w + ": " + m;
    if (!f.empty()) s += "\n  fix: " + f;
    return s;
  }
  std::string where_, message_, fix_;
};

struct ConfigError : Error {  // also used for bad command-line arguments
  using Error::Error;
  int exit_code() const override { return kExitUsage; }
};
struct DataError : Error {
  using Error::Error;
  int exit_code() const override { return kExitBadInput; }
};
struct CheckpointError : Error {
  using Error::Error;
  int exit_code() const override { return kExitBadInput; }
};
struct RuntimeError : Error {
  using Error::Error;
};

// Thrown by the trainer after it has written a checkpoint in response to a stop signal.
class Interrupted : public std::exception {
 public:
  explicit Interrupted(int signal)
      : signal_(signal), text_("stopped by signal " + std::to_string(signal)) {}
  int signal() const { return signal_; }
  const char* what() const noexcept override { return text_.c_str(); }

 private:
  int signal_;
  std::string text_;
};

}  // namespace mltrain
