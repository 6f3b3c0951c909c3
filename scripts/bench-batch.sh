#!/usr/bin/env bash
# Batching benchmark (DESIGN.md §11.4, issue #20, docs/PERFORMANCE.md): k3run --batch with 1, 2,
# 4, 8 and 16 sequences of the same kind of prompt (pseudo-random ids of --prompt-len, a
# different prompt per sequence, exactly --gen tokens each), --max-seqs equal to the sequences,
# all in one run of this script. Per count: passes, rows per pass, generated tokens, aggregate
# generated tok/s, bytes read per generated token (prompt passes included), and how many times
# fewer bytes per generated token than the first count (1 sequence) reads; then the same for the
# passes of decode rows only (what batching saves once prompts are in), with decode tok/s and
# time ÷ the own-rate floor (the bytes needed at the rate the reader achieved while busy), decode
# tok/s against the first count's, and where a decode pass's time went (k3run's split: routed
# experts' compute, the rest of the trunk, attention, waits for weights) and its time over its
# roofline floor (the weight bytes it multiplies at the probed memory bandwidth, or its FLOPs at
# the probed matmul peak, whichever is larger; k3run's batch report decode.roofline_floor).
#
# usage: scripts/bench-batch.sh --prepared DIR [--build DIR] [--seqs 1,2,4,8,16]
#                               [--prompt-len N] [--gen N] [--threads N] [--work DIR]
#                               -- [k3run memory flags]
#   everything after -- goes to k3run (e.g. --trunk-gb 0.2 --cache-gb 0.2, or --preset max
#   --preload, or nothing: every weight in RAM).
set -euo pipefail

build=./build
prepared=""
seqs="1,2,4,8,16"
prompt_len=16
gen=16
threads=2
work=/tmp/k3-bench-batch
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --prepared) prepared=$2; shift 2 ;;
    --seqs) seqs=$2; shift 2 ;;
    --prompt-len) prompt_len=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "bench-batch: unknown argument $1" >&2; exit 2 ;;
  esac
done
extra=("$@")
k3run=$build/k3run/k3run
[[ -x $k3run ]] || { echo "bench-batch: $k3run not found: build first" >&2; exit 2; }
[[ -n $prepared ]] || { echo "bench-batch: --prepared DIR is required" >&2; exit 2; }
mkdir -p "$work"
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["config"]["vocab_size"])' \
        "$prepared/k3.json")

IFS=, read -ra seq_list <<< "$seqs"
for s in "${seq_list[@]}"; do
  # s lines, each its own pseudo-random prompt (the same generator as bench-prefill.sh, salted
  # by the line) and exactly --gen tokens (--ignore-eos).
  python3 -c 'import json, sys
s, n, v, gen = (int(a) for a in sys.argv[1:5])
for line in range(s):
    x, ids = 12345 + 7919 * line, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2**32
        ids.append((x >> 8) % v)
    print(json.dumps({"ids": ids, "gen": gen}))' "$s" "$prompt_len" "$vocab" "$gen" \
    > "$work/batch-$s.jsonl"
  echo "== $s sequences: k3run --batch --max-seqs $s --threads $threads ${extra[*]}" >&2
  "$k3run" "$prepared" --batch "$work/batch-$s.jsonl" --max-seqs "$s" --threads "$threads" \
    --ignore-eos --quiet --out "$work/batch-$s.json" "${extra[@]}" \
    > "$work/batch-$s.out"
done

python3 - "$work" "$seqs" <<'PY'
import json, sys
work, seqs = sys.argv[1], sys.argv[2].split(",")
print("| sequences | passes | rows/pass (mean, max) | generated tokens | aggregate tok/s | "
      "MB read per generated token | fewer than " + seqs[0] + " | decode passes | decode MB per "
      "token | decode: fewer than " + seqs[0] + " | decode tok/s | decode tok/s ÷ " + seqs[0] +
      "'s | decode time ÷ own-rate floor | decode pass ms: experts, trunk, attention, waits | "
      "decode pass ÷ roofline floor (ms, bound) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
tbase = None
base = dbase = None
for s in seqs:
    r = json.load(open(f"{work}/batch-{s}.json"))
    bpt = r["bytes_per_generated_token"]
    base = base or bpt
    d = r["decode"]
    dbpt = d["bytes_per_token"]
    dbase = dbase or dbpt
    fl = d["time_over_own_rate_floor"]
    tps = d["tokens_per_s"]
    tbase = tbase or tps
    split = d["split_seconds_per_pass"]
    parts = ", ".join(f"{split[k] * 1e3:.1f}" for k in ("experts", "trunk", "attention", "waits"))
    print(f"| {s} | {r['passes']} | {r['rows_per_pass']['mean']:.2f}, {r['rows_per_pass']['max']} | "
          f"{r['generated_tokens']} | {r['tokens_per_second']:.2f} | {bpt / 1e6:.3f} | "
          f"{base / bpt:.2f}x | {d['passes']} | {dbpt / 1e6:.3f} | {dbase / dbpt:.2f}x | "
          f"{tps if tps is None else round(tps, 2)} | "
          f"{'-' if not tps or not tbase else f'{tps / tbase:.2f}x'} | "
          f"{fl if fl is None else round(fl, 2)} | {parts} | "
          + (f"{rf['time_over_floor']:.2f} ({rf['floor_s'] * 1e3:.1f}, {rf['bound']})"
             if (rf := d.get("roofline_floor")) else "-") + " |")
PY
