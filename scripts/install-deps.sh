#!/usr/bin/env bash
# Installs the Debian packages mltrain needs on a fresh Debian 12. LibTorch and the Python side
# (torch 2.15, torchvision, numpy, scikit-learn, optuna, mlflow, tensorboard) come from PyPI into
# .venv/ (scripts/venv.sh).
# Idempotent: packages already present are skipped by apt; safe to re-run (CI does).
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build ccache pkg-config
  clang-format python3 python3-venv   # scripts/check-format.sh (CI fails on unformatted C++); scripts/dev/ checks; .venv
  clang libclang-rt-14-dev            # the ASan + UBSan build and the libFuzzer targets (scripts/sanitize.sh, fuzz.sh)
  libgloo-dev                         # gloo's headers, which c10d's ProcessGroupGloo.hpp includes (the wheel ships c10d's only)
  libdnnl2                            # oneDNN's sgemm for the kernel route (runtime.kernel_route: onednn), loaded at run time
  libcli11-dev libyaml-cpp-dev libspdlog-dev libfmt-dev nlohmann-json3-dev catch2 zlib1g-dev
  libdeflate-dev                      # whole-buffer gzip decoding, ~2x zlib's: Fashion-MNIST loads in half the time
  libturbojpeg0-dev libspng-dev       # JPEG and PNG decoding for image folders (data.format: image_folder)
  libssl-dev                          # SHA-256 of checkpoints and chunk sets (libcrypto)
  libcurl4-openssl-dev                # the MLflow REST sink (tracking.mlflow)
  libsentencepiece-dev                # `mltrain data tokenize --sentencepiece`

  dataset-fashion-mnist               # the real data: gzipped IDX under /usr/share/datasets/fashion-mnist
  fortunes                            # real English text for the character-level GPT job (/usr/share/games/fortunes)
  chromium                            # renders `mltrain report` pages in the report test (headless)
  slurmctld slurmd slurm-client munge # a real single-node Slurm for the Slurm tests (scripts/slurm/cluster.sh)
  openmpi-bin mpich                   # real mpirun (Open MPI) and mpiexec.hydra (MPICH) for the MPI-launcher tests
  nftables                            # the doctor test drops loopback packets in a network namespace of its own
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
