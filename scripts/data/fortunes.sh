#!/usr/bin/env bash
# Byte-level tokens of the English text in Debian's `fortunes` package (scripts/install-deps.sh),
# for configs/text_char_gpt.yaml: writes data/fortunes/{train,val}.bin and meta.json.
#   scripts/data/fortunes.sh [MLTRAIN] [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
mltrain=${1:-build/apps/mltrain/mltrain}
out=${2:-data/fortunes}
src=/usr/share/games/fortunes
[ -d "$src" ] || { echo "fortunes.sh: $src missing: run scripts/install-deps.sh (package fortunes)" >&2; exit 3; }
# Every text file of the package except the ASCII-art collections, in a fixed (sorted) order.
files=()
for f in "$src"/*; do
  name=$(basename "$f")
  case "$name" in *.dat|*.u8|art|ascii-art) continue ;; esac
  [ -f "$f" ] && files+=("$f")
done
"$mltrain" data tokenize "${files[@]}" -o "$out" --bytes --val-fraction 0.05
