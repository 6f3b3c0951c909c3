#!/usr/bin/env python3
"""Scale-out over Open MPI (docs/SCALE-OUT.md), through the real binaries and mpirun.

Every rank count N = 1..4 must give the bits of one process: the logits of every step
(--dump-logits-all) and the ids of prompt runs, a chat, a 3-prompt --batch, --spec 4 with oracle
drafts and two server requests. A rank killed or stopped mid-pass ends the run with rank 0
naming the rank and the layer, fast; mismatched models, shares and binaries are refused at start
(exit 2); a rank whose expert reads fail makes the run invalid (exit 4).

usage: scale_out_test.py BUILD_DIR [unittest args, e.g. Bits]
Exit 77 (CTest SKIP) when k3run was built without Open MPI or mpirun is missing.
"""
import json
import re
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ""
K3RUN = os.path.join(BUILD, "k3run", "k3run")
K3PREP = os.path.join(BUILD, "k3prep", "k3prep")
K3VERIFY = os.path.join(BUILD, "k3verify", "k3verify")
MPIRUN = shutil.which("mpirun")

ENV = dict(os.environ)
# The test machine runs as root; Open MPI refuses root unless told (docs/SCALE-OUT.md).
ENV.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism": "none"})
# More ranks than cores, no binding: rank threads share the two cores of the CI machine.
MPI_FLAGS = ["--oversubscribe", "--bind-to", "none"]

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"


