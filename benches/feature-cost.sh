#!/usr/bin/env bash
# The price of each feature, in what a dedicated counter node sells: checks
# per second of the server's own CPU (user + kernel time of the server
# process, from /proc/PID/stat, over the middle of each measured window).
#
#   cargo build --release --features cluster,events -p tollgate --bin tollgate
#   cargo build --release -p tollgate-bench
#   benches/feature-cost.sh
#
# The server under test runs pinned to core $SERVER_CORE with one runtime
# thread (TOKIO_WORKER_THREADS=1); tollgate-bench (one thread) and every
# helper process (nats-server, etcd, a standby, peer regions) run pinned to
# core $GEN_CORE, so what they cost is not charged to the server. Each
# round runs every setup once, in this order, and ROUNDS rounds alternate
# them (so drift on the box spreads over all of them):
#
#   tollgate      plain `tollgate serve`, inline token bucket     both shapes
#   redis-lua     redis-server + the seeds' token_bucket.lua      both shapes
#   redis-cell    redis-server + redis-cell's CL.THROTTLE         both shapes
#   events        --events to a real nats-server                  50x16x1
#   cluster       primary of a one-shard cluster on a real etcd   50x16x1
#   routing       plain server, the client's cluster mode         50x16x1
#   standby       primary with a hot standby attached             50x16x1
#   global        region a of three, a global rule vs a regional  50x16x1
#   check2        CHECK2 (priority + idempotency key, dedup)      50x16x1
#   tls           --tls-cert/--tls-key, the client over TLS       50x16x1
#
# Shapes are CONNECTIONSxPIPELINExBATCH. Every line printed is one
# measurement; the summary gives, per setup and shape, the median over the
# rounds of checks/s, server CPU per check, checks per server CPU-second
# and, for a feature, its cost: how much more server CPU a check takes with
# it on than plain Tollgate at the same shape in the same rounds (routing:
# the generator's, i.e. the client's, CPU). Ratios against Redis + Lua and
# redis-cell are per server CPU-second.
#
# Knobs (env): ROUNDS=3 DURATION=10 WARMUP=2 KEYS=1000000 SERVER_CORE=0
#   GEN_CORE=1 ONLY="tollgate events ..." (a subset of the setups, in that
#   order) TOLLGATE=target/release/tollgate BENCH=target/release/tollgate-bench
#   PORT_BASE=17900. Everything listens on 127.0.0.1; every process started
#   is stopped on exit.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-10}"
WARMUP="${WARMUP:-2}"
KEYS="${KEYS:-1000000}"
SERVER_CORE="${SERVER_CORE:-0}"
GEN_CORE="${GEN_CORE:-1}"
TOLLGATE="${TOLLGATE:-$ROOT/target/release/tollgate}"
BENCH="${BENCH:-$ROOT/target/release/tollgate-bench}"
PORT_BASE="${PORT_BASE:-17900}"
SETUPS=(tollgate redis-lua redis-cell events cluster routing standby global check2 tls)
ONLY="${ONLY:-${SETUPS[*]}}"
SECRET=feature-cost-cluster-secret-0123456789
BATCH1=50x16x1
BATCHED=4x8x64

source "$HERE/loadgen/proc.sh"

[[ "$DURATION" =~ ^[0-9]+$ && "$DURATION" -ge 3 && "$WARMUP" =~ ^[0-9]+$ && "$ROUNDS" =~ ^[1-9][0-9]*$ ]] ||
  { echo "feature-cost: DURATION (>= 3), WARMUP and ROUNDS (>= 1) are whole numbers" >&2; exit 2; }
for setup in $ONLY; do
  [[ " ${SETUPS[*]} " == *" $setup "* ]] || { echo "feature-cost: unknown setup $setup (one of: ${SETUPS[*]})" >&2; exit 2; }
