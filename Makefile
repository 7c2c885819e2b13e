# gorun: the front door. `make demo` and `make test` are all a new user needs.
GO        ?= go
export CGO_ENABLED ?= 0
BIN       := bin
# Packages with goroutines run their tests under the race detector (it needs cgo).
RACE_DIRS := rank mpirun collective fusion metrics half data cmd/gorun
RACE_PKGS := $(foreach d,$(RACE_DIRS),$(if $(wildcard $(d)/*.go),./$(d)/...))
empty     :=
space     := $(empty) $(empty)
RACE_RE   := /($(subst $(space),|,$(RACE_DIRS)))(/|$$)
NP        ?= 2

.PHONY: all build test vet fmt-check bench demo ring-demo clean hosts-up hosts-down cuda-toolchain ptx ptx-check

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -buildvcs=auto -o $(BIN)/ ./cmd/... ./examples/...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# vet, and a build for macOS (the launcher and the CPU trainer build there;
# shared memory is Linux only; only Linux is tested).
vet:
	$(GO) vet ./...
	GOOS=darwin GOARCH=arm64 $(GO) build ./...

# All tests: formatting, vet, the race detector on the concurrent packages,
# then every other package's tests (the race-tested ones are not run twice),
# then the multi-host tests on their own. Each go test's output goes through
# testsummary: what plain go test prints, then every skipped test and why.
TESTSUM := $(GO) run ./internal/tools/testsummary
test: ptx-check fmt-check vet build
	CGO_ENABLED=1 $(GO) test -json -race -count=1 -timeout 15m $(RACE_PKGS) | $(TESTSUM)
	$(GO) test -json -count=1 -timeout 20m $$($(GO) list ./... | grep -v -E '$(RACE_RE)' | grep -v -E '/test/(multihost|slurm)') | $(TESTSUM)
	@# Hosts in network namespaces (root; skipped with a reason otherwise). Alone, because
	@# one of them asserts >= 90 % of a shaped link's bandwidth, which CPU contention breaks.
	$(GO) test -json -count=1 -timeout 10m ./test/multihost/... | $(TESTSUM)
	@# A real Slurm (slurmctld, a slurmd and munged per test host; root, slurm-wlm and munge;
	@# skipped with a reason otherwise), alone for the same reason.
	$(GO) test -json -count=1 -timeout 10m ./test/slurm/... | $(TESTSUM)

# The CUDA kernels (docs/cuda.md): nvcc from Debian's nvidia-cuda-toolkit 11.8, unpacked
# into ~/.cache/gorun/cuda-11.8 (no system install); kernels.cu compiled to the committed
# PTX in kernels/cuda/ptx; the check fails when that PTX is stale, and where the toolchain
# is present rebuilds it (byte for byte) and assembles it for sm_70, sm_80 and sm_90 with
# ptxas -v: every kernel within its __launch_bounds__, no spills in the hot kernels.
cuda-toolchain:
	@bash kernels/cuda/toolchain.sh

ptx:
	@bash kernels/cuda/ptx.sh build

ptx-check:
	@bash kernels/cuda/ptx.sh check

# Benchmarks print numbers (docs/performance.md); they assert nothing.
bench: build
	$(GO) test -run '^$$' -bench . -benchtime 3x ./bench/...

# The main job on the built-in corpus: 2 local ranks, tiny preset, ~1-3 minutes on 2 cores.
demo: build
	rm -rf runs/demo
	$(BIN)/gorun -np $(NP) $(BIN)/nmt-train train --config configs/demo.yaml

# The launcher's own example: a token around a ring of 4 ranks, then a barrier.
ring-demo: build
	$(BIN)/gorun -np 4 $(BIN)/ring

# Test hosts in network namespaces (root): HOSTS=2 LINK="rate 1gbit loss 0%" make hosts-up
hosts-up:
	test/hosts/up.sh

hosts-down:
	test/hosts/down.sh

# A real Slurm on test hosts (root; slurm-wlm and munge): slurmctld here, a slurmd per host.
# HOSTS=2 make slurm-up; export SLURM_CONF=test/slurm/run/slurm.conf; sbatch examples/slurm/train.sbatch
.PHONY: slurm-up slurm-down
slurm-up:
	test/slurm/up.sh

slurm-down:
	test/slurm/down.sh

clean:
	rm -rf $(BIN)
