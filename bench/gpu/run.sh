#!/usr/bin/env bash
# The one-call GPU check (docs/cuda.md, "Running on a GPU"). Runs on the GPU
# machine, in the repository root, after bench/gpu/build.sh made
# .gpu/gpu.tar.gz here:
#
#   bench/gpu/build.sh
#   # then, on the GPU machine (the device tool: carry .gpu):
#   BUDGET=570 bash bench/gpu/run.sh
#
# GROUPS run in the order named; none named is all five in this order:
# check train bench torch net. Each step has its own time limit and none
# stops the others. BUDGET=S fits the whole call into S seconds: a step's
# limit is cut to what is left (less 20 s to pack the results) and a step
# with under 20 s left is skipped, so one 10-minute device call (timeout_s
# 600) runs as much as fits and always brings its results back. Without
# BUDGET, each group's limits add up to under 10 minutes. A test step that
# fails (conform, step, and the training runs) runs once more with
# CUDA_LAUNCH_BLOCKING=1, its failed tests only, as NAME-blocking: a
# kernel's fault is then reported by the launch that caused it.
#
# Steps:
#   env          the GPU, driver, CPU (and the features gorun uses: --version),
#                libraries gorun finds, compute-sanitizer (every call)
#   check:
#     sanitize-small  the conformance table's Scale and Axpy under
#                compute-sanitizer (memcheck), where the machine has it: does
#                it run here at all (on gVisor it refuses the device)?
#     conform    every backend op on the GPU against float64 references, in
#                fp32, fp16, bf16 and tf32: under compute-sanitizer when the
#                small case ran under it, else plainly
#     step       a Transformer training step against the CPU backend, the
#                host staging path, the allocator, the PTX the device loaded,
#                cuBLAS on a thread without the context, the profiler
#     tiny-np1   nmt-train on the built-in corpus, tiny preset, 1 rank on the GPU
#     tiny-np2   the same with 2 ranks sharing the GPU (gradients through the mesh)
#     translate  beam search from the tiny run's checkpoint on the GPU
#     interop    the tiny run's checkpoint read with Python's safetensors, its
#                event file with TensorBoard's loader (bench/gpu/interop.py)
#   train:
#     base       Transformer-base (the lab's model) for 300 steps
#   bench:
#     gorun-fp16, -bf16, -fp32  Transformer-base steps (bench/device_test.go) on
#                the batch shapes torch_transformer.py --dump-batches gives
#     gorun-prof  5 fp16 steps of the 25000-token batches with GORUN_CUDA_PROFILE=1:
#                the GPU time of every kernel, GEMM and copy, largest first
#   torch:
#     torch-check, torch  PyTorch's Transformer-base on the same GPU and shapes
#                (bench/peers/torch_transformer.py, docs/gpu-bench.md): a quick
#                self-check, then the sweep -> torch.jsonl
#   net (no GPU needed; issue 18's 16-core measurement; about 3 minutes):
#     net-tcp-npN, net-quic-npN  allreduce-perf -a ring on loopback, N = 2, 4,
#                8 ranks, each with cores/N cores, TLS/TCP and QUIC forced and
#                GORUN_SHM=0 (ranks on one host use shared memory otherwise),
#                1-256 MiB, -S 5
#     net-quic-np2-nogro  np 2 over QUIC received without UDP_GRO
#                (GORUN_QUIC_GRO=off), beside net-quic-np2's GRO
#     net-tcp-np2-aesgcm  np 2 over TLS/TCP with the records sealed by AES-128-GCM
#                (GORUN_TCP_CIPHER=aes-gcm), beside the default's AEGIS-128X4
#                where the CPU has VAES on AVX-512 (the transport line says which)
#     net-tcp-np2-1core  the same, one core per rank (GOMAXPROCS=1)
#     net-quic-np2-conns8, net-tcp-np2-conns8  np 2 with 8 connections (QUIC)
#                or lanes (TLS/TCP) and 8 rings per peer pair
#                (GORUN_CONNS_PER_PEER=8 GORUN_RINGS=8): scaling with cores
#     net-gloo-npN  torch gloo on loopback (bench/peers/gloo_allreduce.py;
#                PYTHON names the interpreter, python3 by default)
#
# Results: bench/gpu/results/<date>/ ($GPU_RESULTS/<date>/ when set; and,
# where the device tool sets OUT,
# copied to $OUT, which is what comes back): summary.txt (a line per step,
# then what did not run: skipped for the budget, or not reached), rewritten
# after every step, so a call cut off still says what ran; results.tar.gz
# (logs, metrics, reports, GPU profile), also rewritten after every step;
# torch.jsonl.
#
# QUICK=1 (the dry run, bench/gpu/dryrun_test.go, part of make test) runs the
# same steps in the same order, each on sizes the CPU emulator manages: 3
# training steps of the tiny preset, the tiny preset's benchmark on 256- and
# 512-token batches, 1 MiB all-reduces. GPU_TARBALL names the package
# (default .gpu/gpu.tar.gz).
set -uo pipefail
groups=${*:-check train bench torch net}
for g in $groups; do
	case $g in check | train | bench | torch | net) ;; *)
		echo "run.sh: unknown group '$g' (want check, train, bench, torch or net)" >&2
		exit 2
		;;
	esac
