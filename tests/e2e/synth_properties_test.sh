#!/usr/bin/env bash
# DESIGN.md §8's requirements on the tiny preset's weights, measured on `k3prep synth --preset
# tiny --seed 1` by the independent PyTorch reference (tests/reference/k3_ref.py --stats):
# greedy decoding does not collapse to one repeated token within 32 steps, SiTU's caps are
# reached, the routing bias changes some selections (and not all), no expert is unreachable, and
# every logit is finite. Usage: synth_properties_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
src="$2"
py=/usr/bin/python3
if ! "$py" -c 'import torch, numpy' 2>/dev/null; then
  echo "synth properties: needs python3-torch and python3-numpy (scripts/setup.sh installs them)" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$build/k3prep/k3prep" synth --preset tiny --seed 1 --out "$work/ck" --quiet
"$py" "$src/tests/reference/k3_ref.py" "$work/ck" --prompt 900,14,777,256,42 --prompt 7 \
  --stats --stats-steps 32 > "$work/stats.json" 2> "$work/stats.log" || { cat "$work/stats.log"; exit 1; }
"$py" - "$work/stats.json" <<'PY'
import json, math, sys
text = open(sys.argv[1]).read()
# One JSON document per prompt, concatenated.
dec, docs, i = json.JSONDecoder(), [], 0
while i < len(text):
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        break
    d, i = dec.raw_decode(text, i)
    docs.append(d)
assert docs, "no --stats output"
fails = []
for d in docs:
    name = "prompt %s" % d["prompt_ids"]
    ids = d["greedy_ids"]
    if len(ids) < 32:
        fails.append("%s: only %d greedy steps" % (name, len(ids)))
    if d["collapsed_to_one_token"] or d["distinct_tokens"] < 8:
        fails.append("%s: greedy collapsed (%d distinct of %d)" % (name, d["distinct_tokens"], len(ids)))
    for kind, s in d["situ"].items():
        if not s["gate_cap_reached"]:
            fails.append("%s: SiTU gate cap not reached in %s" % (name, kind))
        if not all(math.isfinite(s[k]) for k in ("max_abs_gate", "max_abs_up", "max_abs_out")):
            fails.append("%s: non-finite activations in %s" % (name, kind))
    r = d["routing"]
    if not 0 < r["bias_changed_selection"] < r["routings"]:
        fails.append("%s: bias changed %d of %d selections" % (name, r["bias_changed_selection"], r["routings"]))
    starved = {l: e for l, e in r["never_selected_experts"].items() if e}
    if starved and len(ids) >= 32:
        fails.append("%s: experts never selected: %s" % (name, starved))
    print("%s: %d distinct of %d greedy tokens, bias changed %d of %d routings, min greedy gap %.3g"
          % (name, d["distinct_tokens"], len(ids), r["bias_changed_selection"], r["routings"],
             d["min_greedy_gap"]))
if fails:
    print("\n".join(fails))
    sys.exit(1)
PY
