#!/usr/bin/python3
"""A local Hugging Face Hub simulator for k3prep download tests (Python standard library only).

Two HTTP/1.1 servers on 127.0.0.1 (never another interface), each on a free port:
  hub  GET  /api/models/{repo}/revision/{rev}        -> {"id", "sha", "siblings"}
       GET  /api/models/{repo}/tree/{commit}?recursive=true[&cursor=N]
            paged (--page-size entries) with a GitHub-style Link: <...>; rel="next" header
       HEAD/GET /{repo}/resolve/{commit}/{path}
            LFS files (*.safetensors, tiktoken.model): 302 to the CDN with a signed query string,
            X-Repo-Commit, X-Linked-Size, X-Linked-Etag ("<sha256>"); git files: 200 + body.
  cdn  GET  /blobs/{sha256}?exp=T&sig=HMAC  (Range: bytes=N- and N-M)
            REJECTS any request carrying an Authorization header (400) and logs every request's
            headers as one JSON line to --cdn-log.

Auth: with --token T, the API and resolve endpoints answer 401 without "Authorization: Bearer T".

Faults (--faults JSON list), each {"mode", "path" (default: every file), "times" (default 1;
-1 = always), ...}. "times" counts the requests the fault fires on.
  drop          CDN: send "bytes" bytes of the body, then close the connection
  ignore_range  CDN: answer a Range request with 200 and the whole body
  status500     CDN (or "where":"hub" on resolve): 500
  status429     CDN (or hub): 429 with Retry-After: "retry_after" (default 1)
  ratelimit429  CDN: 429 with RateLimit: "resolvers";r=0;t="retry_after"
  expire403     CDN: 403 ("signed URL expired")
  stall         CDN: send "bytes" bytes, then sleep "seconds" and close
  wrong_size    hub: X-Linked-Size is the real size + 1
  corrupt       CDN: byte "offset" (default 0) of the body is flipped; the published sha256 is
                the real one
  trickle       CDN: send in "chunk" byte pieces (default 4096) with "interval" s between them;
                with "hold_at" N, send nothing at or past byte N of the file: once there, hold
                the connection open for "hold_seconds" (default 600), then close it
  unsafe_path   hub ("where":"hub"): the tree listing also names "../evil.safetensors"
Hostile hub modes (hub by default, no "where" needed):
  redirect      resolve: 302 to "location" (any scheme: file://, gopher://, ftp://...) with the
                file's real X-Linked-Size and X-Linked-Etag, so only the target is wrong
  extra_entry   the tree listing also names "entry" (a JSON object, sent as is: any path, any
                size such as 2^64-1), on the first page
  link_loop     the last listing page links (Link rel="next") to the empty page just past the
                end, and that page links to itself; "times" counts the listing requests that
                carry the loop (after that the paging ends normally)

Start-up: the ports are written to --port-file as "HUB_PORT CDN_PORT\n" (atomically: temporary
name, then rename) once both servers listen. Stop with SIGTERM.
"""

import argparse
import hashlib
import hmac
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = b"hubsim-cdn-secret"
HUB_MODES = ("wrong_size", "redirect", "extra_entry", "link_loop")
LFS_SUFFIXES = (".safetensors", ".model", ".bin")


class Repo:
    def __init__(self, root, name, commit):
        self.name = name
        self.commit = commit
        self.files = {}  # path -> dict(size, sha256, git_oid, lfs, data_path)
        for dirpath, _, names in os.walk(root):
            for n in sorted(names):
                full = os.path.join(dirpath, n)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                with open(full, "rb") as f:
                    data = f.read()
                git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                self.files[rel] = {
                    "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "git_oid": git,
                    "lfs": rel.endswith(LFS_SUFFIXES),
                    "data_path": full,
                }
        self.by_sha = {f["sha256"]: p for p, f in self.files.items()}

    def tree_entries(self):
        out, dirs = [], set()
        for p in sorted(self.files):
            parts = p.split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    out.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": d})
            f = self.files[p]
            e = {"type": "file", "oid": f["git_oid"], "size": f["size"], "path": p}
            if f["lfs"]:
                e["lfs"] = {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}
            out.append(e)
        return out


class Faults:
    def __init__(self, specs):
        self.specs = specs
        self.lock = threading.Lock()

    def take(self, mode, path, where=None):
        """Returns the fault spec when `mode` fires for this request (and consumes one use)."""
        default = "hub" if mode in HUB_MODES else "cdn"
        where = where or default
        with self.lock:
            for s in self.specs:
                if s["mode"] != mode or s.get("where", default) != where:
                    continue
                if "path" in s and s["path"] != path:
                    continue
                left = s.get("times", 1)
                if left == 0:
                    continue
                if left > 0:
                    s["times"] = left - 1
                return s
        return None


