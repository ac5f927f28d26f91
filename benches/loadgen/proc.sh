# CPU counters read from /proc, shared by the bench scripts that report
# where CPU goes (kernel-share.sh, feature-cost.sh). Sourced, not run.

# user+nice, system+irq+softirq, idle+iowait and steal ticks of the whole box.
cpu() { awk '/^cpu /{print $2+$3, $4+$7+$8, $5+$6, $9}' /proc/stat; }

# utime and stime of a process, in clock ticks ("0 0" when none is named).
proc_cpu() { if [[ -n "${1:-}" ]]; then awk '{print $14, $15}' "/proc/$1/stat"; else echo 0 0; fi; }

# TCP segments sent by the box (on loopback each is also received here).
segs() { awk '/^Tcp:/{ if (!h) { for (i = 1; i <= NF; i++) if ($i == "OutSegs") c = i; h = 1 } else print $c }' /proc/net/snmp; }
