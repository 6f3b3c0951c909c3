#!/usr/bin/env bash
# Speculative decoding (DESIGN.md §11.4, docs/PERFORMANCE.md "More tokens per pass"): per rung,
# in one run, decode of the same prompt
#   plain      --spec 0
#   adaptive   --spec N on random ids: the prompt lookup rarely finds a draft (its cost)
#   hits       --spec N drafting the known continuation (every draft kept: what a repeated
#              passage gives a real model; synthetic weights never repeat text, so the
#              continuation of the plain run stands in for the lookup, via --spec-oracle);
#              the draft length adapts to the acceptance and the plan's cost of a row
#   hits-fixed the same with --spec-fixed: N drafted every pass whatever a row costs
#   forced     --spec N --spec-fixed drafting wrong tokens (every draft refused: the cost of a
#              verifying pass that keeps nothing)
# and prints decode passes, tokens per pass, s/token and bytes read per token against plain.
# The generated ids must be identical in every mode (exit 1 otherwise).
#
# usage: scripts/bench-spec.sh --prepared DIR [--build DIR] [--rungs 0.2+0.2,1.5] [--spec N]
#                              [--gen N] [--prompt N] [--threads N] [--work DIR]
set -euo pipefail

build=./build
prepared=""
rungs="0.2+0.2,1.5"
spec=4
gen=33
prompt=16
threads=2
work=/tmp/k3-bench-spec
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --prepared) prepared=$2; shift 2 ;;
    --rungs) rungs=$2; shift 2 ;;
    --spec) spec=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "bench-spec: unknown argument $1" >&2; exit 2 ;;
  esac
done
k3run=$build/k3run/k3run
[[ -x $k3run ]] || { echo "bench-spec: $k3run not found: build first" >&2; exit 2; }
[[ -n $prepared ]] || { echo "bench-spec: --prepared DIR is required" >&2; exit 2; }
mkdir -p "$work"
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["config"]["vocab_size"])' \
        "$prepared/k3.json")
ids=$(python3 -c 'import sys
n, v, x = int(sys.argv[1]), int(sys.argv[2]), 4242
out = []
for _ in range(n):
    x = (x * 1103515245 + 12345) % 2**32
    out.append(str((x >> 8) % v))
print(",".join(out))' "$prompt" "$vocab")
generated() { python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["generated_ids"])))' "$1"; }
shifted() { python3 -c 'import sys; v=int(sys.argv[2]); print(",".join(str((int(i)+1)%v) for i in sys.argv[1].split(",")))' "$1" "$vocab"; }

IFS=, read -ra rung_list <<< "$rungs"
for rung in "${rung_list[@]}"; do
  case "$rung" in
    resident) flags=(--preset max --preload) ;;
    *+*) flags=(--trunk-gb "${rung%+*}" --cache-gb "${rung#*+}") ;;
    *) flags=(--budget-gb "$rung") ;;
  esac
  common=(--ids "$ids" --gen "$gen" --ignore-eos --threads "$threads" --no-floor --quiet "${flags[@]}")
  echo "== rung $rung: k3run ${flags[*]} --gen $gen --spec $spec" >&2
  "$k3run" "$prepared" "${common[@]}" --out "$work/$rung-plain.json" >/dev/null
  truth=$(generated "$work/$rung-plain.json")
  "$k3run" "$prepared" "${common[@]}" --spec "$spec" --out "$work/$rung-adaptive.json" >/dev/null
  "$k3run" "$prepared" "${common[@]}" --spec "$spec" --spec-oracle "$truth" \
    --out "$work/$rung-hits.json" >/dev/null
  "$k3run" "$prepared" "${common[@]}" --spec "$spec" --spec-fixed --spec-oracle "$truth" \
    --out "$work/$rung-hits-fixed.json" >/dev/null
  "$k3run" "$prepared" "${common[@]}" --spec "$spec" --spec-fixed \
    --spec-oracle "$(shifted "$truth")" --out "$work/$rung-forced.json" >/dev/null
done
python3 - "$work" "$rungs" <<'PY'
import json, sys
work, rungs = sys.argv[1], sys.argv[2].split(",")
bad = False
print("| rung | mode | decode passes | drafted / kept | tokens per pass | s/token | vs plain | read per token |")
print("|---|---|---|---|---|---|---|---|")
for rung in rungs:
    base = None
    for mode in ["plain", "adaptive", "hits", "hits-fixed", "forced"]:
        r = json.load(open(f"{work}/{rung}-{mode}.json"))
        dec = r["steps"][1:]
        n = len(dec)
        secs = sum(s["seconds"] for s in dec) / n
        read = sum(s["bytes_read"]["total"] for s in dec) / n / 1e6
        sp = r["speculation"]
        passes = sp["decode_passes"] if sp["decode_passes"] else n
        if base is None:
            base = (secs, r["generated_ids"])
        elif r["generated_ids"] != base[1]:
            print(f"ERROR: rung {rung} mode {mode}: generated ids differ from plain", file=sys.stderr)
            bad = True
        print(f"| {rung} | {mode} | {passes} | {sp['drafted']} / {sp['accepted']} | {n / passes:.2f} | "
              f"{secs:.4f} | {secs / base[0]:.2f}× | {read:.1f} MB |")
sys.exit(1 if bad else 0)
PY
