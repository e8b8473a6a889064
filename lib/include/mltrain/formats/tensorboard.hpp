#pragma once
// TensorBoard event files without TensorFlow or protobuf: TFRecord framing (length, masked
// CRC32C of the length, payload, masked CRC32C of the payload) around hand-encoded Event protos
// (wall_time, step, file_version | summary { value { tag, simple_value | histo } }).
//
//   TbWriter tb(run_dir);                       // events.out.tfevents.<secs>.<host>.<pid>.mltrain
//   tb.scalar("train/loss", step, 0.42);
//   tb.histogram("weights/fc1.weight", step, values);
//   tb.flush();
//
// read_event_file() is the reader the tests use: it checks both CRCs of every record and decodes
// the fields written here.
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace mltrain::formats {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
uint32_t masked_crc32c(const void* data, size_t n);

class TbWriter {
 public:
  explicit TbWriter(const std::string& dir);
  void scalar(const std::string& tag, int64_t step, double value);
  void histogram(const std::string& tag, int64_t step, const std::vector<double>& values,
                 int buckets = 30);
  void flush() { out_.flush(); }
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& payload);
  std::string path_;
  std::ofstream out_;
};

struct TbEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  struct Value {
    std::string tag;
    bool has_simple = false;
    float simple_value = 0;
    bool has_histo = false;
    double histo_num = 0, histo_sum = 0, histo_min = 0, histo_max = 0;
    std::vector<double> bucket_limit, bucket;
  };
  std::vector<Value> values;
};

// Throws DataError naming the record on a bad length/data CRC or a truncated record.
std::vector<TbEvent> read_event_file(const std::string& path);

}  // namespace mltrain::formats
