#!/bin/bash
# Installs the proxies the benchmarks compare against, from the registries, into the git-ignored
# .peers/bench/ (or DIR), and a profiler. Idempotent: an install whose marker matches is kept.
#
#   tools/bench/peers.sh [DIR]
#
# DIR/env.sh then exports:
#   BENCH_MCP_PROXY     mcp-proxy (PyPI): `mcp-proxy --port P -- CMD ARGS` serves a stdio server
#                       over SSE/streamable HTTP; `mcp-proxy URL` is its stdio client
#   BENCH_SUPERGATEWAY  supergateway (npm): `node $BENCH_SUPERGATEWAY --stdio "CMD" --outputTransport
#                       streamableHttp --port P`; `--streamableHttp URL` is its stdio client
#   BENCH_MCP_HUB       mcp-hub (npm): `node $BENCH_MCP_HUB --port P --config FILE`; unified
#                       streamable-HTTP endpoint at /mcp
#   BENCH_PY_SPY        py-spy, for tools/bench/profile.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(realpath -m "${1:-$HERE/../../.peers/bench}")
STAMP="mcp-proxy==0.13.0 py-spy==0.4.3 supergateway@4.0.0 mcp-hub@4.2.1"
if [ -f "$DIR/env.sh" ] && [ "$(cat "$DIR/.stamp" 2>/dev/null)" = "$STAMP" ]; then
  exit 0
fi
mkdir -p "$DIR"
[ -x "$DIR/venv/bin/python" ] || python3 -m venv "$DIR/venv"
"$DIR/venv/bin/pip" install -q --disable-pip-version-check mcp-proxy==0.13.0 py-spy==0.4.3
npm install --silent --no-audit --no-fund --prefix "$DIR/npm" supergateway@4.0.0 mcp-hub@4.2.1 >/dev/null
N=$DIR/npm/node_modules
SG=$(cd "$N/supergateway" && node -p "const p=require('./package.json'); typeof p.bin==='string'?p.bin:Object.values(p.bin)[0]")
HUB=$(cd "$N/mcp-hub" && node -p "const p=require('./package.json'); typeof p.bin==='string'?p.bin:Object.values(p.bin)[0]")
cat > "$DIR/env.sh" <<ENV
export BENCH_MCP_PROXY=$DIR/venv/bin/mcp-proxy
export BENCH_SUPERGATEWAY=$(realpath "$N/supergateway/$SG")
export BENCH_MCP_HUB=$(realpath "$N/mcp-hub/$HUB")
export BENCH_PY_SPY=$DIR/venv/bin/py-spy
ENV
echo "$STAMP" > "$DIR/.stamp"
echo "bench peers installed in $DIR"
