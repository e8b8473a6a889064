#!/usr/bin/env bash
# Regenerates the fuzzers' seed corpus (tests/fuzz/corpus/<target>/) from real files: a short
# training run's checkpoint, manifest and event file, `mltrain data convert` outputs, numpy's .npy
# files, Fashion-MNIST's IDX, a real tune journal, the repository's configs. Needs build/.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=build/apps/mltrain/mltrain
out=tests/fuzz/corpus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$out" && mkdir -p "$out"/{config,period,npy,idx,shard,chunk_index,safetensors,manifest,journal,hostlist,tensorboard,zip,pt2}

# config: the shipped configs (small ones), one with overrides after a NUL byte
for f in configs/fashion_mnist_mlp.yaml configs/fashion_mnist_cnn.yaml configs/diabetes_regression.yaml \
         configs/text_char_gpt.yaml configs/starved_loader.yaml; do
  [ -f "$f" ] && cp "$f" "$out/config/$(basename "$f")"
done
printf 'run: {name: x}\n\0optim.lr=0.01\ntrain.duration=2ep\nmodel.channels=[8, 16]\n' > "$out/config/with_overrides"
# period
for p in 10ep 500u never 0.5ep 30m 2h 45s 1.5e2u; do printf '%s' "$p" > "$out/period/$p"; done
# hostlist
printf 'node[01-04,07],gpu-[1-2]' > "$out/hostlist/ranges"
printf 'localhost' > "$out/hostlist/single"
printf 'a,b,c[1-3]' > "$out/hostlist/mixed"

# a short real run: checkpoint, manifest, TensorBoard events
$bin train configs/fashion_mnist_cnn.yaml run.dir="$tmp/runs" run.name=s data.limit_train=256 \
  data.batch_size=64 train.duration=4u checkpoint.every=4u model.channels='[2, 4]' model.fc=8 \
  train.eval_every=never runtime.threads=1 > /dev/null 2>&1
ck="$tmp/runs/s/v0/checkpoints/step_4"
cp "$ck/model.safetensors" "$out/safetensors/cnn_model.safetensors"
cp tests/golden/gpt_tiny_nobias.safetensors "$out/safetensors/"
cp "$ck/manifest.json" "$out/manifest/real_manifest.json"
cp "$tmp"/runs/s/v0/events.out.tfevents.* "$out/tensorboard/run.tfevents"

.venv/bin/python - "$out" <<'PY'
import gzip, hashlib, json, struct, sys
import numpy as np
out = sys.argv[1]
# npy: what numpy writes, several dtypes and ranks
np.save(f"{out}/npy/u8_2x3x4.npy", np.arange(24, dtype=np.uint8).reshape(2, 3, 4))
np.save(f"{out}/npy/f32_5.npy", np.linspace(0, 1, 5, dtype=np.float32))
np.save(f"{out}/npy/i64_3.npy", np.array([0, 1, 2], dtype=np.int64))
np.save(f"{out}/npy/u16_2x2.npy", np.array([[1, 2], [3, 4]], dtype=np.uint16))
np.save(f"{out}/npy/f32_fortran.npy", np.asfortranarray(np.ones((2, 3), dtype=np.float32)))
# idx: the first Fashion-MNIST test labels and images, with their counts cut to what is kept
src = "/usr/share/datasets/fashion-mnist"
with gzip.open(f"{src}/t10k-labels-idx1-ubyte.gz") as f:
    lab = f.read()
open(f"{out}/idx/labels_16", "wb").write(struct.pack(">II", 2049, 16) + lab[8:24])
with gzip.open(f"{src}/t10k-images-idx3-ubyte.gz") as f:
    img = f.read()
open(f"{out}/idx/images_2", "wb").write(struct.pack(">IIII", 2051, 2, 28, 28) + img[16:16 + 2 * 784])
# manifest: one that verifies against the fuzzer's own files (fuzz_manifest.cpp)
files = {"model.safetensors": b"m" * 100, "trainer.json": b'{"step": 7}\n'}
m = {"format": "mltrain-checkpoint-1", "step": 7,
     "files": {k: {"bytes": len(v), "sha256": hashlib.sha256(v).hexdigest()} for k, v in files.items()}}
open(f"{out}/manifest/intact.json", "w").write(json.dumps(m, indent=2) + "\n")
# chunk index: the shape of `mltrain data convert`'s index.json over the fuzzer's c0.bin (8 KiB)
# and targets.bin (8 zero labels)
idx = {"format": "mltrain-chunks", "version": 1, "count": 8, "chunk_samples": 8, "num_classes": 10,
       "sample_shape": [1, 32, 32], "dtype": "u8", "storage": "raw",
       "targets": {"file": "targets.bin", "kind": "class", "sha256": hashlib.sha256(b"\0" * 64).hexdigest()},
       "chunks": [{"file": "c0.bin", "count": 8, "bytes": 8192, "sha256": "0" * 64}]}
open(f"{out}/chunk_index/raw_u8.json", "w").write(json.dumps(idx, indent=1) + "\n")
PY

# zip and pt2: a tiny module exported by torch.export (a Conv, BatchNorm, Dropout and Linear), as
# the archive itself (zip; also deflated) and as fuzz_pt2's parts (model.json, weights config,
# weight_0, ... between markers)
bash tests/fuzz/make_pt2_corpus.sh "$out"

# shard and a real chunk index from `mltrain data convert`
.venv/bin/python -c "
import numpy as np
np.save('$tmp/img.npy', (np.arange(4*28*28) % 251).astype(np.uint8).reshape(4, 28, 28))
np.save('$tmp/lab.npy', np.array([0, 1, 2, 1], dtype=np.int64))"
$bin data convert --images "$tmp/img.npy" --labels "$tmp/lab.npy" -o "$tmp/s.shard" --num-classes 3 > /dev/null
cp "$tmp/s.shard" "$out/shard/four_28x28.shard"
$bin data convert --images "$tmp/img.npy" --labels "$tmp/lab.npy" -o "$tmp/chunks" --num-classes 3 > /dev/null
cp "$tmp/chunks/index.json" "$out/chunk_index/converted.json"

# journal: a real study of command trials
cat > "$tmp/trial.sh" <<'SH'
#!/bin/sh
for s in 1 2; do echo "{\"step\": $s, \"loss\": $MLTRAIN_PARAM_LR}"; done
SH
chmod +x "$tmp/trial.sh"
cat > "$tmp/study.yaml" <<YAML
study: {name: j, dir: $tmp/tune, n_trials: 4, seed: 1}
sampler: {name: random}
objective: {metric: loss, direction: minimize}
trial: {command: [$tmp/trial.sh]}
space:
  lr: {type: float, low: 0.0001, high: 1.0, log: true}
  width: {type: int, low: 8, high: 64}
YAML
$bin tune "$tmp/study.yaml" -q > /dev/null 2>&1
cp "$tmp/tune/j/journal.jsonl" "$out/journal/real.jsonl"
find "$out" -type f | wc -l
