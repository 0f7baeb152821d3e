#!/usr/bin/env bash
# Compares the SASS of two builds of libmlacore (or any two CUDA binaries),
# function by function, ignoring what a pure file move changes: addresses,
# encodings' comments, and the file-path hashes in anonymous-namespace names.
#   bash tools/sass_diff.sh OLD/libmlacore.so NEW/libmlacore.so
# Needs cuobjdump and nvdisasm on PATH (CUDA toolkit, or the pip packages
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm). Exit 0: identical.
set -euo pipefail
norm() {
  cuobjdump -sass "$1" \
    | grep -vE '^\s*$|Fatbin|code for|arch =|Compiled from|host =|compile_size|identifier|^\s*\.\.\.' \
    | sed -E 's@/\*[0-9a-f]{4}\*/@@; s@/\* 0x[0-9a-f]+ \*/@@g; s/[[:space:]]+$//' \
    | sed -E 's/_GLOBAL__N__[0-9a-f]{8}_/_GLOBAL__N__X_/g; s/_cu_[0-9a-f]{8}_[0-9]+/_cu_H/g'
}
a=$(mktemp); b=$(mktemp); trap 'rm -f "$a" "$b"' EXIT
norm "$1" > "$a"; norm "$2" > "$b"
echo "functions: $(grep -c 'Function :' "$a") / $(grep -c 'Function :' "$b")"
if cmp -s "$a" "$b"; then echo "SASS identical"; else diff "$a" "$b" | head -40; echo "SASS differs"; exit 1; fi