done
case ${BUDGET:-0} in *[!0-9]*)
	echo "run.sh: BUDGET=${BUDGET} is not a whole number of seconds" >&2
	exit 2
	;;
esac
t_start=$(date +%s)
cd "$(dirname "$0")/../.."
root=$(pwd)
stamp=$(date -u +%Y%m%dT%H%M%SZ)
res=${GPU_RESULTS:-$root/bench/gpu/results}/$stamp
mkdir -p "$res" || exit 2
out=${OUT:-}
work=$(mktemp -d)
logs=$work/logs
mkdir -p "$logs"
summary=$res/summary.txt
quick=${QUICK:-}
pkg=${GPU_TARBALL:-.gpu/gpu.tar.gz}

# The summary: the header, a line per step run (or skipped), and what has
# not run, rewritten after every step.
header=$work/header
lines=$work/lines
planned=$work/planned
done_=$work/done
skipped=$work/skipped
: >"$lines"
: >"$planned"
: >"$done_"
: >"$skipped"
failed=0
# write_summary [WHY]: with WHY (the end, or why it came early), the last
# line names every planned step that did not run: skipped for the budget,
# or not reached (WHY); before the end, what has not run yet.
write_summary() {
	local final=${1:-} skip unreached
	skip=$(grep -xF -f "$skipped" "$planned" | paste -sd ' ')
	unreached=$(cat "$done_" "$skipped" | grep -vxF -f - "$planned" | paste -sd ' ')
	{
		cat "$header"
		cat "$lines"
		if [ -z "$skip$unreached" ]; then
			echo "not run: none"
		elif [ -z "$final" ]; then
			echo "not run yet: $unreached${skip:+ (skipped for the budget: $skip)}"
		else
			echo "not run: $skip${skip:+ (skipped for the budget)}${skip:+${unreached:+; }}$unreached${unreached:+ ($final)}"
		fi
	} >"$summary.tmp" && mv "$summary.tmp" "$summary"
	[ -n "$out" ] && cp "$summary" "$out/summary.txt" 2>/dev/null
	return 0
}
say() { echo "$*" | tee -a "$lines"; }

echo "gorun GPU check $stamp, groups: $groups${BUDGET:+, budget ${BUDGET} s}${quick:+, QUICK (sizes for the emulator)}" >"$header"
if ! tar -C "$work" -xzf "$pkg"; then
	echo "no $pkg: run bench/gpu/build.sh first" >>"$header"
	write_summary "no package"
	cat "$summary"
	exit 2
fi
sed -i "1s/\$/, commit $(cat "$work/COMMIT")/" "$header"
cat "$header"
bin=$work/bin
runs=$work/runs

# pack: results.tar.gz (logs, metrics, reports) as they are now, after every
# step, so that a call cut off still brings back what ran
pack() {
	(cd "$work" && tar -czf "$res/results.tar.gz.tmp" logs $(find runs -name '*.jsonl' -o -name '*.md' -o -name '*.png' \
		-o -name 'gpu-profile.txt' -o -name 'run.json' 2>/dev/null)) &&
		mv "$res/results.tar.gz.tmp" "$res/results.tar.gz"
	if [ -n "$out" ]; then
		cp "$res/results.tar.gz" "$out/" 2>/dev/null
		[ -f "$res/torch.jsonl" ] && cp "$res/torch.jsonl" "$out/" 2>/dev/null
	fi
	return 0
}