def sign(sha, exp):
    return hmac.new(SECRET, ("%s:%d" % (sha, exp)).encode(), hashlib.sha256).hexdigest()


class State:
    repo = None
    faults = None
    token = None
    page_size = 1000
    hub_port = 0
    cdn_port = 0
    cdn_log = None
    log_lock = threading.Lock()


class Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # http.server writes the headers and the body with separate send()s. With Nagle on, the
    # second small send waits for the ACK of the first, which a client in delayed-ACK mode holds
    # for 40 ms: every small answer on a reused connection (the tree listing) would stall 40 ms,
    # which no real Hub does and which would be charged to the client in benchmarks.
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def send_simple(self, code, body=b"", headers=None, head=False):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)


class HubHandler(Quiet):
    def authorized(self):
        if State.token is None:
            return True
        return self.headers.get("Authorization") == "Bearer " + State.token

    def do_HEAD(self):
        self.handle_any(head=True)

    def do_GET(self):
        self.handle_any(head=False)

    def handle_any(self, head):
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        query = urllib.parse.parse_qs(url.query)
        repo = State.repo
        if not self.authorized():
            return self.send_simple(401, b'{"error":"Invalid credentials"}', head=head)
        api = "/api/models/" + repo.name + "/"
        if path.startswith(api + "revision/"):
            rev = path[len(api + "revision/"):]
            if rev not in ("main", repo.commit):
                return self.send_simple(404, b'{"error":"Revision not found"}', head=head)
            body = json.dumps({"id": repo.name, "sha": repo.commit,
                               "siblings": [{"rfilename": p} for p in sorted(repo.files)]})
            return self.send_simple(200, body.encode(), {"Content-Type": "application/json"}, head)
        if path.startswith(api + "tree/"):
            rev = path[len(api + "tree/"):]
            if rev != repo.commit:
                return self.send_simple(404, b'{"error":"Revision not found"}', head=head)
            entries = repo.tree_entries()
            if State.faults.take("unsafe_path", None, "hub"):
                entries.append({"type": "file", "oid": "1" * 40, "size": 1,
                                "path": "../evil.safetensors"})
            start = int(query.get("cursor", ["0"])[0])
            extra = State.faults.take("extra_entry", None) if start == 0 else None
            if extra:
                entries.insert(0, extra["entry"])
            page = entries[start:start + State.page_size]
            headers = {"Content-Type": "application/json"}
            link_to = None
            if start + State.page_size < len(entries):
                link_to = start + State.page_size
            elif State.faults.take("link_loop", None):
                link_to = max(start, len(entries))  # past the end: [], and then itself
            if link_to is not None:
                nxt = "http://127.0.0.1:%d%s?recursive=true&cursor=%d" % (
                    State.hub_port, urllib.parse.quote(path), link_to)
                headers["Link"] = '<%s>; rel="next"' % nxt
            return self.send_simple(200, json.dumps(page).encode(), headers, head)
        prefix = "/" + repo.name + "/resolve/"
        if path.startswith(prefix):
            rest = path[len(prefix):]
            rev, _, fpath = rest.partition("/")
            f = repo.files.get(fpath)
            if rev != repo.commit or f is None:
                return self.send_simple(404, b"Entry not found", head=head)
            fault = State.faults.take("status500", fpath, "hub")
            if fault:
                return self.send_simple(500, b"internal error", head=head)
            fault = State.faults.take("status429", fpath, "hub")
            if fault:
                return self.send_simple(429, b"slow down", {"Retry-After": str(fault.get("retry_after", 1))}, head)
            size = f["size"]
            fault = State.faults.take("redirect", fpath)
            if fault:
                return self.send_simple(302, b"", {
                    "X-Repo-Commit": repo.commit, "Location": fault["location"],
                    "X-Linked-Size": str(size), "X-Linked-Etag": '"%s"' % f["sha256"]}, head)
            if State.faults.take("wrong_size", fpath, "hub"):
                size += 1
            headers = {"X-Repo-Commit": repo.commit}
            if f["lfs"]:
                exp = int(time.time()) + 3600
                loc = "http://127.0.0.1:%d/blobs/%s?exp=%d&sig=%s" % (
                    State.cdn_port, f["sha256"], exp, sign(f["sha256"], exp))
                headers.update({"Location": loc, "X-Linked-Size": str(size),
                                "X-Linked-Etag": '"%s"' % f["sha256"], "ETag": '"%s"' % f["git_oid"]})
                return self.send_simple(302, b"", headers, head)
            with open(f["data_path"], "rb") as fh:
                data = fh.read()
            headers["ETag"] = '"%s"' % f["git_oid"]
            return self.send_simple(200, data, headers, head)
        return self.send_simple(404, b"not found", head=head)


