#!/usr/bin/env bash
# End to end through the real binaries, as a user runs them: synth → verify shards → pack in
# link, copy and striped copy mode → verify prepared --deep --against → tensor fixtures emitted
# from the checkpoint and checked against each prepared dir → k3run gives the same ids from every
# prepared dir. Usage: pipeline_test.sh BUILD_DIR PRESET
set -euo pipefail
build="$1"
preset="$2"
k3prep="$build/k3prep/k3prep"
k3verify="$build/k3verify/k3verify"
k3run="$build/k3run/k3run"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

run() { echo "+ $*"; "$@"; }

run "$k3prep" synth --preset "$preset" --seed 3 --out "$work/ck" --quiet
run "$k3verify" shards "$work/ck" --quiet > "$work/shards.txt"
grep -q '^verdict: OK' "$work/shards.txt"

run "$k3prep" pack "$work/ck" --out "$work/link" --experts link --quiet
run "$k3prep" pack "$work/ck" --out "$work/copy" --experts copy --quiet
mkdir -p "$work/disk1" "$work/disk2"
run "$k3prep" pack "$work/ck" --out "$work/stripe" --experts copy \
  --stripe "$work/disk1,$work/disk2" --quiet
# The stripe rule puts experts on both disks.
[ -n "$(ls "$work/disk1")" ] && [ -n "$(ls "$work/disk2")" ]

run "$k3verify" tensors "$work/ck" --emit "$work/fixture.json" --quiet
for p in link copy stripe; do
  run "$k3verify" prepared "$work/$p" --deep --against "$work/ck" --quiet
  run "$k3verify" tensors "$work/$p" --fixtures "$work/fixture.json" --quiet
  run "$k3run" "$work/$p" --ids 1,2,3,4,5 --gen 8 --quiet --out "$work/$p.json" > /dev/null
done

# The same ids from every prepared dir (the engine reads only the prepared directory).
ids() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["generated_ids"])' "$1"; }
[ "$(ids "$work/link.json")" = "$(ids "$work/copy.json")" ]
[ "$(ids "$work/link.json")" = "$(ids "$work/stripe.json")" ]

# A flipped byte in a packed trunk run is found by --deep (exit 3) and named.
/usr/bin/python3 - "$work/copy/trunk.bin" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(100); b = f.read(1); f.seek(100); f.write(bytes([b[0] ^ 0x10]))
PY
set +e
"$k3verify" prepared "$work/copy" --deep --quiet > "$work/bad.txt" 2>&1
rc=$?
set -e
[ "$rc" = 3 ] || { echo "expected exit 3 for a flipped trunk byte, got $rc"; cat "$work/bad.txt"; exit 1; }
grep -q 'trunk.bin' "$work/bad.txt"
echo "pipeline $preset: OK"
