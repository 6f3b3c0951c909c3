#!/usr/bin/env bash
# Constrained decoding benchmark (docs/TOOLS.md, docs/PERFORMANCE.md): the same prompt run twice
# in one run of this script, with --json-schema (a nested schema, scripts/bench-data/) and
# without, on one prepared directory and memory flags. Per token of the constrained run: the
# mask's computation (on its own thread, while the pass runs) and what the token choice waited
# for it plus applying it (the engine's thread), median / p99 / max from the k3run report; beside
# them the median decode step of both runs (one pass + choosing its token) and the ratios.
#
# usage: scripts/bench-constraint.sh --prepared DIR [--build DIR] [--gen N] [--seed S]
#                                    [--schema FILE] [--work DIR] -- [k3run memory flags]
set -euo pipefail

build=./build
prepared=""
gen=48
seed=1
schema="$(dirname "$0")/bench-data/nested-schema.json"
work=/tmp/k3-bench-constraint
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --prepared) prepared=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --schema) schema=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "bench-constraint: unknown argument $1" >&2; exit 2 ;;
  esac
done
extra=("$@")
k3run=$build/k3run/k3run
[[ -x $k3run ]] || { echo "bench-constraint: $k3run not found: build first" >&2; exit 2; }
[[ -n $prepared ]] || { echo "bench-constraint: --prepared DIR is required" >&2; exit 2; }
mkdir -p "$work"
common=(--prompt "Describe a city as JSON:" --gen "$gen" --temperature 1 --seed "$seed"
        --ignore-eos --no-floor --quiet)
echo "== constrained: --json-schema $schema ${extra[*]}" >&2
"$k3run" "$prepared" "${common[@]}" --json-schema "$schema" --out "$work/constrained.json" \
  "${extra[@]}" > "$work/constrained.out"
echo "== unconstrained ${extra[*]}" >&2
"$k3run" "$prepared" "${common[@]}" --out "$work/plain.json" "${extra[@]}" > "$work/plain.out"

python3 - "$work" <<'PY'
import json, statistics, sys
work = sys.argv[1]
c = json.load(open(f"{work}/constrained.json"))
p = json.load(open(f"{work}/plain.json"))
def step_ms(r):
    return statistics.median(s["seconds"] for s in r["steps"][1:]) * 1e3
m, w = c["constraint"]["mask_compute"], c["constraint"]["choice_wait"]
cs, ps = step_ms(c), step_ms(p)
print("| tokens | mask compute median / p99 / max (ms) | choice wait median / p99 / max (ms) "
      "| decode step, constrained (ms) | decode step, unconstrained (ms) | wait median ÷ step |")
print("|---|---|---|---|---|---|")
print(f"| {c['constraint']['tokens']} | {m['median_ms']:.3f} / {m['p99_ms']:.3f} / {m['max_ms']:.3f} "
      f"| {w['median_ms']:.3f} / {w['p99_ms']:.3f} / {w['max_ms']:.3f} | {cs:.1f} | {ps:.1f} "
      f"| {w['median_ms'] / cs:.4f} |")
print(f"constrained text: {c['generated_text'][:160]!r}")
PY
