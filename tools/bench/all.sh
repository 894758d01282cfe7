#!/bin/bash
# Runs every benchmark in turn (about 3 minutes on 2 cores); each prints its table and writes
# tools/bench/results/NAME.json. Run it on an otherwise idle machine: the figures are timings.
#
#   tools/bench/all.sh [NAME...]     (names: attach latency throughput memory fanout reload
#                                     processes stuck hotpath cpu ledger demo startup footprint
#                                     toolsearch)
set -euo pipefail
cd "$(dirname "$0")"
PY=../../.venv/bin/python
bash peers.sh
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(attach latency throughput memory fanout reload processes stuck hotpath cpu ledger demo startup footprint toolsearch)
for name in "${NAMES[@]}"; do
  echo "== $name ($(date +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
  "$PY" "$name.py"
done
