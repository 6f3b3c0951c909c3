#!/usr/bin/env bash
# Prep benchmark (DESIGN.md §9 "Prep"): `k3prep pack --experts copy` against `cp` of the same
# shards, and `k3verify prepared --deep` against `dd iflag=direct` of the same prepared files,
# on the same disk in the same run, each step cold (page cache dropped when we are root).
#
# usage: scripts/bench_prep.sh [--build DIR] [--work DIR] [--preset small|bench] [--keep]
#   --build   build directory holding k3prep/k3prep and k3verify/k3verify (default: ./build)
#   --work    scratch directory on the disk to measure (default: /tmp/k3-bench-prep); removed at
#             the end unless --keep
#   --preset  synthetic checkpoint to use (default small, ~280 MB; bench is 18.8 GB and needs
#             ≥ 60 GB free: checkpoint + cp copy + prepared copy)
# Output: one line per step (bytes, seconds, MB/s) and the ratios; paste into docs/PERFORMANCE.md.
set -euo pipefail

build=./build
work=/tmp/k3-bench-prep
preset=small
keep=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --preset) preset=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "bench_prep: unknown argument $1" >&2; exit 2 ;;
  esac
done

k3prep=$build/k3prep/k3prep
k3verify=$build/k3verify/k3verify
[[ -x $k3prep ]] || { echo "bench_prep: $k3prep not built" >&2; exit 2; }
if ! "$k3prep" pack --help >/dev/null 2>&1; then
  echo "bench_prep: $k3prep has no 'pack' subcommand (not wired into k3prep/cli.cpp yet)" >&2
  exit 2
fi

mkdir -p "$work"
[[ $keep == 1 ]] || trap 'rm -rf "$work"' EXIT
model=$work/model
echo "== machine: $(nproc) cores, $(uname -r); disk of $work:"
df -h "$work" | tail -1
avail_kb=$(df -Pk "$work" | awk 'NR==2 {print $4}')
if [[ $preset == bench && $avail_kb -lt $((60 * 1000 * 1000)) ]]; then
  echo "bench_prep: preset bench needs >= 60 GB free on $work" >&2
  exit 1
fi

cold() {
  sync
  if [[ $(id -u) == 0 ]] && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
    return
  fi
  echo "   (warning: cannot drop the page cache; numbers below are warm)" >&2
}

# step NAME BYTES CMD...: runs CMD cold, prints bytes/s, and sets $rate (MB/s).
step() {
  local name=$1 bytes=$2
  shift 2
  cold
  local t0 t1
  t0=$(date +%s.%N)
  "$@"
  t1=$(date +%s.%N)
  local secs
  secs=$(echo "$t1 - $t0" | bc -l)
  rate=$(echo "$bytes / $secs / 1000000" | bc -l)
  printf '   %-34s %14d bytes %8.3f s %9.1f MB/s\n' "$name" "$bytes" "$secs" "$rate"
}

echo "== synth --preset $preset"
rm -rf "$model"
"$k3prep" synth --preset "$preset" --out "$model" --quiet
shard_bytes=$(cat "$model"/*.safetensors | wc -c)
echo "   $shard_bytes bytes in $(ls "$model"/*.safetensors | wc -l) shards"

echo "== pack (copy mode) vs cp of the same shards (then sync), cold"
rm -rf "$work/cp" && mkdir -p "$work/cp"
step "cp shards + sync" "$shard_bytes" bash -c "cp '$model'/*.safetensors '$work/cp/' && sync"
cp_rate=$rate
rm -rf "$work/cp"
rm -rf "$work/prep"
step "k3prep pack --experts copy" "$shard_bytes" \
  "$k3prep" pack "$model" --out "$work/prep" --experts copy --quiet
pack_rate=$rate
rm -rf "$work/prep-link"
step "k3prep pack --experts link" "$shard_bytes" \
  "$k3prep" pack "$model" --out "$work/prep-link" --experts link --quiet
link_rate=$rate
printf '   ratio pack(copy)/cp = %.3f   pack(link)/cp = %.3f\n' \
  "$(echo "$pack_rate / $cp_rate" | bc -l)" "$(echo "$link_rate / $cp_rate" | bc -l)"

echo "== verify --deep vs dd iflag=direct of the same prepared files, cold"
prep_files=$(find "$work/prep" -type f \( -name '*.bin' -o -name experts.idx \) | sort)
prep_bytes=$(cat $prep_files | wc -c)
step "dd iflag=direct bs=16M" "$prep_bytes" \
  bash -c "for f in $(echo $prep_files); do dd if=\$f of=/dev/null bs=16M iflag=direct status=none; done"
dd_rate=$rate
if [[ -x $k3verify ]] && "$k3verify" prepared --help 2>/dev/null | grep -q -- --deep; then
  step "k3verify prepared --deep" "$prep_bytes" "$k3verify" prepared "$work/prep" --deep --quiet
  printf '   ratio verify/dd = %.3f\n' "$(echo "$rate / $dd_rate" | bc -l)"
else
  echo "   k3verify prepared --deep not available in $build: not measured"
fi
