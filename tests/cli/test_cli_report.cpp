// `mltrain runs` and `mltrain report`, rendered by headless Chromium.
#include "cli_support.hpp"

// A minimal PNG decoder (8-bit RGB/RGBA, non-interlaced: what Chromium writes) for the screenshot.
struct Image {
  int w = 0, h = 0;
  std::vector<uint8_t> rgb;  // w*h*3
};
static uint32_t be32(const std::string& s, size_t i) {
  return (uint32_t(uint8_t(s[i])) << 24) | (uint32_t(uint8_t(s[i + 1])) << 16) |
         (uint32_t(uint8_t(s[i + 2])) << 8) | uint32_t(uint8_t(s[i + 3]));
}
static Image decode_png(const std::string& png) {
  REQUIRE(png.size() > 8);
  REQUIRE(png.compare(1, 3, "PNG") == 0);
  Image img;
  int ctype = 0;
  std::string idat;
  for (size_t i = 8; i + 8 <= png.size();) {
    const uint32_t len = be32(png, i);
    const std::string type = png.substr(i + 4, 4);
    if (type == "IHDR") {
      img.w = int(be32(png, i + 8)), img.h = int(be32(png, i + 12));
      REQUIRE(uint8_t(png[i + 16]) == 8);  // bit depth
      ctype = uint8_t(png[i + 17]);
      REQUIRE(uint8_t(png[i + 20]) == 0);  // not interlaced
    } else if (type == "IDAT") {
      idat += png.substr(i + 8, len);
    }
    i += 12 + len;
  }
  REQUIRE((ctype == 2 || ctype == 6));
  const int bpp = ctype == 6 ? 4 : 3;
  const size_t stride = size_t(img.w) * bpp;
  std::vector<uint8_t> raw((stride + 1) * img.h);
  uLongf n = raw.size();
  REQUIRE(uncompress(raw.data(), &n, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) ==
          Z_OK);
  std::vector<uint8_t> prev(stride, 0), cur(stride);
  img.rgb.resize(size_t(img.w) * img.h * 3);
  for (int y = 0; y < img.h; ++y) {
    const uint8_t f = raw[y * (stride + 1)];
    const uint8_t* src = &raw[y * (stride + 1) + 1];
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= size_t(bpp) ? cur[x - bpp] : 0, b = prev[x],
                c = x >= size_t(bpp) ? prev[x - bpp] : 0;
      int pred = 0;
      if (f == 1)
        pred = a;
      else if (f == 2)
        pred = b;
      else if (f == 3)
        pred = (a + b) / 2;
      else if (f == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        pred = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
      }
      cur[x] = uint8_t(src[x] + pred);
    }
    for (int x = 0; x < img.w; ++x)
      for (int k = 0; k < 3; ++k)
        img.rgb[(size_t(y) * img.w + x) * 3 + k] = cur[size_t(x) * bpp + k];
    prev = cur;
  }
  return img;
}

