#!/usr/bin/env bash
# Builds every GPU test binary (and the commands the device runs) into .gpu/
# with CGO_ENABLED=0, for a GPU machine that has no Go toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu
export CGO_ENABLED=0
go test -c -ldflags='-s -w' -o .gpu/driver.test ./kernels/cuda/driver
go test -c -ldflags='-s -w' -o .gpu/cuda.test ./attention/mla/cuda
go test -c -ldflags='-s -w' -o .gpu/tests.test ./tests
go test -c -ldflags='-s -w' -o .gpu/cublaslt.test ./kernels/cuda/cublaslt
# A trace with MTP steps whose drafts are partly rejected (accept lists).
go run ./cmd/decode/gentrace --mtp 3 --accept -o .gpu/accept.jsonl
go run ./cmd/decode/gentrace --chain --mtp 3 --accept --steps-min 10 --steps-max 30 --long 2 -o .gpu/accept-chain.jsonl
for cmd in decode bench mkcheckpoint; do
	if [ -d "cmd/$cmd" ]; then go build -ldflags='-s -w' -o ".gpu/$cmd" "./cmd/$cmd"; fi
done
cp scripts/run-gpu-tests.sh .gpu/
ls -la .gpu
