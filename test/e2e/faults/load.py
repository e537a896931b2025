# Steady load with exact accounting, for the fault suite: a client we did not write (Python's
# http.client and Debian's python3-grpcio) sends requests from N threads until told to stop, checks
# every answer against what it sent, and at the end prints one JSON object: sent, answered (right
# status and body), failed (each with its reason), unaccounted (sent, never answered nor failed:
# must be zero), and latency percentiles. While it runs it prints a progress line every second.
#
#   load.py http URL --header 'authorization: Bearer K' [--concurrency 8] [--duration 30] [--bytes 1024]
#   load.py grpc HOST:PORT --metadata 'authorization=Bearer K' --metadata 'function-id=F' [...]
#
# Stop: after --duration seconds, or at SIGTERM/SIGINT; requests in flight then get --drain
# seconds to finish before they count as unaccounted.
import argparse
import http.client
import json
import os
import signal
import sys
import threading
import time
import urllib.parse

p = argparse.ArgumentParser()
p.add_argument("kind", choices=["http", "grpc"])
p.add_argument("target")
p.add_argument("--header", action="append", default=[])
p.add_argument("--metadata", action="append", default=[])
p.add_argument("--concurrency", type=int, default=8)
p.add_argument("--duration", type=float, default=30)
p.add_argument("--bytes", type=int, default=1024)
p.add_argument("--timeout", type=float, default=30, help="seconds one request may take")
p.add_argument("--drain", type=float, default=30)
p.add_argument("--new-connection-every", type=int, default=0, help="reconnect after N requests (0: keep)")
args = p.parse_args()

stop = threading.Event()
lock = threading.Lock()
counts = {"sent": 0, "answered": 0, "failed": 0, "wrong": 0}
reasons = {}
fail_at = []  # seconds since the start of each failure (the first 1000)
latencies = []
in_flight = 0


def record(outcome, ms=None, reason=None):
    global in_flight
    with lock:
        in_flight -= 1
        counts[outcome] += 1
        if reason:
            reasons[reason] = reasons.get(reason, 0) + 1
        if outcome != "answered" and len(fail_at) < 1000:
            fail_at.append(round(time.monotonic() - started, 2))
        if ms is not None and outcome == "answered":
            latencies.append(ms)


def payload(worker, n):
    head = f"{worker}:{n}:".encode()
    return head + b"x" * max(0, args.bytes - len(head))


def http_worker(w):
    global in_flight
    u = urllib.parse.urlsplit(args.target)
    path = u.path + (f"?{u.query}" if u.query else "")
    headers = {"content-type": "application/octet-stream"}
    for h in args.header:
        k, v = h.split(":", 1)
        headers[k.strip()] = v.strip()
    conn = None
    n = 0
    while not stop.is_set():
        n += 1
        body = payload(w, n)
        with lock:
            counts["sent"] += 1
            in_flight += 1
        t0 = time.monotonic()
        try:
            if conn is None:
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=args.timeout)
            conn.request("POST", path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
            ms = (time.monotonic() - t0) * 1000
            if r.status == 200 and data == body:
                record("answered", ms)
            elif r.status == 200:
                record("wrong", reason="200 with another body")
            else:
                code = ""
                try:
                    code = json.loads(data).get("code", "")
                except Exception:
                    pass
                record("failed", reason=f"{r.status} {code}".strip())
            if r.getheader("connection", "").lower() == "close" or r.will_close:
                conn.close()
                conn = None
            elif args.new_connection_every and n % args.new_connection_every == 0:
                conn.close()
                conn = None
        except Exception as e:  # a connection error is a clear failure, counted by its kind
            record("failed", reason=type(e).__name__)
            if conn is not None:
                conn.close()
            conn = None


def grpc_worker(w):
    global in_flight
    import grpc

    md = []
    for m in args.metadata:
        k, v = m.split("=", 1)
        md.append((k.strip(), v.strip()))
    opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    channel = grpc.insecure_channel(args.target, options=opts)
    unary = channel.unary_unary(
        "/callplane.examples.Echo/Unary", request_serializer=None, response_deserializer=None
    )

    def enc(b):
        out, n = bytearray(), len(b)
        while True:
            byte, n = n & 0x7F, n >> 7
            out.append(byte | (0x80 if n else 0))
            if not n:
                break
        return b"\x0a" + bytes(out) + b

    n = 0
    while not stop.is_set():
        n += 1
        body = payload(w, n)
        with lock:
            counts["sent"] += 1
            in_flight += 1
        t0 = time.monotonic()
        try:
            reply = unary(enc(body), metadata=md, timeout=args.timeout)
            ms = (time.monotonic() - t0) * 1000
            if reply == enc(body):
                record("answered", ms)
            else:
                record("wrong", reason="reply with another payload")
        except grpc.RpcError as e:
            record("failed", reason=f"{e.code().name} {(e.details() or '')[:60]}".strip())
        except Exception as e:
            record("failed", reason=type(e).__name__)
    channel.close()


def on_signal(*_):
    stop.set()


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
threads = [
    threading.Thread(target=http_worker if args.kind == "http" else grpc_worker, args=(i,), daemon=True)
    for i in range(args.concurrency)
]
started = time.monotonic()
started_wall = int(time.time() * 1000)
print(json.dumps({"started": started_wall}), flush=True)
for t in threads:
    t.start()
parent = os.getppid()
while not stop.is_set() and time.monotonic() - started < args.duration:
    stop.wait(1)
    if os.getppid() != parent:  # the runner died without stopping us: load for no one
        os._exit(3)
    with lock:
        snap = dict(counts, in_flight=in_flight, t=round(time.monotonic() - started, 1))
    print(json.dumps({"progress": snap}), flush=True)
stop.set()
deadline = time.monotonic() + args.drain
for t in threads:
    t.join(max(0, deadline - time.monotonic()))
with lock:
    latencies.sort()
    q = lambda f: round(latencies[min(len(latencies) - 1, int(len(latencies) * f))], 2) if latencies else None
    out = dict(counts)
    out["unaccounted"] = counts["sent"] - counts["answered"] - counts["failed"] - counts["wrong"]
    out["reasons"] = reasons
    out["p50ms"] = q(0.5)
    out["p99ms"] = q(0.99)
    out["seconds"] = round(time.monotonic() - started, 1)
    out["startedAtMs"] = started_wall
    out["failAt"] = fail_at
print(json.dumps({"result": out}), flush=True)
os._exit(0)
