#!/usr/bin/env bash
# Installs everything mltrain needs on a fresh Debian 12, from Debian's registry only.
# Idempotent: packages already present are skipped by apt; safe to re-run (CI does).
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build ccache pkg-config
  clang-format python3                # scripts/check-format.sh (CI fails on unformatted C++); scripts/dev/ checks
  clang libclang-rt-14-dev            # the ASan + UBSan build and the libFuzzer targets (scripts/sanitize.sh, fuzz.sh)
  libtorch-dev libgloo-dev            # LibTorch 1.13 (CPU, c10d) and its Gloo backend
  libcli11-dev libyaml-cpp-dev libspdlog-dev libfmt-dev nlohmann-json3-dev catch2 zlib1g-dev
  libturbojpeg0-dev libspng-dev       # JPEG and PNG decoding for image folders (data.format: image_folder)

  dataset-fashion-mnist               # the real data: gzipped IDX under /usr/share/datasets/fashion-mnist
  python3-torch python3-numpy         # reference values, the Python baseline in benchmarks, scripts/guide/ data
  python3-optuna                      # the tuner benchmark's side-by-side baseline (scripts/bench/tune/) only
  python3-pil python3-torchvision     # the image-folder export and the side-by-side loader benchmark only
  python3-sklearn                     # metric goldens (tests/golden/) and the tabular data export (scripts/data/) only
  fortunes                            # real English text for the character-level GPT job (/usr/share/games/fortunes)
  chromium                            # renders `mltrain report` pages in the report test (headless)
  slurmctld slurmd slurm-client munge # a real single-node Slurm for the Slurm tests (scripts/slurm/cluster.sh)
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: installed ${missing[*]}"
