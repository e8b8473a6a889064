#!/usr/bin/env bash
# The zip and pt2 fuzzers' seeds (tests/fuzz/fuzz_pt2.cpp), from a tiny module torch.export
# exports: OUT/zip/{stored,deflated}.pt2 and OUT/pt2/parts (model.json, the weights config,
# weight_0, ... joined by fuzz_pt2.cpp's kPart marker). Called by make_corpus.sh; alone:
#   bash tests/fuzz/make_pt2_corpus.sh tests/fuzz/corpus
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-tests/fuzz/corpus}
mkdir -p "$out/zip" "$out/pt2"
.venv/bin/python - "$out" <<'PY'
import json, sys, zipfile, io
import torch, torch.nn as nn
from torch.export import Dim
out = sys.argv[1]
torch.manual_seed(0)
class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.drop, self.fc = nn.Conv2d(3, 2, 3), nn.BatchNorm2d(2), nn.Dropout(0.5), nn.Linear(8, 3)
    def forward(self, x):
        return self.fc(torch.flatten(self.drop(torch.relu(self.bn(self.conv(x)))), 1))
buf = io.BytesIO()
torch.export.save(torch.export.export(Tiny().train(), (torch.randn(2, 3, 4, 4),), dynamic_shapes=({0: Dim("batch")},)), buf)
raw = buf.getvalue()
open(f"{out}/zip/stored.pt2", "wb").write(raw)
z = zipfile.ZipFile(io.BytesIO(raw))
with zipfile.ZipFile(f"{out}/zip/deflated.pt2", "w", zipfile.ZIP_DEFLATED) as d:
    for n in z.namelist():
        d.writestr(n, z.read(n))
name = lambda tail: next(n for n in z.namelist() if n.endswith(tail))
program = json.loads(z.read(name("models/model.json")))
config = json.loads(z.read(name("data/weights/model_weights_config.json")))
# The fuzzer names the k-th weight part weight_k: renumber the config's files in that order.
files = sorted({v["path_name"] for v in config["config"].values()}, key=lambda p: int(p.split("_")[1]))
for v in config["config"].values():
    v["path_name"] = f"weight_{files.index(v['path_name'])}"
parts = [json.dumps(program).encode(), json.dumps(config).encode()]
parts += [z.read(name(f"data/weights/{f}")) for f in files]
open(f"{out}/pt2/parts", "wb").write(b"\n=PT2PART=\n".join(parts))
PY
