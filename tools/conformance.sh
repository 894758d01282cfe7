#!/usr/bin/env bash
# The official MCP conformance suite (`conformance server --url`), run twice in one go:
#   direct:  against server-everything's own streamable HTTP endpoint;
#   mcpool:  against `mcpool daemon --http` with the same server-everything behind it over stdio
#            ("prefix": false, so tool names are the server's own).
# Prints both results side by side (a Markdown table) and exits 1 when a check that passes
# directly does not pass through mcpool, unless it is listed in KNOWN below with the reason.
#   tools/conformance.sh [--keep]      (--keep: leave the work directory for inspection)
# Everything listens on 127.0.0.1 only; server-everything binds every interface by default, so
# it runs with tools/bench/loopback.cjs preloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -f .peers/env.sh ] || bash tools/peers.sh >&2
# shellcheck disable=SC1091
. .peers/env.sh

# Checks allowed to differ, each with its reason (see README, Conformance). None today.
KNOWN=""

START_TIMEOUT=20 # seconds for node and the daemon to start listening
CHECK_TIMEOUT=120 # one suite run; it takes about 2 s here

WORK=$(mktemp -d "${TMPDIR:-/tmp}/mcpool-conformance.XXXXXX")
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "${1:-}" != keep ]; then rm -rf "$WORK"; fi
}
if [ "${1:-}" = --keep ]; then trap 'cleanup keep' EXIT; else trap cleanup EXIT; fi

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_listening() { # port, pid, log
  local deadline=$((SECONDS + START_TIMEOUT))
  until "$PY" -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 0.2)" 2>/dev/null; do
    if ! kill -0 "$2" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
      echo "conformance: nothing listening on 127.0.0.1:$1; its log:" >&2
      cat "$3" >&2
      exit 2
    fi
    sleep 0.1
  done
}

DIRECT_PORT=$(free_port)
PORT=$DIRECT_PORT "$PEER_NODE22" --require "$REPO/tools/bench/loopback.cjs" "$PEER_EVERYTHING_JS" \
  streamableHttp >"$WORK/everything.log" 2>&1 &
PIDS+=($!)
wait_listening "$DIRECT_PORT" "${PIDS[-1]}" "$WORK/everything.log"

MCPOOL_PORT=$(free_port)
mkdir -p "$WORK/state" "$WORK/config"
mkdir -m 700 "$WORK/run" # the daemon uses only a private socket folder (X3)
cat >"$WORK/config.json" <<EOF
{"mcpServers": {"everything": {"command": "$PEER_NODE22",
  "args": ["$PEER_EVERYTHING_JS", "stdio"], "prefix": false}}}
EOF
XDG_STATE_HOME=$WORK/state XDG_CONFIG_HOME=$WORK/config XDG_RUNTIME_DIR=$WORK/run \
  "$PY" -m mcpool daemon --socket "$WORK/run/d.sock" --config "$WORK/config.json" \
  --http "127.0.0.1:$MCPOOL_PORT" >"$WORK/daemon.log" 2>&1 &
PIDS+=($!)
wait_listening "$MCPOOL_PORT" "${PIDS[-1]}" "$WORK/daemon.log"

# CONFORMANCE_JS: another build of the suite (default: the pinned one of .peers);
# CONFORMANCE_ARGS: more arguments to `server`, e.g. "--requirements 2026-07-28".
run_suite() { # name, url
  # shellcheck disable=SC2086
  timeout "$CHECK_TIMEOUT" "$PEER_NODE22" "${CONFORMANCE_JS:-$PEER_CONFORMANCE_JS}" server \
    --url "$2" ${CONFORMANCE_ARGS:-} -o "$WORK/$1" >"$WORK/$1.txt" 2>&1 || true
}
run_suite direct "http://127.0.0.1:$DIRECT_PORT/mcp"
run_suite mcpool "http://127.0.0.1:$MCPOOL_PORT/mcp"

KNOWN=$KNOWN "$PY" - "$WORK/direct" "$WORK/mcpool" <<'EOF'
import json, os, re, sys
from pathlib import Path

def results(root):
    out = {}
    for checks in sorted(Path(root).glob("*/checks.json")):
        scenario = re.sub(r"^server-|-\d{4}-\d\d-\d\dT.*$", "", checks.parent.name)
        for c in json.loads(checks.read_text()):
            out[(scenario, c["id"])] = (c["status"], c.get("errorMessage") or "")
    return out

direct, mcpool = results(sys.argv[1]), results(sys.argv[2])
if not direct or not mcpool:
    sys.exit(f"conformance: no results (direct {len(direct)}, mcpool {len(mcpool)})")
known = set(os.environ.get("KNOWN", "").split())
mark = {"SUCCESS": "pass", "FAILURE": "FAIL", "WARNING": "warn", "SKIPPED": "skip"}
print("| scenario | check | direct | through mcpool |")
print("|---|---|---|---|")
regressions, explained = [], []
for key in sorted(set(direct) | set(mcpool), key=lambda k: (list(direct).index(k) if k in direct else 1e9, k)):
    d = direct.get(key, ("-", ""))[0]
    m = mcpool.get(key, ("-", ""))[0]
    note = ""
    if d == "SUCCESS" and m != "SUCCESS":
        if key[0] in known:
            explained.append(key)
            note = " (known)"
        else:
            regressions.append(key)
            note = " (REGRESSION)"
    print(f"| {key[0]} | {key[1]} | {mark.get(d, d)} | {mark.get(m, m)}{note} |")
passes = lambda r: sum(1 for s, _ in r.values() if s == "SUCCESS")
print(f"\ndirect: {passes(direct)}/{len(direct)} checks pass; "
      f"through mcpool: {passes(mcpool)}/{len(mcpool)}")
for key in explained:
    print(f"known difference: {key[0]}/{key[1]}: {mcpool.get(key, ('', ''))[1]}")
for key in regressions:
    print(f"REGRESSION: {key[0]}/{key[1]}: {mcpool.get(key, ('', ''))[1]}")
sys.exit(1 if regressions else 0)
EOF
