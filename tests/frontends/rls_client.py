"""A grpcio client of Envoy's rate limit service (run by envoy_rls.rs).

Usage: rls_client.py PORT TOKEN PROTO_DIR OUT_DIR

Generates the client from PROTO_DIR (the project's proto/) with
grpcio-tools into OUT_DIR, then checks the answers of a server whose
rules are envoy_rls.rs's RULES, on a manual clock at t = 1000 s that the
test does not move. Exits non-zero on the first difference.
"""

import os
import sys

import grpc
import grpc_tools
from grpc_tools import protoc

port, token, proto_dir, out_dir = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
os.makedirs(out_dir, exist_ok=True)
files = [
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "envoy/config/core/v3/base.proto",
    "envoy/type/v3/ratelimit_unit.proto",
]
well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
code = protoc.main(
    ["protoc", f"-I{proto_dir}", f"-I{well_known}", f"--python_out={out_dir}",
     f"--grpc_python_out={out_dir}"] + files
)
assert code == 0, f"protoc failed: {code}"
sys.path.insert(0, out_dir)

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # noqa: E402
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # noqa: E402
from envoy.type.v3 import ratelimit_unit_pb2  # noqa: E402

Code = rls_pb2.RateLimitResponse.Code
Unit = rls_pb2.RateLimitResponse.RateLimit.Unit
Descriptor = ratelimit_pb2.RateLimitDescriptor

stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
auth = [("authorization", f"Bearer {token}")]


def descriptor(*entries, **extra):
    return Descriptor(
        entries=[Descriptor.Entry(key=k, value=v) for k, v in entries], **extra
    )


def ask(*descriptors, metadata=auth, **extra):
    request = rls_pb2.RateLimitRequest(domain="edge", descriptors=descriptors, **extra)
    return stub.ShouldRateLimit(request, metadata=metadata, timeout=10)


def headers(response):
    return {h.key: h.value for h in response.response_headers_to_add}


# No token, a wrong token: UNAUTHENTICATED.
for metadata in ([], [("authorization", "Bearer wrong")]):
    try:
        ask(descriptor(("remote_address", "10.0.0.1")), metadata=metadata)
        raise AssertionError("answered without a client token")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e

# edge.remote_address: a fixed window of 3 a minute, ending at t = 1020 s.
ip = descriptor(("remote_address", "10.0.0.1"))
for remaining in (2, 1, 0):
    r = ask(ip)
    assert r.overall_code == Code.OK, r
    (s,) = r.statuses
    assert s.code == Code.OK and s.limit_remaining == remaining, s
    assert s.current_limit.name == "edge.remote_address", s
    assert s.current_limit.requests_per_unit == 3, s
    assert s.current_limit.unit == Unit.MINUTE, s
    assert s.duration_until_reset.seconds == 20, s
    assert headers(r) == {
        "x-ratelimit-limit": "3, 3;w=60",
        "x-ratelimit-remaining": str(remaining),
        "x-ratelimit-reset": "20",
    }, headers(r)
r = ask(ip)
assert r.overall_code == Code.OVER_LIMIT, r
assert r.statuses[0].code == Code.OVER_LIMIT and r.statuses[0].limit_remaining == 0

# The last entry's value picks a more specific rule: 1 a second.
free = descriptor(("remote_address", "10.0.0.2"), ("tier", "free"))
r = ask(free)
(s,) = r.statuses
assert s.code == Code.OK and s.current_limit.name == "edge.remote_address.tier:free", s
assert s.current_limit.unit == Unit.SECOND and s.duration_until_reset.seconds == 1, s
r = ask(free)
assert r.overall_code == Code.OVER_LIMIT, r

# No rule: OK with no limit; one over-limit descriptor makes the call over.
r = ask(descriptor(("user", "u1")), descriptor(("remote_address", "10.0.0.1")))
assert r.overall_code == Code.OVER_LIMIT, r
assert r.statuses[0].code == Code.OK and not r.statuses[0].HasField("current_limit")
assert r.statuses[1].code == Code.OVER_LIMIT

# A limit override: 4 a second, hits_addend 3 from the request.
override = descriptor(
    ("user", "u2"),
    limit=Descriptor.RateLimitOverride(
        requests_per_unit=4, unit=ratelimit_unit_pb2.SECOND
    ),
)
r = ask(override, hits_addend=3)
(s,) = r.statuses
assert s.code == Code.OK and s.limit_remaining == 1, s
assert s.current_limit.requests_per_unit == 4 and s.current_limit.unit == Unit.SECOND, s
r = ask(override, hits_addend=3)
assert r.overall_code == Code.OVER_LIMIT, r

# Bad requests: INVALID_ARGUMENT, and the server still answers.
for bad in (
    rls_pb2.RateLimitRequest(domain="", descriptors=[ip]),
    rls_pb2.RateLimitRequest(domain="edge", descriptors=[Descriptor()]),
):
    try:
        stub.ShouldRateLimit(bad, metadata=auth, timeout=10)
        raise AssertionError("a bad request was answered")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
assert ask(descriptor(("user", "u3"))).overall_code == Code.OK
print("ok")
