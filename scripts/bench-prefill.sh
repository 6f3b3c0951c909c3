#!/usr/bin/env bash
# Prefill benchmark (DESIGN.md §11.3, docs/PERFORMANCE.md "Long contexts"): a prompt of N
# pseudo-random ids fed in chunks, then a few decode tokens, per prompt length. Per length: the
# chunk and passes, prefill seconds and seconds per prompt token, prompt tok/s against decode
# tok/s (same run), the MLA attention share of the prefill, and bytes read per prompt token by
# kind (trunk, experts, lm_head) against a decode token's.
#
# usage: scripts/bench-prefill.sh --prepared DIR [--build DIR] [--lengths 512,4096]
#                                 [--gen N] [--threads N] [--work DIR] -- [k3run memory flags]
#   everything after -- goes to k3run (e.g. --preset max --preload, or --trunk-gb 0.6
#   --cache-gb 0.5, or nothing: every weight in RAM); --chunk may be given there too.
set -euo pipefail

build=./build
prepared=""
lengths="512,4096"
gen=4
threads=2
work=/tmp/k3-bench-prefill
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --prepared) prepared=$2; shift 2 ;;
    --lengths) lengths=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "bench-prefill: unknown argument $1" >&2; exit 2 ;;
  esac
done
extra=("$@")
k3run=$build/k3run/k3run
[[ -x $k3run ]] || { echo "bench-prefill: $k3run not found: build first" >&2; exit 2; }
[[ -n $prepared ]] || { echo "bench-prefill: --prepared DIR is required" >&2; exit 2; }
mkdir -p "$work"
# Runs of exactly --gen tokens: end tokens must not stop the decode part early.
eos=()
if "$k3run" --help 2>/dev/null | grep -q -- --ignore-eos; then eos=(--ignore-eos); fi
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["config"]["vocab_size"])' \
        "$prepared/k3.json")

IFS=, read -ra length_list <<< "$lengths"
for n in "${length_list[@]}"; do
  ids=$(python3 -c 'import sys
n, v = int(sys.argv[1]), int(sys.argv[2])
x, out = 12345, []
for _ in range(n):
    x = (x * 1103515245 + 12345) % 2**32
    out.append(str((x >> 8) % v))
print(",".join(out))' "$n" "$vocab")
  echo "$ids" > "$work/ids-$n.txt"
  echo "== prompt $n ids: k3run --gen $gen --threads $threads ${extra[*]}" >&2
  "$k3run" "$prepared" --ids "$ids" --gen "$gen" --threads "$threads" "${eos[@]}" \
    --no-floor --quiet --out "$work/prefill-$n.json" "${extra[@]}"
done

python3 - "$work" "$lengths" "$prepared" <<'PY'
import json, math, sys
work, lengths, prepared = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
idx = json.load(open(f"{prepared}/k3.json"))
print("| prompt | chunk | passes | prefill s | ms/prompt token | prompt tok/s | decode tok/s | prompt ÷ decode tok/s | MLA share | trunk B per prompt token × chunk ÷ decode's | lm_head B of the prefill ÷ decode's | expert B per pass (MB) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for n in lengths:
    r = json.load(open(f"{work}/prefill-{n}.json"))
    steps = r["steps"]
    p, dec = steps[0], steps[1:]
    n_in = p["tokens_in"]
    chunk = r["memory_plan"]["chunk"]
    passes = math.ceil(n_in / chunk)
    dec_s = sum(s["seconds"] for s in dec) / max(len(dec), 1)
    dec_trunk = sum(s["bytes_read"]["trunk"] for s in dec) / max(len(dec), 1)
    dec_lm = sum(s["bytes_read"]["lm_head"] for s in dec) / max(len(dec), 1)
    ratio = lambda a, b: f"{a / b:.3f}" if b else "n/a (held)"
    print(f"| {n_in} | {chunk} | {passes} | {p['seconds']:.2f} | {1e3 * p['seconds'] / n_in:.2f} | "
          f"{n_in / p['seconds']:.1f} | {1 / dec_s:.2f} | {(n_in / p['seconds']) * dec_s:.2f} | "
          f"{p['mla_seconds'] / p['seconds']:.1%} | "
          f"{ratio(p['bytes_read']['trunk'] / n_in * chunk, dec_trunk)} | "
          f"{ratio(p['bytes_read']['lm_head'], dec_lm)} | "
          f"{p['bytes_read']['experts'] / passes / 1e6:.1f} |")
PY
