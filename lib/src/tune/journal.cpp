#include "mltrain/tune/journal.hpp"

#include <atomic>
#include <cstdio>
#include <iostream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "mltrain/core/error.hpp"
#include "mltrain/core/fault.hpp"

namespace mltrain::tune {

Journal::Journal(std::filesystem::path p) : path_(std::move(p)) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw RuntimeError(path_.string(),
                       std::string("cannot open the study journal: ") + std::strerror(errno),
                       "check the study folder's permissions");
}

Journal::~Journal() {
  if (fd_ >= 0) ::close(fd_);
}

nlohmann::json journal_header() {
  return {{"op", "journal"}, {"format", kJournalFormat}, {"mltrain", MLTRAIN_VERSION}};
}

void check_journal_format(const std::vector<nlohmann::json>& recs,
                          const std::filesystem::path& path) {
  if (recs.empty() || !recs[0].is_object()) return;
  const auto op = recs[0].find("op");  // any JSON at all may stand there (fuzz_journal)
  if (op == recs[0].end() || !op->is_string() || op->get<std::string>() != "journal") return;
  const auto& h = recs[0];
  const auto f = h.find("format");
  const auto v = h.find("mltrain");
  const std::string writer = v != h.end() && v->is_string() ? v->get<std::string>() : "unknown";
  if (f != h.end() && f->is_number_integer() && f->get<int64_t>() == kJournalFormat) return;
  throw DataError(path.string(),
                  "written by mltrain " + writer + " in journal format " +
                      (f != h.end() ? f->dump() : std::string("(none)")) + "; this mltrain (" +
                      MLTRAIN_VERSION + ") reads format " + std::to_string(kJournalFormat),
                  "resume or report the study with mltrain " + writer +
                      " (its `tune export` writes an Optuna journal any version reads), or start "
                      "a new study.name");
}

const std::vector<nlohmann::json>& Journal::read() {
  Lock l(fd_, LOCK_SH);
  return read_unlocked();
}

void Journal::append(const std::vector<nlohmann::json>& recs) {
  Lock l(fd_, LOCK_EX);
  append_unlocked(recs);
}

const std::vector<nlohmann::json>& Journal::read_unlocked() {
  struct stat st {};
  if (::fstat(fd_, &st) != 0)
    throw RuntimeError(path_.string(),
                       std::string("cannot stat the study journal: ") + std::strerror(errno),
                       "check the study folder");
  if (st.st_size < parsed_)
    parsed_ = 0, recs_.clear();  // replaced or truncated by hand: start over
  std::string buf(size_t(st.st_size - parsed_), '\0');
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t k = ::pread(fd_, &buf[got], buf.size() - got, parsed_ + off_t(got));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += size_t(k);
  }
  size_t at = 0, nl;
  while ((nl = buf.find('\n', at)) != std::string::npos &&
         nl < got) {  // complete lines only: a line without its newline is torn
    try {
      recs_.push_back(nlohmann::json::parse(buf.begin() + long(at), buf.begin() + long(nl)));
    } catch (const std::exception&) {
      // A torn line terminated by a later writer, or a line another program wrote: skipped, with
      // a warning naming its offset (each byte is parsed once per reader; after kWarnings lines in
      // this process, one note and silence, so a journal full of garbage cannot flood the log).
      static std::atomic<int> skipped{0};  // per process: fuzzers and tools read many journals
      const int n = ++skipped;
      if (n <= kWarnings) {
        std::string shown;
        for (size_t i = at; i < nl && i < at + 80; ++i) {
          const auto c = static_cast<unsigned char>(buf[i]);
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\x%02x", c);
          shown += c >= 0x20 && c < 0x7f ? std::string(1, char(c)) : std::string(hex);
        }
        std::cerr << "[tune] warning: " << path_.string() << " offset " << (parsed_ + off_t(at))
                  << ": skipped a line that is not a JSON record (" << shown
                  << (nl - at > 80 ? "..." : "") << ")"
                  << (n == kWarnings ? "; further such lines are skipped silently" : "") << "\n";
      }
    }
    at = nl + 1;
  }
  parsed_ += off_t(at);
  return recs_;
}

void Journal::append_unlocked(const std::vector<nlohmann::json>& recs) {
  if (recs.empty()) return;
  std::string s;
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && st.st_size > 0) {
    char last = '\n';
    if (::pread(fd_, &last, 1, st.st_size - 1) == 1 && last != '\n') s += "\n";
  }
  for (const auto& r : recs) s += r.dump() + "\n";
  if (fault::armed("journal.write")) {  // a writer killed mid-append leaves a torn line
    if (::write(fd_, s.data(), s.size() / 2) < 0) fault::die();
    fault::die();
  }
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = ::write(fd_, s.data() + off, s.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0)
      throw RuntimeError(path_.string(),
                         std::string("journal write failed: ") + std::strerror(errno),
                         "free disk space");
    off += size_t(w);
  }
  fault::at("journal.fsync");
  if (::fdatasync(fd_) != 0)
    throw RuntimeError(path_.string(), std::string("journal write failed: ") + std::strerror(errno),
                       "free disk space");
}

}  // namespace mltrain::tune
