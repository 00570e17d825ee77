"""Unary gRPC calls with grpcio (Python over gRPC's C core) for weir's edge tests.

    python unary_call.py HOST:PORT /package.Service/Method PAYLOAD [PAYLOAD ...]

Calls the method once per payload (raw bytes, no protobuf) on one channel and prints one
JSON object per call: {"code": "OK" | "RESOURCE_EXHAUSTED" | ..., "details", "response",
"initial", "trailing"}. The caller (proxy/tests/e2e/edge_grpc.rs) judges the outcome.
C-core is strict where tonic is lenient: a refusal that is not a real trailers-only
response (one HEADERS frame with END_STREAM) shows up here as UNKNOWN, not as the
grpc-status it carried.
"""

import json
import sys

import grpc


def metadata(pairs):
    return {k: (v.decode("latin-1") if isinstance(v, bytes) else v) for k, v in (pairs or [])}


def main():
    target, method, payloads = sys.argv[1], sys.argv[2], sys.argv[3:]
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(method)
        for payload in payloads:
            try:
                response, info = call.with_call(
                    payload.encode(),
                    timeout=10,
                    metadata=[("x-business-priority", "2")],
                )
                out = {
                    "code": "OK",
                    "details": "",
                    "response": response.decode("latin-1"),
                    "initial": metadata(info.initial_metadata()),
                    "trailing": metadata(info.trailing_metadata()),
                }
            except grpc.RpcError as err:
                out = {
                    "code": err.code().name,
                    "details": err.details(),
                    "response": None,
                    "initial": metadata(err.initial_metadata()),
                    "trailing": metadata(err.trailing_metadata()),
                }
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
