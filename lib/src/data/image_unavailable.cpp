// Built without TurboJPEG/libspng (MLTRAIN_WITH_IMAGES off or the libraries missing): every image
// call fails with the fix.
#include "mltrain/core/error.hpp"
#include "mltrain/data/image.hpp"

namespace mltrain::data {

namespace {
[[noreturn]] void unavailable(const std::string& where) {
  throw DataError(
      where, "this mltrain was built without JPEG/PNG support",
      "install libturbojpeg0-dev and libspng-dev (scripts/install-deps.sh), then rebuild");
}
}  // namespace

bool images_supported() { return false; }
ImageFormat sniff_image(const uint8_t*, size_t) { return ImageFormat::kUnknown; }
void check_image_header(const uint8_t*, size_t, const std::string& where) { unavailable(where); }
Image decode_image(const uint8_t*, size_t, const std::string& where, int64_t) {
  unavailable(where);
}
void fit_image(const Image&, const ImageSpec&, uint8_t*) { unavailable("image"); }
void decode_to_sample(const uint8_t*, size_t, const std::string& where, const ImageSpec&,
                      uint8_t*) {
  unavailable(where);
}
std::vector<uint8_t> encode_jpeg(const uint8_t*, int64_t, int64_t, int64_t, int) {
  unavailable("--store jpeg");
}
std::vector<uint8_t> encode_png(const uint8_t*, int64_t, int64_t, int64_t) { unavailable("png"); }

}  // namespace mltrain::data
