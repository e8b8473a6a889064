#include "mltrain/data/image.hpp"

#include <spng.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "mltrain/core/error.hpp"

namespace mltrain::data {

namespace {

// A decompression bomb or a corrupt header naming a 60000 x 60000 image is refused before any
// allocation: 16384 per side and 64 Mi pixels cover every training image users bring.
constexpr int64_t kMaxSide = 16384;
constexpr int64_t kMaxPixels = int64_t{64} << 20;

const char* const kFix = "re-export the image, or set data.on_bad_sample: skip to leave it out";

void check_dims(int64_t w, int64_t h, const std::string& where) {
  if (w <= 0 || h <= 0 || w > kMaxSide || h > kMaxSide || w * h > kMaxPixels)
    throw DataError(where,
                    "image size " + std::to_string(w) + "x" + std::to_string(h) +
                        " is outside 1..16384 per side and 64 Mi pixels",
                    kFix);
}

struct TjHandle {
  tjhandle h;
  explicit TjHandle(bool compress) : h(compress ? tjInitCompress() : tjInitDecompress()) {
    if (!h) throw RuntimeError("turbojpeg", "cannot create a TurboJPEG handle");
  }
  ~TjHandle() { tjDestroy(h); }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
};

struct SpngCtx {
  spng_ctx* ctx;
  explicit SpngCtx(int flags) : ctx(spng_ctx_new(flags)) {
    if (!ctx) throw RuntimeError("spng", "cannot create a libspng context");
  }
  ~SpngCtx() { spng_ctx_free(ctx); }
  SpngCtx(const SpngCtx&) = delete;
  SpngCtx& operator=(const SpngCtx&) = delete;
};

// Loader threads decode many small images: one handle per thread, made on first use.
tjhandle thread_decompressor() {
  thread_local TjHandle handle(false);
  return handle.h;
}

void jpeg_header(const uint8_t* bytes, size_t n, const std::string& where, int* w, int* h,
                 int* colorspace) {
  int subsamp = 0;
  if (tjDecompressHeader3(thread_decompressor(), const_cast<uint8_t*>(bytes),
                          static_cast<unsigned long>(n), w, h, &subsamp, colorspace) != 0)
    throw DataError(
        where, std::string("corrupt JPEG header: ") + tjGetErrorStr2(thread_decompressor()), kFix);
  if (*colorspace == TJCS_CMYK || *colorspace == TJCS_YCCK)
    throw DataError(where, "CMYK JPEG: only grayscale and RGB/YCbCr images are decoded",
                    "convert the image to RGB (e.g. `convert in.jpg -colorspace sRGB out.jpg`)");
  check_dims(*w, *h, where);
}

Image decode_jpeg(const uint8_t* bytes, size_t n, const std::string& where, int64_t channels) {
  int w = 0, h = 0, cs = 0;
  jpeg_header(bytes, n, where, &w, &h, &cs);
  Image im{h, w, channels, std::vector<uint8_t>(static_cast<size_t>(w) * h * channels)};
  // A warning (a truncated stream, "premature end of data") is an error too: the decoder would
  // fill the rest with grey, a silently different sample.
  if (tjDecompress2(thread_decompressor(), bytes, static_cast<unsigned long>(n), im.px.data(), w, 0,
                    h, channels == 1 ? TJPF_GRAY : TJPF_RGB, TJFLAG_STOPONWARNING) != 0)
    throw DataError(
        where, std::string("corrupt or truncated JPEG: ") + tjGetErrorStr2(thread_decompressor()),
        kFix);
  return im;
}

void png_open(SpngCtx& s, const uint8_t* bytes, size_t n, const std::string& where,
              spng_ihdr* ihdr) {
  spng_set_image_limits(s.ctx, kMaxSide, kMaxSide);
  spng_set_chunk_limits(s.ctx, 1 << 24, 1 << 26);
  int r = spng_set_png_buffer(s.ctx, bytes, n);
  if (r == 0) r = spng_get_ihdr(s.ctx, ihdr);
  if (r != 0) throw DataError(where, std::string("corrupt PNG header: ") + spng_strerror(r), kFix);
  check_dims(ihdr->width, ihdr->height, where);
}

uint8_t luma(uint32_t r, uint32_t g, uint32_t b) {  // PIL's convert("L"), ITU-R 601-2
  return static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

Image decode_png(const uint8_t* bytes, size_t n, const std::string& where, int64_t channels) {
  SpngCtx s(0);
  spng_ihdr ihdr{};
  png_open(s, bytes, n, where, &ihdr);
  const bool gray_src = ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE && ihdr.bit_depth <= 8;
  const int fmt = gray_src ? SPNG_FMT_G8 : SPNG_FMT_RGBA8;
  size_t len = 0;
  int r = spng_decoded_image_size(s.ctx, fmt, &len);
  std::vector<uint8_t> raw(len);
  if (r == 0) r = spng_decode_image(s.ctx, raw.data(), len, fmt, 0);
  if (r != 0)
    throw DataError(where, std::string("corrupt or truncated PNG: ") + spng_strerror(r), kFix);
  const int64_t w = ihdr.width, h = ihdr.height, px = w * h;
  Image im{h, w, channels, std::vector<uint8_t>(static_cast<size_t>(px * channels))};
  for (int64_t i = 0; i < px; ++i) {
    if (gray_src) {
      for (int64_t c = 0; c < channels; ++c) im.px[static_cast<size_t>(i * channels + c)] = raw[i];
    } else if (channels == 1) {
      im.px[i] = luma(raw[i * 4], raw[i * 4 + 1], raw[i * 4 + 2]);
    } else {
      std::memcpy(&im.px[static_cast<size_t>(i * 3)], &raw[static_cast<size_t>(i * 4)], 3);
    }
  }
  return im;
}

// PIL's separable BILINEAR resampling: a triangle filter widened by the scale when shrinking.
struct Taps {
  std::vector<int64_t> first;
  std::vector<std::vector<float>> w;
};

Taps taps(int64_t in, int64_t out, int64_t from, int64_t count) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double fs = std::max(scale, 1.0);
  Taps t;
  for (int64_t o = from; o < from + count; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(0, static_cast<int64_t>(center - fs + 0.5));
    const int64_t hi = std::min<int64_t>(in, static_cast<int64_t>(center + fs + 0.5));
    std::vector<float> w;
    double sum = 0;
    for (int64_t i = lo; i < hi; ++i) {
      const double v = std::max(0.0, 1.0 - std::abs((static_cast<double>(i) - center + 0.5) / fs));
      w.push_back(static_cast<float>(v));
      sum += v;
    }
    for (auto& v : w) v = static_cast<float>(v / (sum > 0 ? sum : 1.0));
    t.first.push_back(lo);
    t.w.push_back(std::move(w));
  }
  return t;
}

}  // namespace

bool images_supported() { return true; }

ImageFormat sniff_image(const uint8_t* b, size_t n) {
  if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::kJpeg;
  static const uint8_t png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n >= 8 && std::memcmp(b, png, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

void check_image_header(const uint8_t* bytes, size_t n, const std::string& where) {
  switch (sniff_image(bytes, n)) {
    case ImageFormat::kJpeg: {
      int w = 0, h = 0, cs = 0;
      jpeg_header(bytes, n, where, &w, &h, &cs);
      return;
    }
    case ImageFormat::kPng: {
      SpngCtx s(0);
      spng_ihdr ihdr{};
      png_open(s, bytes, n, where, &ihdr);
      return;
    }
    default:
      throw DataError(where, "neither JPEG nor PNG (by its first bytes)",
                      "keep only .jpg/.png images in class folders, or set "
                      "data.on_bad_sample: skip");
  }
}

Image decode_image(const uint8_t* bytes, size_t n, const std::string& where, int64_t channels) {
  switch (sniff_image(bytes, n)) {
    case ImageFormat::kJpeg:
      return decode_jpeg(bytes, n, where, channels);
    case ImageFormat::kPng:
      return decode_png(bytes, n, where, channels);
    default:
      check_image_header(bytes, n, where);  // throws with the message above
      return {};
  }
}

void fit_image(const Image& im, const ImageSpec& spec, uint8_t* chw) {
  const int64_t S = spec.size, C = im.c, target = spec.resize > 0 ? spec.resize : S;
  // torchvision Resize(int): the shorter side becomes `target`, the other keeps the aspect ratio.
  int64_t rh = target, rw = target;
  if (im.w < im.h)
    rh = static_cast<int64_t>(static_cast<double>(target) * im.h / im.w);
  else if (im.h < im.w)
    rw = static_cast<int64_t>(static_cast<double>(target) * im.w / im.h);
  const int64_t top = static_cast<int64_t>(std::round((rh - S) / 2.0));
  const int64_t left = static_cast<int64_t>(std::round((rw - S) / 2.0));
  auto at = [&](int64_t y, int64_t x, int64_t c) -> uint8_t {  // zero padding outside
    if (y < 0 || x < 0 || y >= im.h || x >= im.w) return 0;
    return im.px[static_cast<size_t>((y * im.w + x) * C + c)];
  };
  if (rh == im.h && rw == im.w) {  // no resampling: crop (or pad) only
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < S; ++y)
        for (int64_t x = 0; x < S; ++x) chw[(c * S + y) * S + x] = at(y + top, x + left, c);
    return;
  }
  // Rows needed by the output window, resampled horizontally first, then vertically.
  const Taps tx = taps(im.w, rw, left, S), ty = taps(im.h, rh, top, S);
  const int64_t y0 = ty.first.front(), y1 = ty.first.back() + int64_t(ty.w.back().size());
  std::vector<float> mid(static_cast<size_t>((y1 - y0) * S * C));
  for (int64_t y = y0; y < y1; ++y)
    for (int64_t x = 0; x < S; ++x)
      for (int64_t c = 0; c < C; ++c) {
        float acc = 0;
        const auto& w = tx.w[static_cast<size_t>(x)];
        for (size_t k = 0; k < w.size(); ++k) acc += w[k] * at(y, tx.first[x] + int64_t(k), c);
        mid[static_cast<size_t>(((y - y0) * S + x) * C + c)] = acc;
      }
  for (int64_t y = 0; y < S; ++y)
    for (int64_t x = 0; x < S; ++x)
      for (int64_t c = 0; c < C; ++c) {
        float acc = 0;
        const auto& w = ty.w[static_cast<size_t>(y)];
        for (size_t k = 0; k < w.size(); ++k)
          acc += w[k] * mid[static_cast<size_t>(((ty.first[y] + int64_t(k) - y0) * S + x) * C + c)];
        chw[(c * S + y) * S + x] = static_cast<uint8_t>(std::clamp(std::lround(acc), 0L, 255L));
      }
}

void decode_to_sample(const uint8_t* bytes, size_t n, const std::string& where,
                      const ImageSpec& spec, uint8_t* chw) {
  fit_image(decode_image(bytes, n, where, spec.channels), spec, chw);
}

std::vector<uint8_t> encode_jpeg(const uint8_t* chw, int64_t c, int64_t h, int64_t w, int quality) {
  std::vector<uint8_t> hwc(static_cast<size_t>(c * h * w));
  for (int64_t k = 0; k < c; ++k)
    for (int64_t i = 0; i < h * w; ++i) hwc[static_cast<size_t>(i * c + k)] = chw[k * h * w + i];
  TjHandle t(true);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  if (tjCompress2(t.h, hwc.data(), static_cast<int>(w), 0, static_cast<int>(h),
                  c == 1 ? TJPF_GRAY : TJPF_RGB, &out, &size, c == 1 ? TJSAMP_GRAY : TJSAMP_420,
                  quality, 0) != 0)
    throw RuntimeError("turbojpeg", std::string("JPEG encoding failed: ") + tjGetErrorStr2(t.h));
  std::vector<uint8_t> v(out, out + size);
  tjFree(out);
  return v;
}

std::vector<uint8_t> encode_png(const uint8_t* chw, int64_t c, int64_t h, int64_t w) {
  std::vector<uint8_t> hwc(static_cast<size_t>(c * h * w));
  for (int64_t k = 0; k < c; ++k)
    for (int64_t i = 0; i < h * w; ++i) hwc[static_cast<size_t>(i * c + k)] = chw[k * h * w + i];
  SpngCtx s(SPNG_CTX_ENCODER);
  spng_set_option(s.ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(w);
  ihdr.height = static_cast<uint32_t>(h);
  ihdr.bit_depth = 8;
  ihdr.color_type = c == 1 ? SPNG_COLOR_TYPE_GRAYSCALE : SPNG_COLOR_TYPE_TRUECOLOR;
  int r = spng_set_ihdr(s.ctx, &ihdr);
  if (r == 0)
    r = spng_encode_image(s.ctx, hwc.data(), hwc.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  size_t len = 0;
  void* buf = r == 0 ? spng_get_png_buffer(s.ctx, &len, &r) : nullptr;
  if (r != 0 || !buf)
    throw RuntimeError("spng", std::string("PNG encoding failed: ") + spng_strerror(r));
  std::vector<uint8_t> v(static_cast<uint8_t*>(buf), static_cast<uint8_t*>(buf) + len);
  std::free(buf);
  return v;
}

}  // namespace mltrain::data
