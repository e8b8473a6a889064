#!/usr/bin/env bash
# What scripts/test_wheel.sh runs inside the bare Debian 12 root, as uid 1000 (no root, no
# compiler). Each step prints "test_wheel: <step> ok (N s)"; the first failure stops the script.
set -euo pipefail
cd "$HOME"
t0=$(date +%s)
ok() { echo "test_wheel: $1 ok ($(( $(date +%s) - t0 )) s)"; }
die() { echo "test_wheel: FAILED: $1" >&2; exit 1; }
expect() { grep -q -- "$1" "$2" || { cat "$2" >&2; die "$3: no '$1' in its output"; }; }

[ "$(id -u)" != 0 ] || die "running as root"
for c in cc gcc g++ c++ clang make cmake; do ! command -v "$c" >/dev/null || die "$c is installed"; done
! dpkg -l | awk '/^ii/ {print $2}' | grep -E -- '-dev(:|$)|^libyaml-cpp|^libspdlog|^libcurl|^libdnnl|^libturbojpeg|^libspng' ||
  die "a -dev or install-deps package is in the root"
ok "bare root (uid $(id -u), no compiler, no -dev or install-deps package)"

python3 -m venv venv
venv/bin/pip install -q --disable-pip-version-check --no-index --find-links /wheels \
  "torch==$TORCH_VERSION" /dist/mltrain-*.whl > pip.log 2>&1 || { cat pip.log >&2; die "pip install"; }
export PATH="$HOME/venv/bin:$PATH"
ok "pip install torch==$TORCH_VERSION and $(basename /dist/mltrain-*.whl) into a venv"

[ "$(command -v mltrain)" = "$HOME/venv/bin/mltrain" ] || die "mltrain is not the venv's"
mltrain --version > version.txt 2>&1 || { cat version.txt >&2; die "--version"; }
cat version.txt
expect "package: wheel mltrain-" version.txt "--version"
expect "LibTorch $TORCH_VERSION ($HOME/venv/lib/python3" version.txt "--version"
expect "CUDA compiled in: yes" version.txt "--version"
python -m mltrain --version > version2.txt 2>&1 && cmp -s version.txt version2.txt ||
  die "python -m mltrain --version differs from mltrain --version"
ok "--version and python -m mltrain"

# The CUDA plugin in the wheel resolves the torch wheel's CUDA libraries (no driver here: forced on,
# it loads them and then sees no GPU, as on a GPU node without a visible device).
MLTRAIN_CUDA=on mltrain --version > cuda.txt 2>&1 || { cat cuda.txt >&2; die "MLTRAIN_CUDA=on --version"; }
expect "CUDA libraries: loaded ($HOME/venv/lib/python3" cuda.txt "MLTRAIN_CUDA=on --version"
expect "libtorch_cuda.so in this process: yes" cuda.txt "MLTRAIN_CUDA=on --version"
ok "the CUDA plugin loads the torch wheel's CUDA libraries (MLTRAIN_CUDA=on)"

mltrain checklist > checklist.txt 2>&1 || { cat checklist.txt >&2; die "checklist (exit $?)"; }
tail -3 checklist.txt
ok "checklist"

mltrain config example > examples.txt
expect "fashion_mnist_cnn" examples.txt "config example"
mltrain config example fashion_mnist_cnn -o cnn.yaml > /dev/null
mltrain train cnn.yaml run.name=nodata data.root="$HOME/nowhere" > nodata.txt 2>&1 && die "train without data succeeded"
[ "$(mltrain train cnn.yaml data.root="$HOME/nowhere" > /dev/null 2>&1; echo $?)" = 3 ] || die "missing data: exit code is not 3"
expect "Fashion-MNIST not found" nodata.txt "train without data"
expect "set data.root=FOLDER" nodata.txt "train without data"
ok "config example, and the missing-data error (exit 3, says where to put the files)"

common=(data.root="$HOME/fmnist" train.duration=200u train.eval_every=200u checkpoint.every=200u
        train.target_accuracy=0)
mltrain train cnn.yaml run.name=wheel_cnn "${common[@]}" > train.txt 2>&1 || { cat train.txt >&2; die "train"; }
grep "test accuracy" train.txt
# The kernel route's oneDNN is the wheel's own copy (mltrain/lib/libdnnl.so.2), found by RUNPATH.
! grep -q "libdnnl.so.2 could not be loaded" train.txt || die "train: the bundled libdnnl.so.2 did not load"
acc=$(sed -n 's/^test accuracy: \([0-9.]*\).*/\1/p' train.txt)
python3 -c "import sys; sys.exit(0 if float('$acc') > 0.75 else 1)" || die "accuracy $acc after 200 steps (want > 0.75)"
ok "train (CNN, 200 steps, accuracy $acc)"

mltrain predict runs/wheel_cnn/v0 fmnist/t10k-images-idx3-ubyte.gz -o preds.csv > predict.txt 2>&1 ||
  { cat predict.txt >&2; die "predict"; }
[ "$(wc -l < preds.csv)" = 10001 ] || die "predict wrote $(wc -l < preds.csv) lines, want 10001"
right=$(python3 - <<'PY'
import csv, gzip
labels = gzip.open("fmnist/t10k-labels-idx1-ubyte.gz").read()[8:]
rows = list(csv.DictReader(open("preds.csv")))
print(sum(int(r["prediction"]) == labels[i] for i, r in enumerate(rows)) / len(rows))
PY
)
python3 -c "import sys; sys.exit(0 if abs(float('$right') - float('$acc')) < 1e-3 else 1)" ||
  die "predict's accuracy $right differs from train's $acc"
ok "predict (10,000 rows, accuracy $right = train's)"

mltrain launch --nproc-per-node 2 -- mltrain train cnn.yaml run.name=wheel_ddp "${common[@]}" \
  train.duration=50u train.eval_every=50u checkpoint.every=50u > launch.txt 2>&1 ||
  { tail -30 launch.txt >&2; die "launch"; }
grep -q "test accuracy" launch.txt || { tail -30 launch.txt >&2; die "launch: no result"; }
ok "launch (2 ranks over Gloo, 50 steps)"

# The SentencePiece helper (mltrain_spm, its libsentencepiece grafted into mltrain.libs/).
python3 -c "
import random; random.seed(0); w = ['sea', 'ship', 'sail', 'wind', 'port', 'star', 'tide', 'mast']
open('text.txt', 'w').write('\\n'.join(' '.join(random.choice(w) for _ in range(12)) for _ in range(400)))"
mltrain data tokenize text.txt --train-sentencepiece 30 -o tokens > spm.txt 2>&1 || { cat spm.txt >&2; die "data tokenize"; }
[ -s tokens/tokenizer.model ] && [ -s tokens/train.bin ] || { cat spm.txt >&2; die "data tokenize wrote no model or tokens"; }
ok "data tokenize --train-sentencepiece (the SentencePiece helper)"