# step NAME LIMIT_S CMD...: runs CMD with a time limit (cut to the budget),
# its output in logs/NAME.log, and one line in the summary. With plan set it
# only names the step (the plan of what is to run).
plan=""
last_rc=0
step() {
	local name=$1 limit=$2
	shift 2
	if [ -n "$plan" ]; then
		echo "$name" >>"$planned"
		return 0
	fi
	if [ -n "${BUDGET:-}" ]; then
		local left=$((BUDGET - ($(date +%s) - t_start) - 20))
		if [ "$left" -lt 20 ]; then
			echo "$name" >>"$skipped"
			say "$(printf '%-18s skipped: %s s of the budget left' "$name" "$((left + 20))")"
			last_rc=125
			write_summary
			return 0
		fi
		[ "$left" -lt "$limit" ] && limit=$left
	fi
	echo "$name" >>"$done_"
	local t0=$(date +%s)
	timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1
	last_rc=$?
	[ $last_rc -ne 0 ] && failed=1
	local why=""
	[ $last_rc -eq 124 ] && why="(time limit ${limit} s) "
	say "$(printf '%-18s rc=%-3s %4ss  %s%s' "$name" "$last_rc" "$(($(date +%s) - t0))" "$why" "$(tail -n 1 "$logs/$name.log" | cut -c1-150)")"
	pack
	write_summary
	return 0
}

# failed_tests LOG: the top-level tests a go test log says failed, as a
# -test.run pattern (empty when it names none: a crash or a time limit).
failed_tests() {
	local names
	names=$(grep -oE '^--- FAIL: [A-Za-z0-9_]+' "$1" | awk '{print $3}' | sort -u | paste -sd '|')
	[ -n "$names" ] && echo "^($names)\$"
}

# gotest NAME LIMIT RUN [SANITIZER...]: the CUDA backend's tests matching RUN
# (go test's -test.run) on the GPU, under the sanitizer command when one is
# given; when they fail, once more with CUDA_LAUNCH_BLOCKING=1, without the
# sanitizer, only the tests that failed, as NAME-blocking.
gotest() {
	local name=$1 limit=$2 run=$3
	shift 3
	step "$name" "$limit" env GORUN_CUDA_TEST_DEVICE="${GORUN_CUDA_TEST_DEVICE:-gpu}" "$@" "$work/cuda.test" \
		-test.run "$run" -test.v -test.count=1 -test.timeout "${limit}s"
	[ -n "$plan" ] || [ $last_rc -eq 0 ] || [ $last_rc -eq 125 ] || {
		local again
		again=$(failed_tests "$logs/$name.log")
		step "$name-blocking" "$limit" env CUDA_LAUNCH_BLOCKING=1 GORUN_CUDA_TEST_DEVICE="${GORUN_CUDA_TEST_DEVICE:-gpu}" \
			"$work/cuda.test" -test.run "${again:-$run}" -test.v -test.count=1 -test.timeout "${limit}s"
	}
}

# rerun NAME LIMIT CMD...: step, and once more with CUDA_LAUNCH_BLOCKING=1
# as NAME-blocking when it fails.
rerun() {
	local name=$1 limit=$2
	shift 2
	step "$name" "$limit" "$@"
	[ -n "$plan" ] || [ $last_rc -eq 0 ] || [ $last_rc -eq 125 ] ||
		step "$name-blocking" "$limit" env CUDA_LAUNCH_BLOCKING=1 "$@"
}

n() { if [ -n "$quick" ]; then echo 3; else echo "$1"; fi; }

# The sizes: the GPU's, or QUICK's for the emulator.
if [ -n "$quick" ]; then
	tiny_extra=(--batch-tokens 256 --synthetic-lines 2000 --eval-sentences 4 --eval-max-length 12 --decode-extra 4)
	base_args=(--preset tiny --synthetic-lines 2000 --batch-tokens 256 --eval-max-length 12 --decode-extra 4)
	bench_preset=tiny bench_vocab=1000 bench_tokens=128,256 bench_steps=2 bench_times=2x prof_tokens=256
	ar_sizes=(-b 1M -e 1M -n 5 -w 1 -t 30s) gloo_sizes=(--budget 0.1 --sizes 1048576)
else
	tiny_extra=()
	base_args=(--preset base --synthetic-lines 200000 --batch-tokens 8192)
	bench_preset=base bench_vocab=32768 bench_tokens=4096,12288,25000 bench_steps=20 bench_times=20x prof_tokens=25000
	ar_sizes=(-b 1M -e 256M -n 10 -w 2 -t 60s) gloo_sizes=(--budget 1 --sizes 1048576 4194304 16777216 67108864 268435456)
fi