class CdnHandler(Quiet):
    def log_headers(self):
        rec = {"method": self.command, "path": urllib.parse.urlsplit(self.path).path,
               "headers": {k: v for k, v in self.headers.items()}}
        with State.log_lock:
            with open(State.cdn_log, "a") as f:
                f.write(json.dumps(rec) + "\n")

    def do_HEAD(self):
        self.log_headers()
        self.send_simple(405, b"", head=True)

    def do_GET(self):
        self.log_headers()
        if "Authorization" in self.headers:
            return self.send_simple(400, b"Only one auth mechanism allowed; the signed URL is one")
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        sha = url.path[len("/blobs/"):] if url.path.startswith("/blobs/") else ""
        fpath = State.repo.by_sha.get(sha)
        try:
            exp = int(query["exp"][0])
            good = hmac.compare_digest(query["sig"][0], sign(sha, exp)) and exp > time.time()
        except (KeyError, ValueError, IndexError):
            good = False
        if fpath is None or not good:
            return self.send_simple(403, b"<Error>AccessDenied: bad or missing signature</Error>")
        if State.faults.take("expire403", fpath):
            return self.send_simple(403, b"<Error>Request has expired</Error>")
        if State.faults.take("status500", fpath):
            return self.send_simple(500, b"internal error")
        fault = State.faults.take("status429", fpath)
        if fault:
            return self.send_simple(429, b"slow down", {"Retry-After": str(fault.get("retry_after", 1))})
        fault = State.faults.take("ratelimit429", fpath)
        if fault:
            return self.send_simple(429, b"slow down", {
                "RateLimit": '"resolvers";r=0;t=%d' % fault.get("retry_after", 1)})
        f = State.repo.files[fpath]
        with open(f["data_path"], "rb") as fh:
            data = bytearray(fh.read())
        corrupt = State.faults.take("corrupt", fpath)
        if corrupt:
            data[corrupt.get("offset", 0)] ^= 0xFF
        size = len(data)
        rng = self.headers.get("Range")
        start, end, code = 0, size - 1, 200
        if rng and not State.faults.take("ignore_range", fpath):
            spec = rng.strip()
            if not spec.startswith("bytes="):
                return self.send_simple(400, b"bad range")
            a, _, b = spec[len("bytes="):].partition("-")
            start = int(a)
            end = int(b) if b else size - 1
            if start >= size:
                return self.send_simple(416, b"", {"Content-Range": "bytes */%d" % size})
            end = min(end, size - 1)
            code = 206
        body = bytes(data[start:end + 1])
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if code == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        self.end_headers()
        drop = State.faults.take("drop", fpath)
        stall = State.faults.take("stall", fpath)
        trickle = State.faults.take("trickle", fpath)
        try:
            if drop or stall:
                k = (drop or stall).get("bytes", 1024)
                self.wfile.write(body[:k])
                self.wfile.flush()
                if stall:
                    time.sleep(stall.get("seconds", 5))
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if trickle:
                chunk = trickle.get("chunk", 4096)
                stop = len(body)
                if "hold_at" in trickle:
                    stop = max(0, min(stop, trickle["hold_at"] - start))
                for i in range(0, stop, chunk):
                    self.wfile.write(body[i:min(i + chunk, stop)])
                    self.wfile.flush()
                    time.sleep(trickle.get("interval", 0.05))
                if stop < len(body):
                    time.sleep(trickle.get("hold_seconds", 600))
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # clients hanging up mid-request is what the fault tests do


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--token")
    ap.add_argument("--faults", default="[]")
    ap.add_argument("--page-size", type=int, default=1000)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--cdn-log", required=True)
    ap.add_argument("--parent-pid", type=int, default=0, help="exit when this parent is gone")
    args = ap.parse_args()
    State.repo = Repo(args.root, args.repo, args.commit)
    State.faults = Faults(json.loads(args.faults))
    State.token = args.token
    State.page_size = args.page_size
    State.cdn_log = args.cdn_log
    open(args.cdn_log, "a").close()
    hub = Server(("127.0.0.1", 0), HubHandler)
    cdn = Server(("127.0.0.1", 0), CdnHandler)
    State.hub_port = hub.server_address[1]
    State.cdn_port = cdn.server_address[1]
    for s in (hub, cdn):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d %d\n" % (State.hub_port, State.cdn_port))
    os.rename(tmp, args.port_file)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    while not stop.wait(0.2):
        if args.parent_pid and os.getppid() != args.parent_pid:
            break  # the test that started us is gone: do not linger
    hub.shutdown()
    cdn.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
