// Reference encoder for the k3 tokenizer parity test and benchmark: npm `tiktoken` (the WASM
// build of tiktoken's Rust core) driven the way Kimi's tokenization_kimi.py drives the Python
// binding: bytes decoded with replacement (WHATWG = Python errors="replace"), text cut into
// ≤ 400,000-character pieces and ≤ 25,000-character whitespace / non-whitespace runs, each
// piece encoded with all special tokens allowed (or none, for "ordinary" cases).
//
// Usage:
//   node encode.mjs encode MODEL SPECIALS_JSON PATTERN_FILE CASES_JSON OUT_JSON
//     CASES_JSON: [{"file": path, "allow_special": bool}, ...]; OUT_JSON: [[ids...], ...]
//   node encode.mjs bench MODEL SPECIALS_JSON PATTERN_FILE SECONDS FILE...
//     prints "bytes=N seconds=S mbps=X" for encoding all FILEs repeatedly for ≥ SECONDS.
import { readFileSync, writeFileSync } from "node:fs";
import { Tiktoken } from "tiktoken/lite";

const MAX_ENCODE_CHARS = 400_000;
const MAX_RUN_CHARS = 25_000;

// Python's str.isspace() (same table as k3run/tokenizer/text_split.cpp, taken from Python).
function isPySpace(cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp === 0x85 ||
    cp === 0xa0 || cp === 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp === 0x2028 ||
    cp === 0x2029 || cp === 0x202f || cp === 0x205f || cp === 0x3000;
}

// tokenization_kimi.py: for i in range(0, len(text), 400000): _split_whitespaces_or_nonwhitespaces
function* upstreamSplit(text) {
  const chars = Array.from(text);  // code points, like a Python str
  for (let p = 0; p < chars.length; p += MAX_ENCODE_CHARS) {
    const s = chars.slice(p, p + MAX_ENCODE_CHARS);
    let runLen = 0;
    let runIsSpace = s.length > 0 ? isPySpace(s[0].codePointAt(0)) : false;
    let sliceStart = 0;
    for (let i = 0; i < s.length; i++) {
      const now = isPySpace(s[i].codePointAt(0));
      if (runIsSpace !== now) {
        runLen = 1;
        runIsSpace = now;
      } else {
        runLen += 1;
        if (runLen > MAX_RUN_CHARS) {
          yield s.slice(sliceStart, i).join("");
          sliceStart = i;
          runLen = 1;
        }
      }
    }
    yield s.slice(sliceStart).join("");
  }
}

function load(model, specialsJson, patternFile) {
  const specials = JSON.parse(readFileSync(specialsJson, "utf8"));
  const pattern = readFileSync(patternFile, "utf8").replace(/\n$/, "").split("\n").join("|");
  return new Tiktoken(readFileSync(model, "utf8"), specials, pattern);
}

function encodeText(enc, text, allowSpecial) {
  const out = [];
  for (const sub of upstreamSplit(text)) {
    const ids = allowSpecial ? enc.encode(sub, "all") : enc.encode_ordinary(sub);
    for (const id of ids) out.push(id);
  }
  return out;
}

const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const [mode, model, specialsJson, patternFile, ...rest] = process.argv.slice(2);
const enc = load(model, specialsJson, patternFile);
if (mode === "encode") {
  const [casesJson, outJson] = rest;
  const cases = JSON.parse(readFileSync(casesJson, "utf8"));
  const results = cases.map((c) => encodeText(enc, decoder.decode(readFileSync(c.file)), c.allow_special));
  writeFileSync(outJson, JSON.stringify(results));
} else if (mode === "bench") {
  const [seconds, ...files] = rest;
  const texts = files.map((f) => decoder.decode(readFileSync(f)));
  const bytes = files.reduce((n, f) => n + readFileSync(f).length, 0);
  let total = 0;
  let rounds = 0;
  const t0 = process.hrtime.bigint();
  let elapsed = 0;
  do {
    for (const t of texts) encodeText(enc, t, true);
    total += bytes;
    rounds++;
    elapsed = Number(process.hrtime.bigint() - t0) / 1e9;
  } while (elapsed < Number(seconds));
  console.log(`bytes=${total} seconds=${elapsed.toFixed(3)} mbps=${(total / 1e6 / elapsed).toFixed(3)} rounds=${rounds}`);
} else {
  console.error("usage: node encode.mjs encode|bench ...");
  process.exit(2);
}
enc.free();
