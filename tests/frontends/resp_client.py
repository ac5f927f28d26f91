"""redis-py against Tollgate's RESP front end (run by resp_py.rs).

Usage: resp_client.py PORT TOKEN (a server with the default
--resp-max-multi-bytes)

The server runs a manual clock at t = 1000 s that the test does not move,
so every number below is exact. Exits non-zero (an AssertionError) on the
first difference.
"""

import sys

import redis
from redis.cluster import RedisCluster

port, token = int(sys.argv[1]), sys.argv[2]

# Not authenticated: refused.
anonymous = redis.Redis(host="127.0.0.1", port=port)
try:
    anonymous.execute_command("CL.THROTTLE", "k", 1, 1, 1)
    raise AssertionError("a command without AUTH was answered")
except redis.AuthenticationError:
    pass

for protocol in (2, 3):
    r = redis.Redis(host="127.0.0.1", port=port, password=token, protocol=protocol)
    assert r.ping() is True
    key = f"py{protocol}"

    # CL.THROTTLE: redis-cell's five integers.
    reply = r.execute_command("CL.THROTTLE", key, 2, 10, 60)
    assert reply == [0, 3, 2, -1, 6], reply
    reply = r.execute_command("CL.THROTTLE", key, 2, 10, 60, 2)
    assert reply == [0, 3, 0, -1, 18], reply
    reply = r.execute_command("CL.THROTTLE", key, 2, 10, 60)
    assert reply == [1, 3, 0, 6, 18], reply

    # The fixed-window pattern: INCR and EXPIRE in a pipeline...
    pipe = r.pipeline(transaction=False)
    pipe.incr(f"{key}:win")
    pipe.expire(f"{key}:win", 60)
    assert pipe.execute() == [1, True]
    # ... and in MULTI/EXEC, INCRBY and PEXPIRE.
    pipe = r.pipeline(transaction=True)
    pipe.incrby(f"{key}:win", 4)
    pipe.pexpire(f"{key}:win", 60000)
    assert pipe.execute() == [5, True]
    assert r.get(f"{key}:win") == b"5"
    # 60 s windows aligned on the clock: t = 1000 s, the window ends at 1020 s.
    assert r.ttl(f"{key}:win") == 20, r.ttl(f"{key}:win")
    assert r.pttl(f"{key}:win") == 20000
    assert r.delete(f"{key}:win", "absent") == 1
    assert r.get(f"{key}:win") is None
    assert r.ttl(f"{key}:win") == -2

    # Scripts and unknown commands: clear errors, the connection goes on.
    for call in (
        lambda: r.eval("return 1", 0),
        lambda: r.evalsha("0" * 40, 0),
        lambda: r.set("k", "v"),
    ):
        try:
            call()
            raise AssertionError("refused command answered")
        except redis.ResponseError as e:
            assert "unknown command" in str(e), e
    assert r.ping() is True

    # A MULTI past --resp-max-multi-bytes (1 MiB: 40 commands of 32 KiB):
    # the command that does not fit is refused with Redis's OOM error and
    # EXEC discards the transaction; the connection goes on.
    pipe = r.pipeline(transaction=True)
    for _ in range(40):
        pipe.execute_command("PING", *(["x" * 512] * 63))
    try:
        pipe.execute()
        raise AssertionError("a 1.3 MiB MULTI was run")
    except redis.exceptions.OutOfMemoryError as e:
        assert "resp-max-multi-bytes" in str(e), e
    assert r.ping() is True
    r.close()

# A cluster client reads CLUSTER SLOTS and routes every key to this node.
rc = RedisCluster(host="127.0.0.1", port=port, password=token)
nodes = rc.get_nodes()
assert [n.port for n in nodes] == [port], nodes
for i in range(20):
    assert rc.incr(f"cluster:{i}") == 1
reply = rc.execute_command("CL.THROTTLE", "cluster:bucket", 0, 1, 1)
assert reply == [0, 1, 0, -1, 1], reply
rc.close()
print("ok")
