#pragma once
// A study's journal: one JSON object per line, appended under an exclusive flock (whole-file lock;
// works on local file systems and on NFS v4 / Lustre with flock support). A torn last line (a
// writer killed mid-write) is skipped by readers and terminated by the next writer, so it never
// merges with a following record. Readers parse only what was appended since their last read
// (the pruner reads the journal at every intermediate report; re-parsing it whole made a study
// quadratic in its reports).
//
//   Journal j("study/journal.jsonl");
//   j.append({{{"op", "report"}, {"trial", 3}, {"value", 0.81}}});
//   for (const auto& rec : j.read()) ...
//   j.transact([](const std::vector<nlohmann::json>& recs) { return more_records(recs); });
#include <sys/file.h>
#include <sys/types.h>

#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

namespace mltrain::tune {

// The journal's format. A new journal's first record says which format and which mltrain wrote
// it: {"op": "journal", "format": 1, "mltrain": "0.1.0"}. A journal of another format (a newer
// mltrain's, say) is refused with exit 3 naming the version that wrote it, before a record is
// read as something it is not; one without the record (written before it existed) is format 1.
inline constexpr int kJournalFormat = 1;
nlohmann::json journal_header();
// Throws DataError (exit 3) when `recs` begin with a header of another format.
void check_journal_format(const std::vector<nlohmann::json>& recs,
                          const std::filesystem::path& path);

class Journal {
 public:
  explicit Journal(std::filesystem::path p);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // fn(records) returns the records to append; both under one exclusive lock.
  template <class F>
  void transact(F&& fn) {
    Lock l(fd_, LOCK_EX);
    const auto& recs = read_unlocked();
    auto add = fn(recs);
    append_unlocked(add);
  }
  // Every complete record so far (valid until the next call on this journal).
  const std::vector<nlohmann::json>& read();
  void append(const std::vector<nlohmann::json>& recs);

 private:
  struct Lock {
    int fd;
    Lock(int f, int op) : fd(f) {
      while (::flock(fd, op) != 0 && errno == EINTR) {
      }
    }
    ~Lock() { ::flock(fd, LOCK_UN); }
  };
  const std::vector<nlohmann::json>& read_unlocked();
  void append_unlocked(const std::vector<nlohmann::json>& recs);
  std::filesystem::path path_;
  int fd_ = -1;
  std::vector<nlohmann::json> recs_;  // every complete record up to parsed_
  off_t parsed_ = 0;
  static constexpr int kWarnings = 3;  // malformed lines warned about per process (then silence)
};

}  // namespace mltrain::tune
