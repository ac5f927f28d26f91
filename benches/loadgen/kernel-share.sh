#!/usr/bin/env bash
# Where the box's CPU goes under a tollgate-bench run, and what that leaves:
# the kernel's share per check (loopback TCP, measured), the user-space share,
# and the throughput the kernel's share alone would allow on this box.
#
# Usage (from the repository root, release binaries built):
#   benches/loadgen/kernel-share.sh KIND=ADDR [tollgate-bench flags...]
# e.g.
#   target/release/tollgate serve --listen 127.0.0.1:7700 --admin none &
#   benches/loadgen/kernel-share.sh tollgate=127.0.0.1:7700 \
#       --connections 50 --pipeline 16 --batch 1 --keys 1000000
#
# Runs one target for DURATION seconds (default 10, after WARMUP=2) and
# samples, over the middle of the measured window, the whole box's CPU time
# (/proc/stat: user+nice, system+irq+softirq, idle+iowait, steal) and the TCP
# segments sent (/proc/net/snmp OutSegs: on loopback every segment is also
# received on the same box). Everything runs on this machine, so the figures
# cover the generator, the server and the kernel between them: the point is
# the split, not one process. The generator's own CPU (/proc/PID/stat) is
# reported too, and the server's when SERVER_PID names it. Reads only /proc;
# needs no root.
set -euo pipefail

target="${1:?usage: kernel-share.sh KIND=ADDR [tollgate-bench flags...]}"
shift
bench="${BENCH:-target/release/tollgate-bench}"
duration="${DURATION:-10}"   # whole seconds, at least 3
warmup="${WARMUP:-2}"
[[ "$duration" =~ ^[0-9]+$ && "$duration" -ge 3 && "$warmup" =~ ^[0-9]+$ ]] ||
    { echo "kernel-share: DURATION must be a whole number of seconds >= 3, WARMUP a whole number" >&2; exit 2; }
[[ -x "$bench" ]] || { echo "kernel-share: $bench not built (cargo build --release -p tollgate-bench)" >&2; exit 2; }

source "$(dirname "${BASH_SOURCE[0]}")/proc.sh"

out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$bench" --target "$target" --duration "${duration}s" --warmup "${warmup}s" --quiet --json "$@" >"$out" &
pid=$!
# Sample from 1 s into the measured window to 1 s before its end.
sleep $((warmup + 1))
read -r u0 k0 i0 s0 < <(cpu); g0=$(segs); t0=$(date +%s.%N)
read -r gu0 gk0 < <(proc_cpu "$pid"); read -r su0 sk0 < <(proc_cpu "${SERVER_PID:-}")
sleep $((duration - 2))
read -r u1 k1 i1 s1 < <(cpu); g1=$(segs); t1=$(date +%s.%N)
read -r gu1 gk1 < <(proc_cpu "$pid"); read -r su1 sk1 < <(proc_cpu "${SERVER_PID:-}")
wait "$pid"

checks=$(sed -n 's/.*"ops_per_sec":\([0-9.]*\).*/\1/p' "$out" | head -n1)
[[ -n "$checks" ]] || { echo "kernel-share: no result from tollgate-bench:" >&2; cat "$out" >&2; exit 1; }
hz=$(getconf CLK_TCK)
ncpu=$(grep -c "^cpu[0-9]" /proc/stat)  # all of the box, whatever this shell's affinity
awk -v u="$((u1 - u0))" -v k="$((k1 - k0))" -v i="$((i1 - i0))" -v s="$((s1 - s0))" \
    -v gu="$((gu1 - gu0))" -v gk="$((gk1 - gk0))" -v su="$((su1 - su0))" -v sk="$((sk1 - sk0))" \
    -v server="${SERVER_PID:-}" -v g="$((g1 - g0))" -v t0="$t0" -v t1="$t1" -v hz="$hz" -v n="$ncpu" -v c="$checks" '
BEGIN {
    secs = t1 - t0; all = u + k + i + s
    segps = g / secs
    kus = (k / hz) / secs / c * 1e6          # kernel CPU per check, µs
    uus = (u / hz) / secs / c * 1e6          # user CPU per check, µs
    printf "checks/s                      %12.0f\n", c
    printf "TCP segments/s (sent)         %12.0f   %.1f checks per segment\n", segps, c / segps
    printf "CPU of %d cores: user %.0f%%, kernel %.0f%%, idle %.0f%%, steal %.0f%%\n", n, 100*u/all, 100*k/all, 100*i/all, 100*s/all
    printf "kernel CPU per check          %12.3f us   (%.2f us per segment)\n", kus, (k / hz) / g * 1e6
    printf "user CPU per check            %12.3f us\n", uus
    per = 1e6 / hz / secs / c               # µs per check of one clock tick per second
    printf "  generator: user %.3f us, kernel %.3f us\n", gu * per, gk * per
    if (server != "") printf "  server:    user %.3f us, kernel %.3f us\n", su * per, sk * per
    # A short or idle window can see no kernel tick at all: no ceiling then.
    if (kus > 0) printf "ceiling, no user CPU at all   %12.0f checks/s (%d cores / kernel CPU per check)\n", n / kus * 1e6, n
    if (kus > 0) printf "ceiling, a server of no cost  %12.0f checks/s (%d cores / (kernel + generator user) per check)\n", n / (kus + gu * per) * 1e6, n
}'
