#!/usr/bin/env bash
# Builds the pip wheel dist/mltrain-<version>-py3-none-manylinux_2_35_x86_64.whl for users without
# root (docs/guide/install.md, "Without root"): scikit-build-core runs the same CMake build as
# scripts/build.sh in build-wheel/ (incremental, ccache), with packaging/install.cmake's layout;
# auditwheel then bundles every shared library the binaries need that is not glibc's or the torch
# wheel's (yaml-cpp, spdlog, fmt, libcurl and its TLS stack, TurboJPEG, libspng, libdeflate,
# oneDNN, SentencePiece, ...) into mltrain.libs/. torch's own libraries and the CUDA libraries of
# its nvidia-* dependencies are excluded: the wheel depends on torch==2.15.* and loads those.
#
#   bash scripts/wheel.sh            # -> dist/mltrain-*.whl
#   bash scripts/test_wheel.sh       # installs it on a bare Debian 12 as a user without root
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
if [ ! -x "$py" ] || ! "$py" -c "import scikit_build_core, auditwheel" 2>/dev/null; then
  echo "mltrain: error: .venv lacks scikit-build-core or auditwheel (fix: bash scripts/venv.sh)" >&2
  exit 2
fi
start=$(date +%s)
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
# --no-build-isolation: the build links the LibTorch of .venv's torch (third_party/torch.cmake),
# the same one the wheel then declares.
PATH="$PWD/.venv/bin:$PATH" "$py" -m pip wheel . -q --no-build-isolation --no-deps -w "$raw"
site=$(echo "$PWD"/.venv/lib/python3*/site-packages)
# (Patterns name CUDA's libraries one family at a time: a bare libcu* would take libcurl too.)
excl=(--exclude 'libtorch*.so' --exclude 'libc10*.so' --exclude libgomp.so.1 --exclude libcuda.so.1)
for f in cudart cublas cublasLt cudnn cufft cufile curand cusolver cusparse cusparseLt cupti nccl \
         nvrtc nvJitLink nvshmem nvToolsExt nvtx; do
  excl+=(--exclude "lib$f*")
done
# auditwheel resolves the binaries' needs like the loader would: torch's folders are on the path
# only so the excluded libraries are found and not reported missing.
# --plat auto: the oldest manylinux tag the binaries' glibc and libstdc++ symbols allow.
rm -f dist/mltrain-*.whl
if ! PATH="$PWD/.venv/bin:$PATH" LD_LIBRARY_PATH="$site/torch/lib:$(printf '%s:' "$site"/nvidia/*/lib)" \
  "$py" -m auditwheel repair --plat auto "${excl[@]}" -w dist "$raw"/*.whl > "$raw/repair.log" 2>&1; then
  cat "$raw/repair.log" >&2
  echo "mltrain: error: auditwheel repair failed (above)" >&2
  exit 1
fi
grep -v "^INFO:auditwheel.lddtree:Excluding" "$raw/repair.log" || true
whl=$(ls -t dist/mltrain-*.whl | head -1)
echo "wheel: $whl ($(du -h "$whl" | cut -f1), $(( $(date +%s) - start )) s)"