TEST_CASE("runs table and an HTML report of two real runs, rendered by headless Chromium",
          "[cli][report]") {
  const auto d = tmpdir("report");
  const std::string common =
      " model.name=mlp model.hidden=[64] data.limit_train=4096 train.duration=2ep "
      "train.log_every=8u checkpoint.every=1ep run.dir=" +
      d.string();
  REQUIRE(run("train " + kSrc + "/configs/fashion_mnist_mlp.yaml" + common +
              " run.name=lr_high optim.lr=0.003")
              .code == 0);
  REQUIRE(run("train " + kSrc + "/configs/fashion_mnist_mlp.yaml" + common +
              " run.name=lr_low optim.lr=0.0003")
              .code == 0);

  auto r = run("runs " + d.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("lr_high/v0") != std::string::npos);
  CHECK(r.out.find("lr_low/v0") != std::string::npos);
  CHECK(r.out.find("finished") != std::string::npos);
  // A run whose process died leaves "running" with a dead pid: shown as interrupted (killed) at
  // its last recorded step, with the checkpoint it resumes from; a torn last line is counted.
  {
    std::ofstream(d / "lr_low" / "v0" / "status.json")
        << R"({"state": "running", "step": 5, "pid": 999999})";
    std::ofstream(d / "lr_low" / "v0" / "metrics.jsonl", std::ios::app) << "{\"event\":\"tra";
  }
  r = run("runs " + d.string());
  INFO(r.out);
  CHECK_THAT(r.out, Catch::Contains("interrupted at step 64 (killed, pid 999999 gone; resumes "
                                    "from step_64); 1 torn metrics line(s)"));
  CHECK(r.out.find("running") == std::string::npos);
  CHECK(run("runs " + d.string() + "/nope").code == 3);

  const auto html = d / "report.html";
  r = run("report " + (d / "lr_high" / "v0").string() + " " + (d / "lr_low" / "v0").string() +
          " -o " + html.string());
  REQUIRE(r.code == 0);
  const std::string page = slurp(html);
  CHECK(page.find("<svg") != std::string::npos);
  CHECK(page.find("optim.lr") != std::string::npos);  // the config difference
  for (const char* ext :
       {"<script", "<link", "src=", "url(", "@import"})  // self-contained: nothing fetched
    CHECK(page.find(ext) == std::string::npos);
  CHECK(page.find("step_") != std::string::npos);  // checkpoints listed

  // Render it offline and look at the pixels: charts drawn in the two series colours.
  const auto png = d / "shot.png";
  const std::string chrome =
      "chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1600 "
      "--screenshot=" +
      png.string() + " file://" + html.string() + " >/dev/null 2>&1";
  REQUIRE(std::system("command -v chromium >/dev/null") ==
          0);  // scripts/install-deps.sh installs it
  REQUIRE(std::system(chrome.c_str()) == 0);
  const Image img = decode_png(slurp(png));
  REQUIRE(img.w == 1280);
  int64_t nonwhite = 0, blue = 0, red = 0;
  for (size_t i = 0; i + 2 < img.rgb.size(); i += 3) {
    const int R = img.rgb[i], G = img.rgb[i + 1], B = img.rgb[i + 2];
    nonwhite += (R < 240 || G < 240 || B < 240);
    blue += std::abs(R - 0x1f) < 25 && std::abs(G - 0x77) < 25 &&
            std::abs(B - 0xb4) < 25;  // series 1 (#1f77b4)
    red += std::abs(R - 0xd6) < 25 && std::abs(G - 0x27) < 25 &&
           std::abs(B - 0x28) < 25;  // series 2 (#d62728)
  }
  INFO("non-white " << nonwhite << ", blue " << blue << ", red " << red);
  CHECK(nonwhite > int64_t(img.w) * img.h / 50);  // not a blank page
  CHECK(blue > 500);                              // run 1's curves
  CHECK(red > 500);                               // run 2's curves
}

TEST_CASE(
    "report of a tuning study: history, importance and parallel coordinates, rendered by Chromium",
    "[cli][report][tune]") {
  const auto d = tmpdir("report_study");
  auto t = run("tune " + kSrc +
               "/configs/tune/branin.yaml study.n_trials=30 study.dir=" + d.string() + " -q");
  INFO(t.out);
  REQUIRE(t.code == 0);
  CHECK(t.out.find("study branin (tpe sampler, none pruner): 30 trials: 30 complete") !=
        std::string::npos);
  const auto html = d / "study.html";
  auto r = run("report " + (d / "branin").string() + " -o " + html.string());
  REQUIRE(r.code == 0);
  CHECK(r.out.find("0 runs, 1 study") != std::string::npos);
  const std::string page = slurp(html);
  CHECK(page.find("Tuning study branin") != std::string::npos);
  CHECK(page.find("optimisation history: branin") != std::string::npos);
  CHECK(page.find("parameter importance") != std::string::npos);
  CHECK(page.find("parallel coordinates: branin") != std::string::npos);
  for (const char* ext : {"<script", "<link", "src=", "url(", "@import"})
    CHECK(page.find(ext) == std::string::npos);
  const auto png = d / "shot.png";
  REQUIRE(std::system(("chromium --headless --no-sandbox --disable-gpu --hide-scrollbars "
                       "--window-size=1280,1400 --screenshot=" +
                       png.string() + " file://" + html.string() + " >/dev/null 2>&1")
                          .c_str()) == 0);
  const Image img = decode_png(slurp(png));
  int64_t nonwhite = 0, blue = 0, red = 0;
  for (size_t i = 0; i + 2 < img.rgb.size(); i += 3) {
    const int R = img.rgb[i], G = img.rgb[i + 1], B = img.rgb[i + 2];
    nonwhite += (R < 240 || G < 240 || B < 240);
    blue += std::abs(R - 0x1f) < 25 && std::abs(G - 0x77) < 25 &&
            std::abs(B - 0xb4) < 25;  // trial values, importance bars
    red += std::abs(R - 0xd6) < 25 && std::abs(G - 0x27) < 25 &&
           std::abs(B - 0x28) < 25;  // best-so-far line
  }
  INFO("non-white " << nonwhite << ", blue " << blue << ", red " << red);
  CHECK(nonwhite > int64_t(img.w) * img.h / 50);
  CHECK(blue > 2000);  // the bars alone are solid blue
  CHECK(red > 300);
  CHECK(run("report " + (d / "nothing").string()).code == 3);
}
