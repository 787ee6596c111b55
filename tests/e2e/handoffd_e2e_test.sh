#!/usr/bin/env bash
# Runs tests/e2e/handoffd_e2e.py against the real //server:handoffd with Debian's
# python3-grpcio (always /usr/bin/python3: the python3 on PATH may lack it).
set -euo pipefail
handoffd="$1"
proto_dir="$2"
handoffctl="$3"
script="$(dirname "$0")/handoffd_e2e.py"
if ! /usr/bin/python3 -c 'import grpc, grpc_tools' 2>/dev/null; then
  echo "python3-grpcio and python3-grpc-tools are missing: run scripts/setup" >&2
  exit 1
fi
exec /usr/bin/python3 "$script" --handoffd="$handoffd" --proto_dir="$proto_dir" \
  --handoffctl="$handoffctl"
