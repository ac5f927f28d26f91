#!/usr/bin/env bash
# CL.THROTTLE on Tollgate's RESP front end against Redis + Lua, measured by
# the same redis-benchmark in one run (interleaved), reported as a ratio.
#
#   cargo build --release -p tollgate --bin tollgate
#   benches/redis/resp-throttle.sh
#
# Tollgate: `tollgate serve --resp 127.0.0.1:$RESP_PORT`, redis-cell's
#   CL.THROTTLE rl:{__rand_int__} 99 100 60   (burst 100, 100/min)
# Redis:    redis-server --save '' --appendonly no, the seeds' token bucket
#   on the server's clock (token_bucket_servertime.lua, the same bucket):
#   EVALSHA <sha> 1 rl:{__rand_int__} 100 1.67 1
# Both over KEYSPACE random keys, CLIENTS connections, each pipeline depth
# of DEPTHS, REPS times. Prints one line per run, then medians and ratios.
# Everything on 127.0.0.1; both servers are stopped by PID on exit.
#
# Knobs (env): REQUESTS=1000000 CLIENTS=50 KEYSPACE=1000000 DEPTHS="1 16"
#   REPS=3 TOLLGATE=target/release/tollgate PROTOCOL_PORT=7811 RESP_PORT=6411
#   REDIS_PORT=6412
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
REQUESTS="${REQUESTS:-1000000}"
CLIENTS="${CLIENTS:-50}"
KEYSPACE="${KEYSPACE:-1000000}"
DEPTHS="${DEPTHS:-1 16}"
REPS="${REPS:-3}"
TOLLGATE="${TOLLGATE:-$ROOT/target/release/tollgate}"
PROTOCOL_PORT="${PROTOCOL_PORT:-7811}"
RESP_PORT="${RESP_PORT:-6411}"
REDIS_PORT="${REDIS_PORT:-6412}"

for program in redis-server redis-cli redis-benchmark "$TOLLGATE"; do
  command -v "$program" >/dev/null || { echo "missing $program (scripts/deps.sh; cargo build --release)" >&2; exit 1; }
done

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

"$TOLLGATE" serve --listen "127.0.0.1:$PROTOCOL_PORT" --admin none \
  --resp "127.0.0.1:$RESP_PORT" >/dev/null 2>&1 &
pids+=($!)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize no >/dev/null 2>&1 &
pids+=($!)
for port in "$RESP_PORT" "$REDIS_PORT"; do
  for _ in $(seq 100); do
    redis-cli -p "$port" PING >/dev/null 2>&1 && break
    sleep 0.1
  done
  redis-cli -p "$port" PING >/dev/null
done
SHA=$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$(cat "$HERE/token_bucket_servertime.lua")")

# rps of one redis-benchmark run of the command after the port.
bench() {
  local port=$1 depth=$2
  shift 2
  redis-benchmark -h 127.0.0.1 -p "$port" -c "$CLIENTS" -n "$REQUESTS" \
    -r "$KEYSPACE" -P "$depth" -q "$@" 2>/dev/null |
    tr '\r' '\n' | grep 'requests per second' | tail -1 |
    sed -E 's/.*: ([0-9.]+) requests per second.*/\1/'
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A runs
for rep in $(seq "$REPS"); do
  for depth in $DEPTHS; do
    t=$(bench "$RESP_PORT" "$depth" CL.THROTTLE 'rl:{__rand_int__}' 99 100 60)
    r=$(bench "$REDIS_PORT" "$depth" EVALSHA "$SHA" 1 'rl:{__rand_int__}' 100 1.67 1)
    echo "rep $rep depth $depth: tollgate CL.THROTTLE $t/s, redis EVALSHA $r/s"
    runs[t$depth]+="$t "
    runs[r$depth]+="$r "
  done
done

echo
echo "| connections x pipeline | Tollgate CL.THROTTLE/s | Redis + Lua EVALSHA/s | ratio |"
echo "|---|---|---|---|"
for depth in $DEPTHS; do
  t=$(echo "${runs[t$depth]}" | tr ' ' '\n' | grep . | median)
  r=$(echo "${runs[r$depth]}" | tr ' ' '\n' | grep . | median)
  awk -v c="$CLIENTS" -v d="$depth" -v t="$t" -v r="$r" \
    'BEGIN {printf "| %d x %d | %.0f | %.0f | %.1fx |\n", c, d, t, r, t / r}'
done