done
needs=(taskset openssl)
[[ " $ONLY " == *" redis-"* ]] && needs+=(redis-server redis-cli)
[[ " $ONLY " == *" events "* ]] && needs+=(nats-server)
[[ " $ONLY " == *" cluster "* ]] && needs+=(etcd)
for program in "${needs[@]}" "$TOLLGATE" "$BENCH"; do
  command -v "$program" >/dev/null ||
    { echo "feature-cost: missing $program (scripts/deps.sh; cargo build --release, see the header)" >&2; exit 2; }
done

WORK="$(mktemp -d)"
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop_all; rm -rf "$WORK"' EXIT

# Runs "$@" in the background on core $1 and records its PID in $LAST.
on_core() {
  local core=$1
  shift
  taskset -c "$core" "$@" >>"$WORK/log" 2>&1 &
  LAST=$!
  pids+=("$LAST")
}

# A Tollgate server on the server core, one runtime thread; $LAST its PID.
server() { TOKIO_WORKER_THREADS=1 on_core "$SERVER_CORE" "$TOLLGATE" serve --admin none "$@"; }
# A helper Tollgate (standby, peer region) on the generator's core.
helper() { TOKIO_WORKER_THREADS=1 on_core "$GEN_CORE" "$TOLLGATE" serve --admin none "$@"; }

# Waits until `tollgate status` at $1 answers with role $2.
wait_role() {
  local addr=$1 role=$2 tls=("${@:3}")
  for _ in $(seq 200); do
    if "$TOLLGATE" status --server "$addr" --json "${tls[@]}" 2>/dev/null | grep -q "\"role\":\"$role\""; then
      return 0
    fi
    sleep 0.1
  done
  echo "feature-cost: $addr never became $role; its log:" >&2
  tail -n 20 "$WORK/log" >&2
  exit 1
}

wait_resp() {
  for _ in $(seq 100); do redis-cli -p "$1" PING >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "feature-cost: redis on $1 did not start" >&2; exit 1
}

port() { echo $((PORT_BASE + $1)); }
A="127.0.0.1:$(port 0)"

# One measurement: SETUP SHAPE TARGET SERVER_PID [tollgate-bench flags].
# Prints: setup shape checks/s server_us gen_us checks_per_server_cpu_s.
measure() {
  local setup=$1 shape=$2 target=$3 server_pid=$4
  shift 4
  local c p b
  IFS=x read -r c p b <<<"$shape"
  local out="$WORK/bench.json"
  taskset -c "$GEN_CORE" "$BENCH" --target "$target" --connections "$c" --pipeline "$p" --batch "$b" \
    --keys "$KEYS" --threads 1 --duration "${DURATION}s" --warmup "${WARMUP}s" --quiet --json "$@" \
    >"$out" 2>>"$WORK/log" &
  local bench_pid=$!
  # From 1 s into the measured window to 1 s before its end.
  sleep $((WARMUP + 1))
  local su0 sk0 gu0 gk0 su1 sk1 gu1 gk1 t0 t1
  read -r su0 sk0 < <(proc_cpu "$server_pid"); read -r gu0 gk0 < <(proc_cpu "$bench_pid"); t0=$(date +%s.%N)
  sleep $((DURATION - 2))
  read -r su1 sk1 < <(proc_cpu "$server_pid"); read -r gu1 gk1 < <(proc_cpu "$bench_pid"); t1=$(date +%s.%N)
  wait "$bench_pid" || { echo "feature-cost: tollgate-bench failed on $setup $shape:" >&2; tail -n 5 "$WORK/log" >&2; exit 1; }
  local checks errors
  checks=$(sed -n 's/.*"ops_per_sec":\([0-9.]*\).*/\1/p' "$out" | head -n1)
  errors=$(sed -n 's/.*"errors":\([0-9]*\).*/\1/p' "$out" | head -n1)
  [[ -n "$checks" ]] || { echo "feature-cost: no result for $setup $shape" >&2; exit 1; }
  [[ "${errors:-0}" == 0 ]] || { echo "feature-cost: $setup $shape: $errors checks failed" >&2; exit 1; }
  awk -v s="$setup" -v sh="$shape" -v c="$checks" -v su=$((su1 - su0 + sk1 - sk0)) -v gu=$((gu1 - gu0 + gk1 - gk0)) \
      -v t0="$t0" -v t1="$t1" -v hz="$(getconf CLK_TCK)" 'BEGIN {
    n = c * (t1 - t0)                     # checks in the sampled window
    server_us = su / hz / n * 1e6; gen_us = gu / hz / n * 1e6
    printf "%-11s %-8s %10.0f %9.3f %9.3f %12.0f\n", s, sh, c, server_us, gen_us, (server_us > 0 ? 1e6 / server_us : 0)
  }' | tee -a "$WORK/results"
}

