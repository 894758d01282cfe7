#!/usr/bin/env bash
# The MCP conformance suite's server scenarios (@modelcontextprotocol/conformance 0.2.0-alpha,
# pinned in .peers as PEER_CONFORMANCE_ALPHA_JS), run per revision against three endpoints:
#   direct:  our reference server's own streamable HTTP endpoint (tools/conformance_server.py);
#   stdio:   `mcpool daemon --http` with that server behind it as a stdio upstream;
#   http:    `mcpool daemon --http` with that server behind it as an HTTP upstream
#   twice-a, twice-b: two suite runs at once through `mcpool daemon --http` with that server
#            behind it as one stdio upstream pinned to the handshake era (handshake revisions)
#            (both daemons "prefix": false, so the names the suite calls are the server's own).
# Revisions: 2025-06-18 and 2025-11-25 (`--spec-version`, the handshake era) and 2026-07-28
# (`--requirements`, exactly the scenarios that revision requires, at its own wire).
# Prints one Markdown table per revision and exits 1 when a check that passes directly does not
# pass through mcpool, unless it is listed in KNOWN below with the reason.
#   tools/conformance.sh [--keep] [REVISION...]   (--keep: leave the work directory)
#   tools/conformance.sh --clients [--keep] [REVISION...]
#       the suite's CLIENT scenarios instead, with mcpool as the client against the SDK's own
#       client as the direct baseline (tools/conformance_clients.sh, which documents its options)
# Everything of ours listens on 127.0.0.1 only.
#
# This replaces the 0.1.16 run against server-everything: that server does not implement the
# suite's test tools, so most checks failed directly too and the comparison proved little; the
# alpha suite covers every 0.1.16 scenario, at each revision's wire.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --clients ]; then shift; exec bash tools/conformance_clients.sh "$@"; fi
REPO=$PWD
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -f .peers/env.sh ] || bash tools/peers.sh >&2
# shellcheck disable=SC1091
. .peers/env.sh

# Checks allowed to differ, as revision/scenario/check (see README, Conformance). None today.
KNOWN=""

START_TIMEOUT=20 # seconds for a server or a daemon to start listening
CHECK_TIMEOUT=180 # one suite run (one revision, one endpoint); about 5 s here

KEEP=no
if [ "${1:-}" = --keep ]; then KEEP=yes; shift; fi
REVISIONS=("$@")
[ ${#REVISIONS[@]} -gt 0 ] || REVISIONS=(2025-06-18 2025-11-25 2026-07-28)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/mcpool-conformance.XXXXXX")
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$KEEP" = no ]; then rm -rf "$WORK"; else echo "conformance: kept $WORK" >&2; fi
}
trap cleanup EXIT

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

SERVER=$REPO/tools/conformance_server.py
DIRECT_PORT=$(free_port)
"$PY" "$SERVER" http "$DIRECT_PORT" >"$WORK/server.log" 2>&1 &
PIDS+=($!)
wait_listening "$DIRECT_PORT" "${PIDS[-1]}" "$WORK/server.log"

# Exits 0 once a 2026-07-28 tools/list at port argv[1] lists tools. Sessions share the pooled
# upstream, so this one starts it and the suite's find it up.
UPSTREAM_LISTED='
import json, sys, urllib.request
meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "conformance.sh", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {}}
body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}}
request = urllib.request.Request(
    f"http://127.0.0.1:{sys.argv[1]}/mcp", json.dumps(body).encode(),
    {"content-type": "application/json", "accept": "application/json",
     "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"})
with urllib.request.urlopen(request, timeout=5) as reply:
    sys.exit(not json.load(reply)["result"]["tools"])
'

