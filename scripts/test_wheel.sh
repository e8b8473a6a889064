#!/usr/bin/env bash
# Installs dist/mltrain-*.whl the way a cluster user without root would, and runs it: a bare
# Debian 12 root made by debootstrap (minbase plus python3-venv: no compiler, no -dev package, none
# of scripts/install-deps.sh's packages), entered with chroot as uid 1000. Inside: a venv, pip
# install of torch 2.15 (from a local wheel folder, no index) and of mltrain's wheel, then
# --version, python -m mltrain, the CUDA plugin's libraries (forced on), checklist, config example,
# the error for a missing data set, a short CNN training on Fashion-MNIST files copied in, predict,
# a 2-rank launch over Gloo, and SentencePiece tokenizing (scripts/test_wheel_steps.sh).
#
#   bash scripts/wheel.sh && bash scripts/test_wheel.sh     # as root (debootstrap, chroot, mounts)
#
# First run: debootstrap (~2 min) and `pip download torch` (2.8 GB) into
# $MLTRAIN_WHEEL_TEST_CACHE (~/.cache/mltrain-wheel-test); later runs reuse both and need no network.
# Not part of ctest: the install alone unpacks ~6 GB. Its last result: docs/guide/install.md.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
cache=${MLTRAIN_WHEEL_TEST_CACHE:-$HOME/.cache/mltrain-wheel-test}
fail() { echo "mltrain: error: test_wheel: $1" >&2; exit 2; }
[ "$(id -u)" = 0 ] || fail "needs root to build and enter the chroot (the steps inside run as uid 1000) (fix: sudo bash scripts/test_wheel.sh)"
command -v debootstrap >/dev/null || fail "no debootstrap (fix: apt-get install debootstrap)"
whl=$(ls -t dist/mltrain-*.whl 2>/dev/null | head -1 || true)
[ -n "$whl" ] || fail "no dist/mltrain-*.whl (fix: bash scripts/wheel.sh)"
fmnist=/usr/share/datasets/fashion-mnist
[ -f "$fmnist/train-images-idx3-ubyte.gz" ] || fail "no Fashion-MNIST in $fmnist to copy in (fix: bash scripts/install-deps.sh)"
start=$(date +%s)
mkdir -p "$cache"

# 1. The bare root, made once from the Debian mirror apt already uses.
if [ ! -f "$cache/base/.complete" ]; then
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $3 ~ /^bookworm/ {print $2; exit}' /etc/apt/sources.list)
  [ -n "$mirror" ] || fail "no Debian mirror in /etc/apt/sources.list(.d) for debootstrap"
  rm -rf "$cache/base.tmp"
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$cache/base.tmp" "$mirror" \
    > "$cache/debootstrap.log" 2>&1 || fail "debootstrap failed (see $cache/debootstrap.log)"
  touch "$cache/base.tmp/.complete"
  rm -rf "$cache/base" && mv "$cache/base.tmp" "$cache/base"
fi
# 2. torch and its nvidia-* dependencies as wheel files, fetched once.
torch=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('torch'))")  # pip's: 2.15.0
if [ ! -f "$cache/wheels/.complete-$torch" ]; then
  .venv/bin/pip download -q -d "$cache/wheels" "torch==$torch" || fail "pip download torch==$torch failed"
  touch "$cache/wheels/.complete-$torch"
fi

# 3. A fresh copy of the root for this run; the mounts and the copy go when the script ends.
root=$(mktemp -d /tmp/mltrain-wheel-root.XXXXXX)
cleanup() {
  for m in wheels dev/pts dev/shm dev proc; do umount -l "$root/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT
cp -a "$cache/base/." "$root/"
mkdir -p "$root/wheels" "$root/home/user/fmnist" "$root/dist"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
mount --bind /dev/shm "$root/dev/shm"
mount --bind -o ro "$cache/wheels" "$root/wheels"
cp "$whl" "$root/dist/"
cp "$fmnist"/*-ubyte.gz "$root/home/user/fmnist/"
cp "$repo/scripts/test_wheel_steps.sh" "$root/home/user/steps.sh"
chown -R 1000:1000 "$root/home/user"
chmod 1777 "$root/tmp"
echo "test_wheel: root ready in $(( $(date +%s) - start )) s ($whl, torch $torch)"
chroot --userspec=1000:1000 "$root" /usr/bin/env -i HOME=/home/user USER=user LANG=C.UTF-8 \
  PATH=/usr/local/bin:/usr/bin:/bin TORCH_VERSION="$torch" /bin/bash /home/user/steps.sh
echo "test_wheel: passed in $(( $(date +%s) - start )) s"
