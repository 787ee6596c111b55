#!/usr/bin/env bash
# Runs hostile_rpc_e2e.py against the real //server:handoffd (Debian's python3-grpcio).
set -euo pipefail
if ! /usr/bin/python3 -c 'import grpc, grpc_tools' 2>/dev/null; then
  echo "python3-grpcio and python3-grpc-tools are missing: run scripts/setup" >&2
  exit 1
fi
exec /usr/bin/python3 "$(dirname "$0")/hostile_rpc_e2e.py" --handoffd="$1" --proto_dir="$2"
