#pragma once
// JPEG (TurboJPEG) and PNG (libspng) decoding into fixed-size u8 [C, S, S] samples, as
// torchvision's Resize(S) + CenterCrop(S) + ToTensor would produce them.
//
//   ImageSpec spec{.size = 28, .channels = 1};
//   std::vector<uint8_t> chw(spec.sample_bytes());
//   const std::string bytes = read_file("shoe.jpg");   // core/fs.hpp
//   decode_to_sample(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "shoe.jpg",
//                    spec, chw.data());
//
// Every failure (unknown format, truncated or corrupt stream, CMYK JPEG, a size beyond the
// limits) raises DataError naming the file. Built without the libraries (MLTRAIN_WITH_IMAGES
// off), every call raises DataError saying so.
#include <cstdint>
#include <string>
#include <vector>

namespace mltrain::data {

struct ImageSpec {
  int64_t size = 28;     // output side S (square)
  int64_t channels = 1;  // 1: grayscale (ITU-R 601 luma, as PIL's convert("L")), 3: RGB
  int64_t resize = 0;    // shorter side scaled to this before the centre crop (0: = size)
  size_t sample_bytes() const { return static_cast<size_t>(channels * size * size); }
};

// A decoded image, u8, interleaved HWC with 1 or 3 channels.
struct Image {
  int64_t h = 0, w = 0, c = 0;
  std::vector<uint8_t> px;
};

enum class ImageFormat { kUnknown, kJpeg, kPng };
ImageFormat sniff_image(const uint8_t* bytes, size_t n);
bool images_supported();  // built with TurboJPEG and libspng

// Reads only the header: throws DataError when the file is not a JPEG/PNG this build decodes.
void check_image_header(const uint8_t* bytes, size_t n, const std::string& where);
// channels: 1 or 3 (the source is converted: RGB -> luma, gray -> replicated, alpha dropped).
Image decode_image(const uint8_t* bytes, size_t n, const std::string& where, int64_t channels);
// Resize (shorter side, PIL-style triangle filter, antialiased when shrinking) + centre crop,
// written channel-planar to `chw` (spec.sample_bytes() bytes).
void fit_image(const Image& im, const ImageSpec& spec, uint8_t* chw);
void decode_to_sample(const uint8_t* bytes, size_t n, const std::string& where,
                      const ImageSpec& spec, uint8_t* chw);

// Encoders for `mltrain data convert --store jpeg` and the tests. chw: u8 [c, h, w].
std::vector<uint8_t> encode_jpeg(const uint8_t* chw, int64_t c, int64_t h, int64_t w, int quality);
std::vector<uint8_t> encode_png(const uint8_t* chw, int64_t c, int64_t h, int64_t w);

}  // namespace mltrain::data
