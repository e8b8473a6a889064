#!/usr/bin/env bash
# Fails when a shared library the mltrain binary loads defines a global symbol that LibTorch's
# libc10/libtorch_cpu also define (C++ standard-library instantiations aside): the dynamic linker
# binds every reference to one of the two, so each library writes over the other's object.
# Found the hard way: libsentencepiece.so.0 and libc10.so both define FLAGS_minloglevel, and with
# both in one process TorchScript calls deadlocked in c10's logging (hence the mltrain_spm helper).
#   bash scripts/dev/check_symbol_clash.sh BINARY
set -euo pipefail
bin=${1:?usage: check_symbol_clash.sh BINARY}
libs=$(ldd "$bin" | awk '$3 ~ /^\// {print $3}')
torch=$(echo "$libs" | grep -E '/libc10\.so|/libtorch_cpu\.so' || true)
[ -n "$torch" ] || { echo "check_symbol_clash: $bin links no LibTorch"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nm -D --defined-only $torch | awk 'NF==3 {print $3}' | sort -u >"$tmp/torch"
bad=0
for l in $(echo "$libs" | grep -vE '/libc10|/libtorch|/libc\.so|/libm\.so|/libstdc\+\+|/libgcc_s|/ld-linux'); do
  # Template instantiations of the standard library (std::, __gnu_cxx::) are identical copies.
  nm -D --defined-only "$l" 2>/dev/null | awk 'NF==3 {print $3}' | sort -u | comm -12 - "$tmp/torch" |
    c++filt | grep -vE 'std::|__gnu_cxx::|^(typeinfo|typeinfo name) for (void|int|long|char|bool|double|float)' >"$tmp/both" || true
  if [ -s "$tmp/both" ]; then
    echo "check_symbol_clash: $l and LibTorch both define:" && head -5 "$tmp/both"
    bad=1
  fi
done
[ $bad -eq 0 ] && echo "check_symbol_clash: $(echo "$libs" | wc -l) libraries, no symbol also defined by LibTorch"
exit $bad
