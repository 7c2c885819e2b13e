#!/usr/bin/env bash
# Builds, on a machine with Go, everything bench/gpu/run.sh needs on a GPU
# machine that has no Go and no network: static binaries (CGO_ENABLED=0; the
# CUDA libraries are found at run time) and the test binaries of the CUDA
# backend and the benchmarks, packed into .gpu/gpu.tar.gz (ignored by git;
# carry `.gpu`). GPU_OUT=DIR writes DIR/gpu.tar.gz instead (the dry run,
# bench/gpu/dryrun_test.go).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${GPU_OUT:-.gpu}
rm -rf "$out/pkg" "$out/gpu.tar.gz" && mkdir -p "$out/pkg/bin"
export CGO_ENABLED=0
flags=(-trimpath -buildvcs=auto -ldflags=-s\ -w)
go build "${flags[@]}" -o "$out/pkg/bin/" ./cmd/...
go test -c "${flags[@]}" -o "$out/pkg/cuda.test" ./kernels/cuda
go test -c "${flags[@]}" -o "$out/pkg/bench.test" ./bench
git rev-parse --short HEAD > "$out/pkg/COMMIT" 2>/dev/null || echo unknown > "$out/pkg/COMMIT"
git diff --quiet HEAD -- 2>/dev/null || sed -i 's/$/ (with uncommitted changes)/' "$out/pkg/COMMIT"
tar -C "$out/pkg" -czf "$out/gpu.tar.gz" .
rm -rf "$out/pkg"
ls -la "$out/gpu.tar.gz"
