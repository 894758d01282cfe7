#!/bin/bash
# Installs the third-party MCP peers (tools/install-peers.sh, pinned) into the repo's git-ignored
# .peers/ (or DIR), and does nothing when that install is current: env.sh exists and the marker
# holds the checksum of the install.sh that produced it (a changed install.sh reinstalls).
#
#   tools/peers.sh [DIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# The project carries its own installer: nothing outside the checkout is needed.
INSTALL=$HERE/install-peers.sh
DIR=$(realpath -m "${1:-$HERE/../.peers}")
MARKER=$DIR/.install-sha256
[ -f "$INSTALL" ] || { echo "peers.sh: $INSTALL not found" >&2; exit 1; }
SUM=$(sha256sum "$INSTALL" | cut -d' ' -f1)
if [ -f "$DIR/env.sh" ] && [ "$(cat "$MARKER" 2>/dev/null)" = "$SUM" ]; then
  echo "peers: up to date in $DIR"
  exit 0
fi
echo "peers: installing into $DIR (npm and pip; takes a minute)"
# install.sh prints its own summary line; keep ours the only one, errors still reach stderr.
bash "$INSTALL" "$DIR" >/dev/null
echo "$SUM" > "$MARKER"
