#!/usr/bin/env bash
# Runs tests/e2e/sink_tls_e2e.py with Debian's python3-grpcio (/usr/bin/python3).
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/sink_tls_e2e.py" --handoffd="$1" --provider_sim="$2" \
  --sample_sink="$3" --proto_dir="$4"
