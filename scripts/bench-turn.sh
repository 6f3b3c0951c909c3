#!/usr/bin/env bash
# A chat turn on a persistent sequence (DESIGN.md §11.3, docs/PERFORMANCE.md "Long contexts"):
# a history of H tokens is fed once and saved (--save-state), then a turn of M new tokens is fed
# after it (--load-state) and a few tokens decoded, the way chat feeds only each new message.
# Per history length: the turn's tokens_in (must be M, never H + M), its prefill seconds, and
# decode s/token: growth with H is attention's per-position cost only.
#
# usage: scripts/bench-turn.sh --prepared DIR [--build DIR] [--histories 100,2000] [--turn M]
#                              [--gen N] [--threads N] [--work DIR] -- [k3run memory flags]
set -euo pipefail

build=./build
prepared=""
histories="100,2000"
turn=32
gen=4
threads=2
work=/tmp/k3-bench-turn
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --prepared) prepared=$2; shift 2 ;;
    --histories) histories=$2; shift 2 ;;
    --turn) turn=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "bench-turn: unknown argument $1" >&2; exit 2 ;;
  esac
done
extra=("$@")
k3run=$build/k3run/k3run
[[ -x $k3run ]] || { echo "bench-turn: $k3run not found: build first" >&2; exit 2; }
[[ -n $prepared ]] || { echo "bench-turn: --prepared DIR is required" >&2; exit 2; }
mkdir -p "$work"
eos=()
if "$k3run" --help 2>/dev/null | grep -q -- --ignore-eos; then eos=(--ignore-eos); fi
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["config"]["vocab_size"])' \
        "$prepared/k3.json")
ids() {  # N pseudo-random ids from seed S
  python3 -c 'import sys
n, v, x = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
out = []
for _ in range(n):
    x = (x * 1103515245 + 12345) % 2**32
    out.append(str((x >> 8) % v))
print(",".join(out))' "$1" "$vocab" "$2"
}
message=$(ids "$turn" 777)
IFS=, read -ra list <<< "$histories"
for h in "${list[@]}"; do
  echo "== history $h ids, then a turn of $turn" >&2
  "$k3run" "$prepared" --ids "$(ids "$h" 12345)" --gen 0 --threads "$threads" --no-floor --quiet \
    --save-state "$work/history-$h.k3state" "${extra[@]}"
  "$k3run" "$prepared" --load-state "$work/history-$h.k3state" --ids "$message" --gen "$gen" \
    --threads "$threads" "${eos[@]}" --no-floor --quiet --out "$work/turn-$h.json" "${extra[@]}"
done
python3 - "$work" "$histories" <<'PY'
import json, sys
work, hs = sys.argv[1], sys.argv[2].split(",")
print("| history | turn tokens_in | turn prefill s | ms per turn token | decode s/token | MLA share of the turn |")
print("|---|---|---|---|---|---|")
for h in hs:
    r = json.load(open(f"{work}/turn-{h}.json"))
    p, dec = r["steps"][0], r["steps"][1:]
    d = sum(s["seconds"] for s in dec) / max(len(dec), 1)
    print(f"| {h} | {p['tokens_in']} | {p['seconds']:.3f} | {1e3 * p['seconds'] / p['tokens_in']:.2f} | "
          f"{d:.4f} | {p['mla_seconds'] / p['seconds']:.1%} |")
PY