certs() {
  [[ -f "$WORK/ca.pem" ]] && return 0
  (cd "$WORK" &&
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=bench-ca \
      -keyout ca.key -out ca.pem 2>/dev/null &&
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 \
      -keyout server.key -out server.csr 2>/dev/null &&
    printf 'subjectAltName=IP:127.0.0.1\n' >ext &&
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile ext \
      -out server.pem 2>/dev/null)
}

rules_file() {
  cat >"$WORK/rules.yaml" <<'YAML'
rules:
  - name: regional
    algorithm: token-bucket
    rate: 100/min
    burst: 100
  - name: global
    algorithm: token-bucket
    rate: 100/min
    burst: 100
    global: [a, b, c]
YAML
}

run_setup() {
  case "$1" in
    tollgate)
      server --listen "$A"; local s=$LAST; wait_role "$A" primary
      measure tollgate "$BATCH1" "tollgate=$A" "$s"
      measure tollgate "$BATCHED" "tollgate=$A" "$s" ;;
    redis-lua|redis-cell)
      local module=()
      [[ $1 == redis-cell ]] && module=(--loadmodule "$("$ROOT/benches/redis/redis-cell.sh")")
      on_core "$SERVER_CORE" redis-server --port "$(port 1)" --bind 127.0.0.1 --save '' --appendonly no "${module[@]}"
      local s=$LAST; wait_resp "$(port 1)"
      local kind=redis; [[ $1 == redis-cell ]] && kind=redis-cell
      measure "$1" "$BATCH1" "$kind=127.0.0.1:$(port 1)" "$s"
      measure "$1" "$BATCHED" "$kind=127.0.0.1:$(port 1)" "$s" ;;
    events)
      on_core "$GEN_CORE" nats-server -a 127.0.0.1 -p "$(port 2)"
      sleep 0.3
      server --listen "$A" --events "nats://127.0.0.1:$(port 2)"; local s=$LAST; wait_role "$A" primary
      measure events "$BATCH1" "tollgate=$A" "$s" ;;
    cluster)
      rm -rf "$WORK/etcd"
      on_core "$GEN_CORE" etcd --data-dir "$WORK/etcd" --listen-client-urls "http://127.0.0.1:$(port 3)" \
        --advertise-client-urls "http://127.0.0.1:$(port 3)" --listen-peer-urls "http://127.0.0.1:$(port 4)"
      for _ in $(seq 100); do
        "$TOLLGATE" cluster init --etcd "127.0.0.1:$(port 3)" --cluster bench --shards 1 >>"$WORK/log" 2>&1 && break
        sleep 0.2
      done
      server --listen "$A" --etcd "127.0.0.1:$(port 3)" --cluster bench --shard 0 --cluster-secret "$SECRET"
      local s=$LAST; wait_role "$A" primary
      measure cluster "$BATCH1" "tollgate=$A" "$s" ;;
    routing)
      server --listen "$A"; local s=$LAST; wait_role "$A" primary
      measure routing "$BATCH1" "tollgate-cluster=$A" "$s" ;;
    standby)
      local b="127.0.0.1:$(port 5)"
      server --listen "$A" --peer "$b" --cluster-secret "$SECRET"; local s=$LAST
      helper --listen "$b" --replica-of "$A" --peer "$A" --cluster-secret "$SECRET"
      wait_role "$A" primary; wait_role "$b" standby
      measure standby "$BATCH1" "tollgate=$A" "$s" ;;
    global)
      rules_file
      local b="127.0.0.1:$(port 6)" c="127.0.0.1:$(port 7)" regions=(--rules "$WORK/rules.yaml" --cluster-secret "$SECRET")
      server --listen "$A" --region a --region-peer "b=$b,c=$c" "${regions[@]}"; local s=$LAST
      helper --listen "$b" --region b --region-peer "a=$A,c=$c" "${regions[@]}"
      helper --listen "$c" --region c --region-peer "a=$A,b=$b" "${regions[@]}"
      wait_role "$A" primary
      measure regional "$BATCH1" "tollgate=$A" "$s" --rule regional
      measure global "$BATCH1" "tollgate=$A" "$s" --rule global ;;
    check2)
      server --listen "$A"; local s=$LAST; wait_role "$A" primary
      measure check2 "$BATCH1" "tollgate=$A" "$s" --priority normal ;;
    tls)
      certs
      server --listen "$A" --tls-cert "$WORK/server.pem" --tls-key "$WORK/server.key"; local s=$LAST
      wait_role "$A" primary --tls-ca "$WORK/ca.pem"
      measure tls "$BATCH1" "tollgate=$A" "$s" --tls-ca "$WORK/ca.pem" ;;
  esac
  stop_all
}

