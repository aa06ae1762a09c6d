#!/usr/bin/env bash
# Eunomia Figure 5 on this machine: throughput of causal replication
# (Eunomia) against its two baselines, eventual (no causal order) and
# sequenced (S-Seq: a synchronous site sequencer in the write path), on the
# paper's read:update mixes, with clients in every site of a 3-site
# `causeway dev` (the paper's delays). Each mode gets a fresh cluster; the
# modes take turns, `rounds` times, so a noisy machine hits them alike.
# Beside ops/s it prints the CPU time the nine node processes spent per
# operation (utime+stime from /proc), which moves less with the machine's
# other load than throughput does, and the messages they sent each other
# per operation (INFO peer_messages_sent), which hardly moves at all.
# Usage: scripts/bench-geo.sh [seconds per run] [clients] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-15}
clients=${2:-18}
rounds=${3:-2}
cargo build --release -q -p causeway
B=./target/release/causeway
out=target/bench-geo
mkdir -p $out
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT
addrs=127.0.0.1:7380,127.0.0.1:7390,127.0.0.1:7400
# CPU clock ticks (utime+stime) of every process under the dev process.
node_ticks() {
  local total=0
  for p in $(pgrep -P "$pid"); do
    read -r -a f < "/proc/$p/stat" || continue
    total=$((total + f[13] + f[14]))
  done
  echo $total
}
# Messages the nine nodes queued for each other so far, by kind (INFO
# replication), as JSON into $1.
node_messages() {
  python3 - "$1" <<'PY'
import json, socket, sys
kinds = {}
for base in (7380, 7390, 7400):
    for port in range(base, base + 3):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"*2\r\n$4\r\nINFO\r\n$11\r\nreplication\r\n")
        data = b""
        while b"peer_messages_by_kind:" not in data or not data.endswith(b"\r\n"):
            data += s.recv(65536)
        s.close()
        for line in data.decode().splitlines():
            if line.startswith("peer_messages_by_kind:") and "=" in line:
                for kv in line.split(":", 1)[1].split(","):
                    k, n = kv.split("=")
                    kinds[k] = kinds.get(k, 0) + int(n)
json.dump(kinds, open(sys.argv[1], "w"))
PY
}
for round in $(seq 1 "$rounds"); do
  for mode in causal eventual sequenced; do
    $B dev --sites 3 --port 7380 -- --replication $mode >$out/dev-$mode.log 2>&1 & pid=$!
    sleep 5
    # The records, once per cluster, written through every site.
    $B bench --addr $addrs --read-percent 100 --records 10000 --value-size 100 --clients $clients --duration 1 >/dev/null
    for reads in 99 90 75 50; do
      before=$(node_ticks); node_messages $out/$mode-$reads-$round.msgs-before
      $B bench --addr $addrs --no-load --records 10000 --value-size 100 --clients $clients --duration "$secs" \
        --read-percent $reads --label "$mode" --json $out/$mode-$reads-$round.json | sed -n "1,5s/^/[round $round] /p"
      echo $(( $(node_ticks) - before )) > $out/$mode-$reads-$round.ticks
      node_messages $out/$mode-$reads-$round.msgs-after
    done
    kill $pid; wait $pid 2>/dev/null || true; pid=
    sleep 1
  done
done
# One line per mix, one value per mode and round: the python expression
# $1 of `j` (the run's JSON), `t` (its node CPU clock ticks) and `m` (the
# messages the nodes sent each other).
table() {
  for reads in 99 90 75 50; do
    line="$reads:$((100 - reads))"
    for mode in causal eventual sequenced; do
      vals=$(for round in $(seq 1 "$rounds"); do
        f=$out/$mode-$reads-$round
        python3 -c "import json; j=json.load(open('$f.json')); t=int(open('$f.ticks').read()); a=json.load(open('$f.msgs-after')); b=json.load(open('$f.msgs-before')); m=sum(a.values())-sum(b.values()); print(round($1, 1))" 2>/dev/null || echo '?'
      done | paste -sd/)
      line="$line  $mode $vals"
    done
    echo "$line"
  done
}
echo "== ops/s by mode and read:update mix, per round (JSON in $out)"
table "j['ops_per_sec']"
echo "== node CPU per operation (microseconds; clock ticks of the nine nodes / operations), per round"
table "t * 1e6 / $(getconf CLK_TCK) / j['total_ops']"
echo "== messages between nodes per operation, per round"
table "m / j['total_ops']"
echo "== messages between nodes per operation by kind, 90:10, round 1"
python3 - $out <<'PY'
import json, sys
out = sys.argv[1]
rows = {}
for mode in ("causal", "eventual", "sequenced"):
    f = f"{out}/{mode}-90-1"
    a, b, ops = json.load(open(f + ".msgs-after")), json.load(open(f + ".msgs-before")), json.load(open(f + ".json"))["total_ops"]
    for k in a:
        rows.setdefault(k, {})[mode] = (a[k] - b.get(k, 0)) / ops
for k, v in sorted(rows.items(), key=lambda kv: -max(kv[1].values())):
    print(f"{k:12s}" + "".join(f"  {m} {v.get(m, 0):.3f}" for m in ("causal", "eventual", "sequenced")))
PY
