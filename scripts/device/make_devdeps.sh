#!/usr/bin/env bash
# Fills .devdeps/ (git-ignored via .git/info/exclude) on a Debian 12 machine, for a GPU machine
# without a package registry: the Debian packages mltrain builds against besides LibTorch,
# unpacked (dpkg -x) under .devdeps/root, the Fashion-MNIST files under .devdeps/fashion-mnist and
# the fortunes byte tokens under .devdeps/fortunes. libgloo-dev: pip LibTorch ships c10d's
# ProcessGroupGloo.hpp but not the gloo headers it includes (so no c10d without them).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.devdeps/' .git/info/exclude 2>/dev/null || echo '/.devdeps/' >>.git/info/exclude
rm -rf .devdeps && mkdir -p .devdeps/debs .devdeps/root .devdeps/fashion-mnist
(cd .devdeps/debs && apt-get download catch2 libcli11-dev libfmt-dev libfmt9 libgloo-dev libspdlog-dev libspdlog1.10 \
  libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev zlib1g-dev libssl-dev libssl3)
for f in .devdeps/debs/*.deb; do dpkg -x "$f" .devdeps/root; done
rm -rf .devdeps/debs
# The device call carries at most 64 MiB with the sources: no static libraries or docs.
find .devdeps/root -name '*.a' -delete
rm -rf .devdeps/root/usr/share/doc .devdeps/root/usr/share/man
# zlib1g-dev's libz.so points at this machine's /lib; ship the library itself.
lib=.devdeps/root/usr/lib/x86_64-linux-gnu
real=$(readlink -f /lib/x86_64-linux-gnu/libz.so.1)
rm -f $lib/libz.so && cp "$real" $lib/ && ln -s "$(basename "$real")" $lib/libz.so
cp /usr/share/datasets/fashion-mnist/*.gz .devdeps/fashion-mnist/
# The GPT's byte tokens (configs/text_char_gpt.yaml), made by this machine's mltrain.
if [ -x build/apps/mltrain/mltrain ]; then bash scripts/data/fortunes.sh build/apps/mltrain/mltrain .devdeps/fortunes; fi
du -sh .devdeps