echo "feature-cost: $(nproc) cores, server on core $SERVER_CORE, generator and helpers on core $GEN_CORE;" \
  "$ROUNDS rounds of ${DURATION}s (+${WARMUP}s warm-up), $KEYS keys"
printf '%-11s %-8s %10s %9s %9s %12s\n' setup shape checks/s server_us gen_us checks/srv-s
: >"$WORK/results"
for round in $(seq "$ROUNDS"); do
  echo "# round $round"
  for setup in $ONLY; do run_setup "$setup"; done
done

# Medians per setup and shape, then each feature against plain Tollgate.
echo
echo "medians over $ROUNDS rounds (server_us: server CPU per check, µs; cost: extra CPU per check vs plain tollgate)"
sort -k1,1 -k2,2 "$WORK/results" | awk '
function median(list,    n, v, i, j, t) {
  n = split(list, v, " ")
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
  return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
{ k = $1 " " $2; if (!(k in seen)) { seen[k] = 1; order[++m] = k }
  cps[k] = cps[k] " " $3; srv[k] = srv[k] " " $4; gen[k] = gen[k] " " $5 }
END {
  printf "%-11s %-8s %10s %9s %9s %12s %8s\n", "setup", "shape", "checks/s", "server_us", "gen_us", "checks/srv-s", "cost"
  for (i = 1; i <= m; i++) { k = order[i]; split(k, f, " ")
    C[k] = median(cps[k]); S[k] = median(srv[k]); G[k] = median(gen[k]) }
  for (i = 1; i <= m; i++) {
    k = order[i]; split(k, f, " "); base = "tollgate " f[2]; cost = ""
    if (f[1] == "routing" && (base in G)) cost = sprintf("%+.1f%%", 100 * (G[k] / G[base] - 1)) " client"
    else if (f[1] == "global" && (("regional " f[2]) in S)) cost = sprintf("%+.1f%%", 100 * (S[k] / S["regional " f[2]] - 1)) " vs regional"
    else if (f[1] !~ /^(tollgate|redis-lua|redis-cell|regional)$/ && (base in S)) cost = sprintf("%+.1f%%", 100 * (S[k] / S[base] - 1))
    printf "%-11s %-8s %10.0f %9.3f %9.3f %12.0f %s\n", f[1], f[2], C[k], S[k], G[k], (S[k] > 0 ? 1e6 / S[k] : 0), cost
  }
  print ""
  for (i = 1; i <= m; i++) { k = order[i]; split(k, f, " ")
    if (f[1] != "tollgate") continue
    for (j = 1; j <= m; j++) { o = order[j]; split(o, g, " ")
      if (g[2] == f[2] && (g[1] == "redis-lua" || g[1] == "redis-cell") && S[k] > 0)
        printf "per server CPU-second at %s: tollgate / %s = %.1fx\n", f[2], g[1], S[o] / S[k]
    }
  }
}'
