#!/usr/bin/env python3
"""Regenerates tests/golden/images.json: what PIL (Debian python3-pil, libjpeg-turbo inside) and
torchvision's transforms make of small images, for the C++ decoder and resize tests.

    .venv/bin/python tests/golden/make_image_golden.py

Cases: JPEG (gray and RGB) decoded by PIL, bytes stored hex; an RGB PNG converted to "L"; and
torchvision's Resize(S) + CenterCrop(S) (PIL bilinear) of an RGB image, upscaled and downscaled.
"""
import io
import json

import numpy as np
import PIL
import torchvision
from PIL import Image
from torchvision import transforms as T

rng = np.random.default_rng(17)
out = {"pil_version": PIL.__version__, "torchvision_version": torchvision.__version__}


def encode(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


# A smooth image with noise, so JPEG and resampling have something to do.
h, w = 19, 27
yy, xx = np.mgrid[0:h, 0:w]
rgb = np.stack([(xx * 9) % 256, (yy * 13) % 256, (xx * yy) % 256], -1).astype(np.int32)
rgb = np.clip(rgb + rng.integers(-20, 21, size=rgb.shape), 0, 255).astype(np.uint8)
img = Image.fromarray(rgb, "RGB")
gray = img.convert("L")

cases = []
for name, im in (("gray", gray), ("rgb", img)):
    data = encode(im, "JPEG", quality=90)
    dec = np.asarray(Image.open(io.BytesIO(data)).convert("RGB" if name == "rgb" else "L"))
    cases.append({"name": "jpeg_" + name, "bytes": data.hex(), "channels": 3 if name == "rgb" else 1,
                  "h": h, "w": w, "pixels": dec.reshape(-1).tolist()})
png = encode(img, "PNG")
cases.append({"name": "png_rgb_to_l", "bytes": png.hex(), "channels": 1, "h": h, "w": w,
              "pixels": np.asarray(Image.open(io.BytesIO(png)).convert("L")).reshape(-1).tolist()})
out["decode"] = cases
out["cmyk_jpeg"] = encode(Image.new("CMYK", (6, 6), (10, 20, 30, 40)), "JPEG").hex()

resize = []
for size, crop in ((7, 7), (12, 9), (40, 33)):
    t = T.Compose([T.Resize(size), T.CenterCrop(crop)])
    r = np.asarray(t(img))  # HWC
    resize.append({"resize": size, "size": crop, "chw": r.transpose(2, 0, 1).reshape(-1).tolist()})
out["source_rgb_hwc"] = rgb.reshape(-1).tolist()
out["source_h"], out["source_w"] = h, w
out["resize"] = resize

with open("tests/golden/images.json", "w") as f:
    json.dump(out, f)
print("wrote tests/golden/images.json")
