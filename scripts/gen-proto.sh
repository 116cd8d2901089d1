#!/usr/bin/env bash
# Regenerate the Python stubs of proto/*.proto into one place: the wire package (wire/*_pb2*.py).
#   scripts/gen-proto.sh [OUTDIR]   (default wire; tests call it with a temp dir)
# grpc_tools writes absolute imports ("import cri_pb2"); they are made package-relative so
# the stubs live inside the wire package without touching sys.path. wire/__init__.py is
# hand-written (the package holds more than stubs), so it is not generated. gRPC stubs (*_pb2_grpc.py)
# only for the protos that declare a gRPC service: nri.proto and ttrpc.proto travel over ttrpc.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$here/wire}
py=${PYTHON:-python3}
case $py in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac  # relative to the caller's dir
mkdir -p "$out"
cd "$here/proto"
"$py" -m grpc_tools.protoc -I. --python_out="$out" --pyi_out="$out" ./*.proto
mapfile -t grpc_protos < <(grep -l '^service ' ./*.proto)
"$py" -m grpc_tools.protoc -I. --grpc_python_out="$out" "${grpc_protos[@]}"
for f in "$out"/*_pb2_grpc.py "$out"/*_pb2.py; do
  sed -i -E 's/^import ([a-z0-9_]+_pb2) as /from . import \1 as /' "$f"
done
