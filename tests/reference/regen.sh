#!/bin/sh
# Regenerates tests/data/reference/{tiny,small}.json from the independent PyTorch reference.
# Builds nothing: give it a built k3prep (argument, or $K3PREP, default build/k3prep/k3prep).
# Needs Debian's python3-torch, python3-numpy, python3-xxhash under /usr/bin/python3.
# Takes a few minutes on 2 cores (small: 93 layers, greedy by full recompute).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
k3prep=${1:-${K3PREP:-$repo/build/k3prep/k3prep}}
py=/usr/bin/python3
out=$repo/tests/data/reference

if [ ! -x "$k3prep" ]; then
  echo "regen.sh: no k3prep at $k3prep (pass the path of a built k3prep or set K3PREP)" >&2
  exit 2
fi
if ! "$py" -c 'import torch, numpy, xxhash' 2>/dev/null; then
  echo "regen.sh: $py lacks torch/numpy/xxhash (apt-get install python3-torch python3-xxhash)" >&2
  exit 2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# The reference must still agree with the outside op fixtures before it may write ours.
"$py" "$here/check_conformance.py" "$repo/tests/data/conformance/ops" > "$tmp/conformance.log" || {
  cat "$tmp/conformance.log" >&2
  echo "regen.sh: check_conformance.py failed; fixtures not regenerated" >&2
  exit 1
}
tail -n 1 "$tmp/conformance.log"

mkdir -p "$out"

# Each preset: the synth command exactly as recorded in the fixture (DIR = the output directory).
"$k3prep" synth --preset tiny --seed 1 --out "$tmp/tiny"
"$py" "$here/k3_ref.py" "$tmp/tiny" --gen 24 \
  --prompt 900,14,777,256,42 \
  --prompt 1038,171,820,1244,857,1220,961,976,1247,787,1108,62 \
  --prompt 7 \
  --fixture "$out/tiny.json" --preset tiny --seed 1 \
  --synth-command "k3prep synth --preset tiny --seed 1 --out DIR"

"$k3prep" synth --preset small --seed 1 --out "$tmp/small"
"$py" "$here/k3_ref.py" "$tmp/small" --gen 24 \
  --prompt 11,4000,256,1024,77,3000,5,2048 \
  --fixture "$out/small.json" --preset small --seed 1 \
  --synth-command "k3prep synth --preset small --seed 1 --out DIR"

echo "regen.sh: wrote $out/tiny.json and $out/small.json"
