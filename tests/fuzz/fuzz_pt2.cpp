// torch.export archives (.pt2, model.name: exported), in two targets:
//   fuzz_zip  the bytes are the archive: the zip reader must bound every offset and size by the
//             file, and an entry it lists either reads whole (CRC-checked) or is a mltrain::Error.
//   fuzz_pt2  the bytes are the archive's parts, split at the marker kPart: models/model.json,
//             the weights' config, then weight_0, weight_1, ...; the target zips them (stored, with
//             their real CRCs, so the JSON is what gets mutated) and loads the program the way
//             training does (build_model: read, tensors, the interpreter's plan). A graph or
//             weight table that does not fit is a mltrain::Error, never a crash.
#include "fuzz_support.hpp"

#include <zlib.h>

#include <cstring>

#include "mltrain/formats/zip.hpp"
#ifdef FUZZ_FORMAT_PT2
#include "mltrain/model/model.hpp"
#endif

using namespace mltrain;

namespace {

// Between the parts of a fuzz_pt2 input (weights hold every byte value, so no single byte can).
constexpr const char* kPart = "\n=PT2PART=\n";

void le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(char((v >> (8 * i)) & 0xFF));
}

// A stored zip of (name, bytes) entries, as PyTorchStreamWriter writes them (no zip64: the
// fuzzer's inputs are small).
std::string zip_of(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string out, central;
  for (const auto& [name, data] : entries) {
    const uint32_t crc =
        uint32_t(crc32(0, reinterpret_cast<const Bytef*>(data.data()), uInt(data.size())));
    const uint64_t offset = out.size();
    for (std::string* rec : {&out, &central}) {
      const bool c = rec == &central;
      le(*rec, c ? 0x02014b50 : 0x04034b50, 4);
      if (c) le(*rec, 20, 2);  // version made by
      le(*rec, 20, 2);         // version needed
      le(*rec, 0, 2);          // flags
      le(*rec, 0, 2);          // stored
      le(*rec, 0, 4);          // time, date
      le(*rec, crc, 4);
      le(*rec, data.size(), 4);
      le(*rec, data.size(), 4);
      le(*rec, name.size(), 2);
      le(*rec, 0, 2);  // extra
      if (c) {
        le(*rec, 0, 2), le(*rec, 0, 2), le(*rec, 0, 2), le(*rec, 0, 4);  // comment, disk, attrs
        le(*rec, offset, 4);
      }
      *rec += name;
      if (!c) *rec += data;
    }
  }
  const uint64_t cd_offset = out.size();
  out += central;
  le(out, 0x06054b50, 4);
  le(out, 0, 4);
  le(out, entries.size(), 2);
  le(out, entries.size(), 2);
  le(out, central.size(), 4);
  le(out, cd_offset, 4);
  le(out, 0, 2);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
#ifdef FUZZ_FORMAT_PT2
  const std::string in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t next = in.find(kPart, at);
    parts.push_back(in.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos || parts.size() == 64) break;
    at = next + std::strlen(kPart);
  }
  std::vector<std::pair<std::string, std::string>> entries = {{"f/models/model.json", parts[0]}};
  if (parts.size() > 1) entries.emplace_back("f/data/weights/model_weights_config.json", parts[1]);
  for (size_t k = 2; k < parts.size(); ++k)
    entries.emplace_back("f/data/weights/weight_" + std::to_string(k - 2), parts[k]);
  const std::string path = fuzz::put("f.pt2", zip_of(entries));
  config::ModelConfig c;
  c.name = "exported";
  c.path = path;
  fuzz::accepts([&] { model::build_model(c, {}, 0, 0); });
#else
  const std::string path = fuzz::put("z.zip", data, size);
  fuzz::accepts([&] {
    formats::ZipReader zip(path);
    for (const auto& e : zip.entries()) {
      fuzz::require(e.data_offset + e.compressed_size <= size, "an entry lies inside the file");
      if (e.size > (uint64_t(64) << 20)) continue;  // an honest size the fuzzer cannot afford
      std::string buf(e.size, '\0');
      try {
        zip.read_into(e, buf.data());
      } catch (const Error&) {
      }
    }
  });
#endif
  return 0;
}
