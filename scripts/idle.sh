#!/usr/bin/env bash
# What an idle site costs: starts `causeway dev --sites SITES` (three nodes
# a site), waits WAIT seconds, then prints each node's utime+stime over
# SECONDS seconds as a percentage of one core, and the average.
#
#   scripts/idle.sh [SITES] [SECONDS] [WAIT]      (defaults: 3 60 15)
#
# CAUSEWAY=path/to/causeway picks the binary (default: a release build).
set -euo pipefail
SITES=${1:-3}
SECONDS_MEASURED=${2:-60}
WAIT=${3:-15}
cd "$(dirname "$0")/.."
if [ -z "${CAUSEWAY:-}" ]; then
    cargo build --release -q -p causeway
    CAUSEWAY=target/release/causeway
fi
PORT=17600
setsid "$CAUSEWAY" dev --sites "$SITES" --port $PORT > /dev/null 2>&1 &
DEV=$!
trap 'kill -- -$DEV 2> /dev/null || true' EXIT
sleep "$WAIT"
PIDS=$(pgrep -s $DEV -f " node --id" | tr '\n' ' ')
[ -n "$PIDS" ] || { echo "no node started" >&2; exit 1; }
ticks() { for p in $PIDS; do awk '{print $14 + $15}' "/proc/$p/stat"; done | paste -sd' '; }
HZ=$(getconf CLK_TCK)
BEFORE=$(ticks)
sleep "$SECONDS_MEASURED"
AFTER=$(ticks)
python3 - "$BEFORE" "$AFTER" "$SECONDS_MEASURED" "$HZ" <<'PY'
import sys
before, after = (list(map(int, a.split())) for a in sys.argv[1:3])
seconds, hz = float(sys.argv[3]), float(sys.argv[4])
pct = [(b - a) / hz / seconds * 100 for a, b in zip(before, after)]
print("%% of a core per node: %s; average %.2f%%" % (" ".join("%.2f" % p for p in pct), sum(pct) / len(pct)))
PY
