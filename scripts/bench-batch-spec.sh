#!/usr/bin/env bash
# Speculation in shared passes (DESIGN.md §11.4, docs/PERFORMANCE.md "More tokens per pass"):
# per rung, in one run, `k3run --batch` of the same S sequences (--max-seqs S)
#   plain      --spec 0
#   adaptive   --spec N: the prompt lookup on random ids (it finds nearly nothing to draft)
#   hits       --spec N, each line drafting its plain run's continuation ("spec_oracle"), the
#              draft length adapting per sequence (synthetic weights never repeat text, so the
#              known continuation stands in for a repeated passage)
#   hits-fixed the same with --spec-fixed
#   forced     --spec N --spec-fixed drafting wrong tokens (every draft refused)
# and prints decode passes, rows and tokens per decode pass, decode s/token and bytes read per
# token against plain. Every line's ids must be identical in every mode (exit 1 otherwise).
#
# usage: scripts/bench-batch-spec.sh --prepared DIR [--build DIR] [--rungs resident,0.06+0.02]
#                                    [--seqs S] [--spec N] [--gen N] [--prompt N] [--work DIR]
set -euo pipefail

build=./build
prepared=""
rungs="resident"
seqs=4
spec=4
gen=33
prompt=16
work=/tmp/k3-bench-batch-spec
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --prepared) prepared=$2; shift 2 ;;
    --rungs) rungs=$2; shift 2 ;;
    --seqs) seqs=$2; shift 2 ;;
    --spec) spec=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "bench-batch-spec: unknown argument $1" >&2; exit 2 ;;
  esac
done
k3run=$build/k3run/k3run
[[ -x $k3run ]] || { echo "bench-batch-spec: $k3run not found: build first" >&2; exit 2; }
[[ -n $prepared ]] || { echo "bench-batch-spec: --prepared DIR is required" >&2; exit 2; }
mkdir -p "$work"
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["config"]["vocab_size"])' \
        "$prepared/k3.json")
# S lines of `prompt` pseudo-random ids each.
python3 -c 'import json, sys
s, n, v = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
x = 4242
for _ in range(s):
    ids = []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2**32
        ids.append((x >> 8) % v)
    print(json.dumps({"ids": ids}))' "$seqs" "$prompt" "$vocab" > "$work/plain.jsonl"
# The input again with each line's "spec_oracle": its plain ids, shifted by `shift` (1: all wrong).
oracles() { python3 -c 'import json, sys
v, shift = int(sys.argv[3]), int(sys.argv[4])
outs = [json.loads(l) for l in open(sys.argv[2])]
for line, out in zip(open(sys.argv[1]), outs):
    j = json.loads(line)
    j["spec_oracle"] = [(i + shift) % v for i in out["generated_ids"]]
    print(json.dumps(j))' "$work/plain.jsonl" "$1" "$vocab" "$2"; }

IFS=, read -ra rung_list <<< "$rungs"
for rung in "${rung_list[@]}"; do
  case "$rung" in
    resident) flags=() ;;
    *+*) flags=(--trunk-gb "${rung%+*}" --cache-gb "${rung#*+}") ;;
    *) flags=(--budget-gb "$rung") ;;
  esac
  common=(--gen "$gen" --ignore-eos --max-seqs "$seqs" --no-floor --quiet ${flags[@]+"${flags[@]}"})
  echo "== rung $rung: k3run --batch ($seqs lines) ${flags[*]-} --gen $gen --spec $spec" >&2
  run() {  # mode input flags...
    local mode=$1 input=$2; shift 2
    "$k3run" "$prepared" --batch "$input" "${common[@]}" "$@" --out "$work/$rung-$mode.json" \
      > "$work/$rung-$mode.out"
  }
  run plain "$work/plain.jsonl"
  oracles "$work/$rung-plain.out" 0 > "$work/$rung-hits.jsonl"
  oracles "$work/$rung-plain.out" 1 > "$work/$rung-wrong.jsonl"
  run adaptive "$work/plain.jsonl" --spec "$spec"
  run hits "$work/$rung-hits.jsonl" --spec "$spec"
  run hits-fixed "$work/$rung-hits.jsonl" --spec "$spec" --spec-fixed
  run forced "$work/$rung-wrong.jsonl" --spec "$spec" --spec-fixed
done
python3 - "$work" "$rungs" <<'PY'
import json, sys
work, rungs = sys.argv[1], sys.argv[2].split(",")
bad = False
print("| rung | mode | decode passes | drafted / kept | rows per pass | tokens per pass | s/token | vs plain | read per token |")
print("|---|---|---|---|---|---|---|---|---|")
for rung in rungs:
    base = None
    for mode in ["plain", "adaptive", "hits", "hits-fixed", "forced"]:
        r = json.load(open(f"{work}/{rung}-{mode}.json"))
        ids = [json.loads(l)["generated_ids"] for l in open(f"{work}/{rung}-{mode}.out")]
        d = r["decode"]
        secs = 1.0 / d["tokens_per_s"]
        sp = r.get("speculation", {"drafted": 0, "accepted": 0})
        if base is None:
            base = (secs, ids)
        elif ids != base[1]:
            print(f"ERROR: rung {rung} mode {mode}: generated ids differ from plain", file=sys.stderr)
            bad = True
        print(f"| {rung} | {mode} | {d['passes']} | {sp['drafted']} / {sp['accepted']} | "
              f"{d['rows_per_pass']:.2f} | {d['tokens_per_pass']:.2f} | {secs:.4f} | "
              f"{secs / base[0]:.2f}× | {d['bytes_per_token'] / 1e6:.3f} MB |")
sys.exit(1 if bad else 0)
PY