start_daemon() { # name, upstream JSON
  local port dir=$WORK/$1
  port=$(free_port)
  mkdir -p "$dir/state" "$dir/config" "$dir/cache" # cache: no discovery snapshot of a past run
  mkdir -m 700 "$dir/run" # the daemon uses only a private socket folder (X3)
  echo "{\"mcpServers\": {\"conformance\": $2}}" >"$dir/config.json"
  XDG_STATE_HOME=$dir/state XDG_CONFIG_HOME=$dir/config XDG_RUNTIME_DIR=$dir/run \
    XDG_CACHE_HOME=$dir/cache \
    "$PY" -m mcpool daemon --socket "$dir/run/d.sock" --config "$dir/config.json" \
    --http "127.0.0.1:$port" >"$dir/daemon.log" 2>&1 &
  PIDS+=($!)
  wait_listening "$port" "${PIDS[-1]}" "$dir/daemon.log"
  # Until the upstream is up and listed: a session that starts sooner is served without its
  # tools, which arrive by list_changed (by design, for clients that wait no longer than ~1 s),
  # and the suite does not wait for them. What is compared is serving, not a cold start.
  local deadline=$((SECONDS + START_TIMEOUT))
  until "$PY" -c "$UPSTREAM_LISTED" "$port" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      echo "conformance: the $1 upstream did not come up; the daemon's log:" >&2
      cat "$dir/daemon.log" >&2
      exit 2
    fi
    sleep 0.2
  done
  eval "${1^^}_PORT=$port"
}
start_daemon stdio "{\"command\": \"$PY\", \"args\": [\"$SERVER\", \"stdio\"], \"prefix\": false}"
start_daemon http "{\"type\": \"http\", \"url\": \"http://127.0.0.1:$DIRECT_PORT/mcp\", \"prefix\": false}"
# Two suites at once on one pooled stdio upstream (issue 29 item 3), pinned to the handshake era
# so that its sampling and elicitation come as requests that name no call: each must reach the
# suite whose call it belongs to, and each run must give the single run's result.
start_daemon twice "{\"command\": \"$PY\", \"args\": [\"$SERVER\", \"stdio\"], \"prefix\": false, \"protocolVersion\": \"2025-11-25\"}"

# CONFORMANCE_JS: another build of the suite (default: the pinned alpha of .peers).
# SUITE_ARGS: more arguments for it, split as words (e.g. "--scenario server-sse-polling").
run_suite() { # revision, endpoint name, port
  local args=(--spec-version "$1")
  [ "$1" != 2026-07-28 ] || args=(--requirements "$1")
  # shellcheck disable=SC2206
  [ -z "${SUITE_ARGS:-}" ] || args+=(${SUITE_ARGS})
  timeout "$CHECK_TIMEOUT" "$PEER_NODE22" "${CONFORMANCE_JS:-$PEER_CONFORMANCE_ALPHA_JS}" server \
    --url "http://127.0.0.1:$3/mcp" "${args[@]}" -o "$WORK/results/$1/$2" \
    >"$WORK/results/$1/$2.txt" 2>&1 || true
}
for revision in "${REVISIONS[@]}"; do
  mkdir -p "$WORK/results/$revision"
  # The stdio upstream is a process of its own: that run goes side by side with the direct one.
  # The HTTP upstream is the direct run's server, whose test tools change its lists: that run
  # goes after, so that the two runs' changes do not cancel out under each other.
  run_suite "$revision" stdio "$STDIO_PORT" &
  stdio_run=$!
  run_suite "$revision" direct "$DIRECT_PORT"
  run_suite "$revision" http "$HTTP_PORT"
  wait "$stdio_run"
  if [ "$revision" != 2026-07-28 ]; then
    run_suite "$revision" twice-a "$TWICE_PORT" &
    twice_run=$!
    run_suite "$revision" twice-b "$TWICE_PORT"
    wait "$twice_run"
  fi
done

status=0
KNOWN=$KNOWN "$PY" "$REPO/tools/conformance_table.py" "$WORK/results" "${REVISIONS[@]}" || status=$?
# What the suite does is what clients do: a daemon that logged an error while serving it (a
# traceback, a failed request) fails the run too, whatever the checks said.
for name in stdio http twice; do
  log=$WORK/$name/state/mcpool/daemon.log
  if [ -f "$log" ] && grep -q '"level": "error"' "$log"; then
    echo "ERRORS logged by the $name daemon:"
    grep '"level": "error"' "$log" | cut -c1-400
    status=1
  fi
done
exit $status