# compute-sanitizer, where the machine has it
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
	/opt/nvidia/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)
san=()
[ -n "$sanitizer" ] && san=("$sanitizer" --tool memcheck --error-exitcode 86 --print-limit 50)

check() {
	if [ -n "$sanitizer" ]; then
		# does it run here at all? Two small ops of the table first
		step sanitize-small 60 env GORUN_CUDA_TEST_DEVICE="${GORUN_CUDA_TEST_DEVICE:-gpu}" "${san[@]}" "$work/cuda.test" \
			-test.run '^TestConformance$/^(Scale|Axpy)$' -test.v -test.count=1
	fi
	local under=()
	if [ -z "$plan" ] && [ -n "$sanitizer" ] && grep -q 'ERROR SUMMARY' "$logs/sanitize-small.log" 2>/dev/null; then
		under=("${san[@]}") # it ran to its summary: the whole table under it
	fi
	gotest conform 200 '^TestConformance$' "${under[@]}"
	gotest step 90 '^(TestDeviceName|TestPTXForDevice|TestTransformerStepMatchesCPU|TestHostStagingRoundTrip|TestAllocatorReuses|TestCublasOnAThreadWithoutContext|TestBlockingSyncFallback|TestOrthonormalizeRefuses|TestProfileNamesEveryOp|TestDryRunRerun)$'
	rerun tiny-np1 100 "$bin/gorun" -np 1 "$bin/nmt-train" train --config configs/demo.yaml --device cuda \
		--max-steps "$(n 300)" "${tiny_extra[@]}" --run-dir "$runs/tiny-np1"
	rerun tiny-np2 100 "$bin/gorun" -np 2 "$bin/nmt-train" train --config configs/demo.yaml --device cuda \
		--max-steps "$(n 200)" "${tiny_extra[@]}" --run-dir "$runs/tiny-np2"
	step translate 30 bash -c "printf 'la gana vomego beto .\n' | '$bin/nmt-train' translate --device cuda --run-dir '$runs/tiny-np1'"
	step interop 40 python3 bench/gpu/interop.py "$runs/tiny-np1"
}
train() {
	rerun base 420 "$bin/gorun" -np 1 "$bin/nmt-train" train "${base_args[@]}" --device cuda \
		--max-steps "$(n 300)" --log-every 25 --eval-every 0 --eval-sentences 100 --checkpoint-every 0 \
		--run-dir "$runs/base"
}
bench() {
	# the same batch shapes for gorun and PyTorch (the dump needs no torch)
	[ -n "$plan" ] || python3 bench/peers/torch_transformer.py --dump-batches "$work/batches.jsonl" --batch-tokens "$bench_tokens" \
		--steps "$bench_steps" >"$logs/batches.log" 2>&1
	local p
	for p in fp16 prof bf16 fp32; do
		if [ $p = prof ]; then
			# where the GPU's time goes: every kernel, GEMM and copy of 5
			# steps of the largest batches timed between CUDA events
			step gorun-prof 90 env GORUN_CUDA_PROFILE=1 GORUN_BENCH_DEVICE=cuda GORUN_BENCH_PRECISION=fp16 \
				GORUN_BENCH_PRESET=$bench_preset GORUN_BENCH_VOCAB=$bench_vocab GORUN_BENCH_BATCHES="$work/batches.jsonl" "$work/bench.test" -test.run '^$' \
				-test.bench "TrainStepDevice/$bench_preset/fp16/tokens=$prof_tokens\$" -test.benchtime 5x -test.v
			continue
		fi
		step gorun-$p 150 env GORUN_BENCH_DEVICE=cuda GORUN_BENCH_PRECISION=$p GORUN_BENCH_PRESET=$bench_preset GORUN_BENCH_VOCAB=$bench_vocab \
			GORUN_BENCH_BATCHES="$work/batches.jsonl" "$work/bench.test" -test.run '^$' -test.bench TrainStepDevice \
			-test.benchtime "$bench_times"
	done
}
torch() {
	step torch-check 120 python3 bench/peers/torch_transformer.py --self-check
	step torch 300 python3 bench/peers/torch_transformer.py --sweep --json "$res/torch.jsonl"
}
net() {
	# brief FILE LABEL COLUMN: one line, busbw by size (GB/s, the medians in
	# COLUMN of FILE's rows). ar and gl print their rows as they come, so a
	# step cut off at its limit still leaves the sizes it finished in its log.
	brief() {
		awk -v t="$2" -v c="$3" '{ sub(/^\[0\] */, "") } $1 ~ /^[0-9]+$/ { l = l " " $1 / 1048576 "M " $c }
			END { print "busbw GB/s (" t "):" l }' "$1"
	}
	# shown LABEL COLUMN CMD...: CMD's output as it comes, then brief's
	# line; CMD's exit status
	shown() {
		local f rc
		f=$(mktemp)
		"${@:3}" 2>&1 | tee "$f"
		rc=${PIPESTATUS[0]}
		brief "$f" "$1" "$2"
		rm -f "$f"
		return $rc
	}
	ar() {
		shown "$2" 8 "$bin/gorun" -np "$1" -x GORUN_SHM=0 "${@:3}" "$bin/allreduce-perf" -a ring -f 4 -S 5 -I 0 -c 1 \
			"${ar_sizes[@]}"
	}
	gl() {
		shown gloo 7 "${PYTHON:-python3}" bench/peers/gloo_allreduce.py --np "$1" --timeout 45 "${gloo_sizes[@]}"
	}
	export -f brief shown ar gl
	export bin
	# the sizes travel as words (bash exports no arrays)
	export ar_sizes_s="${ar_sizes[*]}" gloo_sizes_s="${gloo_sizes[*]}"
	local sizes='ar_sizes=($ar_sizes_s); gloo_sizes=($gloo_sizes_s);' pre
	pre="$sizes ar \"\$@\""
	# limits add up to 590 s, inside one device call
	local np c
	for np in 2 4 8; do
		c="$np ranks on $(nproc) cores"
		step net-tcp-np$np 40 bash -c "$pre" _ "$np" "TLS/TCP, $c" -x GORUN_TRANSPORT=tcp
		step net-quic-np$np 50 bash -c "$pre" _ "$np" "QUIC, $c" -x GORUN_TRANSPORT=quic
		step net-gloo-np$np 45 bash -c "$sizes gl \"\$@\"" _ "$np"
	done
	# one peer pair over more connections and rings: does QUIC (one
	# goroutine per quic-go connection) or TLS/TCP scale with the cores?
	step net-quic-np2-conns8 40 bash -c "$pre" _ 2 "QUIC, 8 connections and 8 rings per peer pair, 2 ranks on $(nproc) cores" -x GORUN_TRANSPORT=quic -x GORUN_CONNS_PER_PEER=8 -x GORUN_RINGS=8
	step net-tcp-np2-conns8 35 bash -c "$pre" _ 2 "TLS/TCP, 8 lanes and 8 rings per peer pair, 2 ranks on $(nproc) cores" -x GORUN_TRANSPORT=tcp -x GORUN_CONNS_PER_PEER=8 -x GORUN_RINGS=8
	step net-quic-np2-nogro 30 bash -c "$pre" _ 2 "QUIC received one datagram at a time (GORUN_QUIC_GRO=off), 2 ranks on $(nproc) cores" -x GORUN_TRANSPORT=quic -x GORUN_QUIC_GRO=off
	step net-tcp-np2-aesgcm 40 bash -c "$pre" _ 2 "TLS/TCP sealed with AES-128-GCM, 2 ranks on $(nproc) cores" -x GORUN_TRANSPORT=tcp -x GORUN_TCP_CIPHER=aes-gcm
	step net-tcp-np2-1core 40 bash -c "$pre" _ 2 "TLS/TCP, GOMAXPROCS=1" -x GORUN_TRANSPORT=tcp -x GOMAXPROCS=1
}

env_step() {
	step env 30 bash -c 'nvidia-smi; uname -a; lscpu | grep -E "Model name|^CPU\(s\)"; "$1" --version; ls /usr/local/nvidia/lib64 2>/dev/null | head
		echo "compute-sanitizer: ${2:-none found}"
		python3 -c "import torch; print(\"torch\", torch.__version__, torch.version.cuda)"; echo ok' _ "$bin/allreduce-perf" "$sanitizer"
}

# the plan: every step the groups will run, in order
plan=1
env_step
for g in $groups; do
	$g
done
plan=""
finish() {
	trap - EXIT INT TERM
	write_summary "${1:-not reached}"
	pack
}
trap 'finish "the call was stopped"; exit 130' INT TERM
trap 'finish' EXIT
write_summary

env_step
for g in $groups; do
	$g
done
nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv >>"$logs/env.log" 2>&1
finish
cat "$summary" | tail -n 1
echo "results: $res${out:+ (and $out)}"
rm -rf "$work"
exit $failed
