#!/usr/bin/env bash
# Regenerate the Python stubs of proto/*.proto into one place: runtimeproxy/api/.
#   scripts/gen-proto.sh [OUTDIR]   (default runtimeproxy/api; tests call it with a temp dir)
# grpc_tools writes absolute imports ("import cri_pb2"); they are made package-relative so
# the stubs live inside the runtimeproxy.api package without touching sys.path.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$here/runtimeproxy/api}
py=${PYTHON:-python3}
mkdir -p "$out"
cd "$here/proto"
"$py" -m grpc_tools.protoc -I. --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" ./*.proto
for f in "$out"/*_pb2_grpc.py "$out"/*_pb2.py; do
  sed -i -E 's/^import ([a-z0-9_]+_pb2) as /from . import \1 as /' "$f"
done
[ -f "$out/__init__.py" ] || printf '"""Generated protobuf and gRPC stubs (make proto). Do not edit."""\n' > "$out/__init__.py"
