# A client we did not write: Python's grpcio (Debian's python3-grpcio), calling
# callplane.examples.Echo through grpc-proxy with raw bytes (EchoMessage encoded by hand, no
# generated code), as a user with only the .proto would. Prints one JSON object with what it saw;
# test/grpc-python.test.ts asserts on it. Usage: grpc_client.py TARGET API_KEY FUNCTION_ID
import hashlib
import json
import os
import sys

import grpc

target, key, fid = sys.argv[1:4]
SVC = "/callplane.examples.Echo/"
OPTS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def enc(payload, repeat=0, delay_ms=0):
    out = b"\x0a" + varint(len(payload)) + payload
    if repeat:
        out += b"\x10" + varint(repeat)
    if delay_ms:
        out += b"\x18" + varint(delay_ms)
    return out


def dec(msg):
    """The payload field of an EchoMessage."""
    i = 0
    while i < len(msg):
        tag = msg[i]
        i += 1
        if tag & 7 == 2:
            n = shift = 0
            while True:
                b = msg[i]
                i += 1
                n |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            if tag >> 3 == 1:
                return msg[i : i + n]
            i += n
        else:
            while msg[i] & 0x80:
                i += 1
            i += 1
    return b""


md = [("authorization", "Bearer " + key), ("function-id", fid)]
ch = grpc.insecure_channel(target, options=OPTS)
out = {}


def meta(pairs, name):
    return [v for k, v in (pairs or ()) if k == name]


def failure(e):
    return {"code": e.code().name, "details": e.details(), "trailers": dict(e.trailing_metadata() or ())}


r, call = ch.unary_unary(SVC + "Unary").with_call(enc(b"py-unary"), metadata=md + [("x-echo-meta", "from-python")])
out["unary"] = {
    "payload": dec(r).decode(),
    "metaReceived": meta(call.initial_metadata(), "x-echo-meta-received"),
    "reqid": meta(call.initial_metadata(), "nvcf-reqid"),
    "trailer": meta(call.trailing_metadata(), "x-echo-trailer"),
}
out["serverStream"] = [dec(m).decode() for m in ch.unary_stream(SVC + "ServerStream")(enc(b"s", 4), metadata=md)]
out["clientStream"] = dec(ch.stream_unary(SVC + "ClientStream")(iter([enc(b"a"), enc(b"b"), enc(b"c")]), metadata=md)).decode()
out["bidi"] = [dec(m).decode() for m in ch.stream_stream(SVC + "Bidi")(iter([enc(b"x"), enc(b"y"), enc(b"z")]), metadata=md)]

big = os.urandom(20 * 1024 * 1024)
got = dec(ch.unary_unary(SVC + "Unary")(enc(big), metadata=md, timeout=120))
out["large"] = {"sent": hashlib.sha256(big).hexdigest(), "got": hashlib.sha256(got).hexdigest(), "bytes": len(got)}

try:
    ch.unary_unary(SVC + "Unary")(enc(b"e"), metadata=md + [("x-echo-status", "5")])
    out["error"] = "no error"
except grpc.RpcError as e:
    out["error"] = failure(e)

try:
    ch.unary_unary(SVC + "Unary")(enc(b"slow", 0, 3000), metadata=md, timeout=0.3)
    out["deadline"] = "no error"
except grpc.RpcError as e:
    out["deadline"] = failure(e)

stream = ch.unary_stream(SVC + "ServerStream")(enc(b"tick", 1000, 20), metadata=md)
first = dec(next(stream)).decode()
stream.cancel()
try:
    for _ in stream:
        pass
    out["cancel"] = {"first": first, "code": "no error"}
except grpc.RpcError as e:
    out["cancel"] = {"first": first, "code": e.code().name}

refusals = {}
for name, m in [
    ("noFunctionId", [("authorization", "Bearer " + key)]),
    ("noKey", [("function-id", fid)]),
    ("badKey", [("authorization", "Bearer nvapi-wrong"), ("function-id", fid)]),
    ("unknownFunction", [("authorization", "Bearer " + key), ("function-id", "7b7d7a8e-0c3e-4c55-9a40-3a4c1c4a1111")]),
]:
    try:
        ch.unary_unary(SVC + "Unary")(enc(b"r"), metadata=m, timeout=30)
        refusals[name] = "no error"
    except grpc.RpcError as e:
        refusals[name] = failure(e)
out["refusals"] = refusals

# a new connection resuming the first call's session
other = grpc.insecure_channel(target, options=OPTS + [("grpc.use_local_subchannel_pool", 1)])
r, call = other.unary_unary(SVC + "Unary").with_call(enc(b"again"), metadata=md + [("nvcf-reqid", out["unary"]["reqid"][0])])
out["resumed"] = {"payload": dec(r).decode(), "reqid": meta(call.initial_metadata(), "nvcf-reqid")}
print(json.dumps(out))
