#!/usr/bin/env bash
# The README's main-job command: set up, build, then run the product end to end on a built-in
# synthetic model: synth -> verify shards -> pack -> verify prepared -> generate (text, then an
# image through the vision tower).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${K3_BUILD_DIR:-$root/build}"
work="${K3_QUICKSTART_DIR:-$root/out/quickstart}"
preset="${K3_QUICKSTART_PRESET:-tiny}"

step() { printf '\n== %s\n' "$*"; }

step "setup (Debian packages)"
bash "$root/scripts/setup.sh"

step "build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DK3_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target k3prep k3verify k3run

rm -rf "$work"
mkdir -p "$work"

step "k3prep synth --preset $preset"
"$build/k3prep/k3prep" synth --preset "$preset" --out "$work/model" --seed 1
ls -l "$work/model"

step "k3verify shards"
"$build/k3verify/k3verify" shards "$work/model"

step "k3prep pack --experts copy"
"$build/k3prep/k3prep" pack "$work/model" --out "$work/prepared" --experts copy

step "k3verify prepared --deep --against the checkpoint"
"$build/k3verify/k3verify" prepared "$work/prepared" --deep --against "$work/model"

step "k3run: greedy generation of up to 24 tokens from a text prompt"
"$build/k3run/k3run" "$work/prepared" --prompt "The quick brown fox" --gen 24 --out "$work/report.json"
step "k3run: the same with an image (the vision tower, then the answer)"
"$build/k3run/k3run" "$work/prepared" --image "$root/tests/data/images/rgba_61x47.png" \
  --prompt "What is in this picture?" --no-think --gen 24 --out "$work/report-image.json"
printf '\n\nquickstart: done. Report (prompt ids, generated ids and text, timings): %s\n' "$work/report.json"
printf 'With the image: %s (images, image tokens, tower time)\n' "$work/report-image.json"
printf 'The synthetic model has random weights: its text is not meant to read well.\n'