def run(cmd, timeout=300, stdin=None):
    p = subprocess.run(cmd, env=ENV, input=stdin, capture_output=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


def mpi(n, prepared, args, timeout=300, stdin=None, binary=None):
    """mpirun of N ranks; `prepared` is one directory for all or a list, one per rank."""
    dirs = prepared if isinstance(prepared, list) else [prepared] * n
    bins = binary if isinstance(binary, list) else [binary or K3RUN] * n
    cmd = [MPIRUN] + MPI_FLAGS
    for r in range(n):
        if r > 0:
            cmd.append(":")
        cmd += ["-np", "1", bins[r], dirs[r], "--mpi"] + args
    return run(cmd, timeout=timeout, stdin=stdin)


def ok(test, result, what):
    rc, out, err = result
    test.assertEqual(rc, 0, f"{what}: exit {rc}\n{err[-4000:]}")
    return out, err


def read(path):
    with open(path, "rb") as f:
        return f.read()


def load_json(path):
    with open(path) as f:
        return json.load(f)


class Model:
    """A synthetic checkpoint packed to a prepared directory, and its shares."""

    def __init__(self, root, preset, seed):
        self.root = os.path.join(root, f"{preset}-{seed}")
        ck = os.path.join(self.root, "ck")
        self.prep = os.path.join(self.root, "prep")
        for cmd in ([K3PREP, "synth", "--preset", preset, "--seed", str(seed), "--out", ck, "--quiet"],
                    [K3PREP, "pack", ck, "--out", self.prep, "--experts", "copy", "--quiet"]):
            rc, _, err = run(cmd)
            if rc != 0:
                raise RuntimeError(f"{cmd}: {err}")
        self.shares = {}

    def share(self, n, r):
        key = (n, r)
        if key not in self.shares:
            out = os.path.join(self.root, f"share-{n}-{r}")
            rc, _, err = run([K3PREP, "split", self.prep, "--ranks", str(n), "--rank", str(r),
                              "--out", out, "--quiet"])
            if rc != 0:
                raise RuntimeError(f"split {n} {r}: {err}")
            self.shares[key] = out
        return self.shares[key]


TMP = None
MODELS = {}


def model(preset, seed=5):
    key = (preset, seed)
    if key not in MODELS:
        MODELS[key] = Model(TMP, preset, seed)
    return MODELS[key]


class Bits(unittest.TestCase):
    """Logits and ids of N = 1..4 ranks equal one process's."""

    def prompt_run(self, prep, n, tag, extra=()):
        logits = os.path.join(TMP, f"logits-{tag}.bin")
        report = os.path.join(TMP, f"report-{tag}.json")
        args = ["--prompt", PROMPT, "--gen", "12", "--ignore-eos", "--dump-logits", logits,
                "--dump-logits-all", "--out", report] + list(extra)
        if n == 0:
            ok(self, run([K3RUN, prep] + args), f"one process {tag}")
        else:
            ok(self, mpi(n, prep, args), f"{n} ranks {tag}")
        return read(logits), load_json(report)

    def test_prompt_bits_at_every_rank_count(self):
        for preset in ("tiny", "small"):
            prep = model(preset).prep
            base_logits, base = self.prompt_run(prep, 0, f"{preset}-1p")
            self.assertGreater(len(base_logits), 0)
            self.assertIsNone(base["scale_out"])
            for n in (1, 2, 3, 4):
                logits, rep = self.prompt_run(prep, n, f"{preset}-{n}")
                self.assertEqual(rep["generated_ids"], base["generated_ids"], f"{preset} N={n}")
                self.assertTrue(logits == base_logits, f"{preset} N={n}: logits bits differ")
                self.assertEqual(rep["scale_out"]["ranks"], n)
                self.assertTrue(rep["valid"])
                if n > 1:
                    sent = sum(p["bytes_sent"] for p in rep["scale_out"]["per_rank"])
                    self.assertGreater(sent, 0, "rows must have gone to the other ranks")

    def test_shares_give_the_same_bits(self):
        m = model("small")
        base_logits, base = self.prompt_run(m.prep, 0, "small-share-1p")
        for n in (2, 3):
            logits, rep = self.prompt_run([m.share(n, r) for r in range(n)], n, f"small-share-{n}")
            self.assertEqual(rep["generated_ids"], base["generated_ids"])
            self.assertTrue(logits == base_logits, f"shares N={n}: logits bits differ")

    def test_streaming_budget_on_every_rank(self):
        prep = model("small").prep
        budget = ["--budget-gb", "0.2"]
        base_logits, base = self.prompt_run(prep, 0, "small-budget-1p", budget)
        logits, rep = self.prompt_run(prep, 3, "small-budget-3", budget)
        self.assertEqual(rep["generated_ids"], base["generated_ids"])
        self.assertTrue(logits == base_logits)
        # Ranks >= 1 hold no trunk: their whole budget is expert cache, and they read only experts.
        _, err = ok(self, mpi(2, prep, ["--prompt", PROMPT, "--gen", "4", "--preset", "max",
                                        "--preload"]), "experts-only plan")
        self.assertIn("k3run rank 1 of 2", err)
        self.assertIn("streaming plan: experts only (this rank reads no trunk)", err)
        share = re.search(r"k3run rank 1 of 2 \(.*?\): routed experts .*?\(([0-9.]+ [KMG]iB) in", err)
        read = re.search(r"k3run rank 1 of 2: .* read ([0-9.]+ [KMG]iB)", err)
        self.assertIsNotNone(share, err)
        self.assertIsNotNone(read, err)
        self.assertEqual(read.group(1), share.group(1), "rank 1 must read its experts and nothing else")

    def test_spec_with_oracle_drafts(self):
        prep = model("small").prep
        _, plain = self.prompt_run(prep, 0, "small-plain")
        oracle = ",".join(str(i) for i in plain["generated_ids"])
        spec = ["--spec", "4", "--spec-oracle", oracle]
        base_logits, base = self.prompt_run(prep, 0, "small-spec-1p", spec)
        self.assertEqual(base["generated_ids"], plain["generated_ids"])
        for n in (2, 4):
            logits, rep = self.prompt_run(prep, n, f"small-spec-{n}", spec)
            self.assertEqual(rep["generated_ids"], plain["generated_ids"])
            self.assertTrue(logits == base_logits, f"--spec N={n}: logits bits differ")

    def test_batch_of_three_prompts(self):
        prep = model("small").prep
        batch = os.path.join(TMP, "batch.jsonl")
        with open(batch, "w") as f:
            f.write(json.dumps({"prompt": "Once upon a time"}) + "\n")
            f.write(json.dumps({"prompt": "The lazy dog", "gen": 5}) + "\n")
            f.write(json.dumps({"prompt": PROMPT, "gen": 9}) + "\n")

        def go(n):
            logits = os.path.join(TMP, f"batch-{n}.bin")
            args = ["--batch", batch, "--gen", "7", "--ignore-eos", "--dump-logits", logits,
                    "--dump-logits-all"]
            out, _ = ok(self, run([K3RUN, prep] + args) if n == 0 else mpi(n, prep, args),
                        f"--batch N={n}")
            return out, [read(f"{logits}.{i}") for i in range(3)]

        base_out, base_logits = go(0)
        self.assertEqual(len(base_out.splitlines()), 3)
        for n in (2, 3):
            out, logits = go(n)
            self.assertEqual(out, base_out, f"--batch N={n}: output lines differ")
            self.assertTrue(logits == base_logits, f"--batch N={n}: logits bits differ")

    def test_chat_two_turns(self):
        # The transcript (--history), not stdout: mpirun gives rank 0 a terminal, which changes
        # how the chat is displayed but not what it says.
        prep = model("tiny").prep
        turns = b"hello there\nand again\n"

        def go(n):
            history = os.path.join(TMP, f"chat-{n}.txt")
            args = ["--chat", "--gen", "8", "--seed", "7", "--quiet", "--history", history]
            ok(self, run([K3RUN, prep] + args, stdin=turns) if n == 0 else
               mpi(n, prep, args, stdin=turns), f"chat N={n}")
            return read(history)

        base = go(0)
        self.assertIn(b"and again", base)
        self.assertEqual(go(2), base)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


class Serve(unittest.TestCase):
    def serve(self, cmd, port):
        p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if json.load(r).get("status") == "ok":
                        return p
            except Exception:
                pass
            if p.poll() is not None:
                self.fail(f"server exited {p.returncode}: {p.stderr.read().decode()[-3000:]}")
            time.sleep(0.2)
        p.kill()
        self.fail("server did not become healthy")

    def two_requests(self, port):
        a = post(port, "/v1/completions", {"model": "prep", "prompt": PROMPT, "max_tokens": 8,
                                           "temperature": 0})
        b = post(port, "/v1/chat/completions",
                 {"model": "prep", "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 6, "temperature": 0})
        return a["choices"][0]["text"], b["choices"][0]["message"]["content"]

    def stop(self, p):
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def test_two_requests_equal_one_process(self):
        prep = model("tiny").prep
        port = free_port()
        p = self.serve([K3RUN, prep, "--serve", "--port", str(port)], port)
        try:
            base = self.two_requests(port)
        finally:
            self.stop(p)
        port = free_port()
        cmd = [MPIRUN] + MPI_FLAGS + ["-np", "3", K3RUN, prep, "--mpi", "--serve", "--port", str(port)]
        p = self.serve(cmd, port)
        try:
            self.assertEqual(self.two_requests(port), base)
        finally:
            self.stop(p)


class Refusals(unittest.TestCase):
    """Refused at start, on every rank, exit 2, naming both sides."""

    def test_another_models_directory(self):
        rc, _, err = mpi(2, [model("tiny").prep, model("tiny", seed=6).prep], ["--prompt", "hi"])
        self.assertEqual(rc, 2, err)
        self.assertIn("holds another model", err)
        self.assertIn(model("tiny", seed=6).prep, err)

    def test_another_ranks_share(self):
        m = model("tiny")
        rc, _, err = mpi(2, [m.share(2, 0), m.share(2, 0)], ["--prompt", "hi"])
        self.assertEqual(rc, 2, err)
        self.assertIn("holds the share of rank 0 of 2", err)
        self.assertIn("runs as rank 1 of 2", err)

    def test_a_share_for_another_rank_count(self):
        m = model("tiny")
        rc, _, err = mpi(2, [m.share(3, 0), m.share(3, 1)], ["--prompt", "hi"])
        self.assertEqual(rc, 2, err)
        self.assertIn("of 3", err)

    def test_a_share_without_mpi(self):
        rc, _, err = run([K3RUN, model("tiny").share(2, 1), "--prompt", "hi"])
        self.assertEqual(rc, 2, err)
        self.assertIn("holds only rank 1 of 2", err)
        self.assertIn("mpirun -np 2", err)

    def test_another_binary(self):
        other = os.path.join(TMP, "k3run-other")
        shutil.copy(K3RUN, other)
        with open(other, "ab") as f:
            f.write(b"another build")
        rc, _, err = mpi(2, model("tiny").prep, ["--prompt", "hi"], binary=[K3RUN, other])
        self.assertEqual(rc, 2, err)
        self.assertIn("runs another k3run binary", err)

    def test_more_ranks_than_experts(self):
        rc, _, err = mpi(9, model("tiny").prep, ["--prompt", "hi"], timeout=120)
        self.assertEqual(rc, 2, err)
        self.assertIn("mpirun -np", err)


class Faults(unittest.TestCase):
    def long_run(self, n, prep, extra=()):
        cmd = [MPIRUN] + MPI_FLAGS + ["-np", str(n), K3RUN, prep, "--mpi", "--prompt", PROMPT,
                                      "--gen", "100000", "--ignore-eos", "--ctx", "100100"] + list(extra)
        p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        lines = []
        pids = {}

        def drain():
            for raw in p.stderr:
                line = raw.decode(errors="replace")
                lines.append(line)
                if "k3run rank " in line and "pid " in line:
                    rank = int(line.split("k3run rank ")[1].split()[0])
                    pids[rank] = int(line.split("pid ")[1].split(")")[0])
        got = [0]

        def drain_stdout():  # never let mpirun block on a full pipe
            while True:
                chunk = p.stdout.read1(4096)
                if not chunk:
                    return
                got[0] += len(chunk)
        t = threading.Thread(target=drain, daemon=True)
        t.start()
        threading.Thread(target=drain_stdout, daemon=True).start()
        deadline = time.time() + 60
        while got[0] < 40 and time.time() < deadline and p.poll() is None:
            time.sleep(0.05)  # tokens are streaming: passes are running
        self.assertGreaterEqual(got[0], 40, "".join(lines)[-3000:])
        return p, pids, lines, t

    def finish(self, p, t, limit):
        start = time.time()
        try:
            p.wait(timeout=limit + 20)
        except subprocess.TimeoutExpired:
            p.kill()
            self.fail(f"mpirun still running {limit + 20} s after the fault")
        t.join(timeout=5)
        return time.time() - start

    def test_a_killed_rank_is_reported_by_rank_0(self):
        p, pids, lines, t = self.long_run(2, model("small").prep)
        self.assertIn(1, pids, "".join(lines))
        os.kill(pids[1], signal.SIGKILL)
        took = self.finish(p, t, 10)
        err = "".join(lines)
        self.assertLess(took, 10, err)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("k3run rank 0 of 2: mpirun ended the run", err)
        self.assertIn("layer", err)
        self.assertIn("rank 1", err)

    def test_a_stopped_rank_times_out(self):
        p, pids, lines, t = self.long_run(2, model("small").prep, ["--mpi-timeout", "2"])
        os.kill(pids[1], signal.SIGSTOP)
        took = self.finish(p, t, 10)
        err = "".join(lines)
        self.assertLess(took, 10, err)
        self.assertEqual(p.returncode, 4, err)
        # Stopped while it computed (rank 0 waits for its answer) or before it took the rows.
        self.assertRegex(err, r"of layer \d+: rank 1 did not (answer|take its message) within 2 s")

    def test_failed_expert_reads_make_the_run_invalid(self):
        m = model("tiny")
        bad = os.path.join(TMP, "bad-share")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(m.share(2, 1), bad)
        for root, _, files in os.walk(os.path.join(bad, "experts")):
            for name in files:  # every expert of rank 1 fails its hash
                path = os.path.join(root, name)
                size = os.path.getsize(path)
                with open(path, "r+b") as f:
                    f.write(b"\xa5" * size)
        rc, _, err = mpi(2, [m.share(2, 0), bad], ["--prompt", PROMPT, "--gen", "4",
                                                    "--verify-reads"])
        self.assertEqual(rc, 4, err)
        self.assertIn("rank 1", err)
        self.assertIn("RUN INVALID", err)


def main():
    global TMP
    if not os.path.exists(K3RUN):
        print(f"usage: {sys.argv[0]} BUILD_DIR (no {K3RUN})", file=sys.stderr)
        return 2
    rc, out, _ = run([K3RUN, "--help"])
    if MPIRUN is None or b"--mpi-timeout" not in out:
        print("SKIPPED: mpirun or an Open MPI build of k3run is missing (scripts/setup.sh "
              "installs openmpi-bin and libopenmpi-dev)")
        return 77
    probe_rc, _, probe_err = run([K3RUN, "/nonexistent", "--mpi", "--prompt", "x"])
    if "built without Open MPI" in probe_err:
        print("SKIPPED: k3run was built without Open MPI")
        return 77
    TMP = tempfile.mkdtemp(prefix="k3-mpi-test-")
    try:
        prog = unittest.main(argv=[sys.argv[0]] + sys.argv[2:], exit=False, verbosity=2)
        return 0 if prog.result.wasSuccessful() else 1
    finally:
        shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
