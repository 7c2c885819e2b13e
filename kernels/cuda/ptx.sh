#!/usr/bin/env bash
# Builds and checks the PTX of the CUDA kernels (kernels/cuda/kernels.cu).
#
#   ptx.sh build   (make ptx)        compile kernels.cu for compute_70 and
#                                    compute_80 into kernels/cuda/ptx/ (committed,
#                                    embedded by Go), assemble each with ptxas,
#                                    write kernels/cuda/ptx/STAMP
#   ptx.sh check   (make ptx-check)  fail if STAMP does not match the sources and
#                                    the PTX; where the toolchain is present, also
#                                    rebuild and require byte-identical PTX, and
#                                    assemble it for sm_70, sm_80 and sm_90
#   ptx.sh regs FILE.ptx SM [part]   the register check alone, on any PTX
#                                    (part: some of the kernels only)
#
# Registers and launch sizes: build and check run ptxas -v on every PTX for
# each machine it is for (sm_70; sm_80 and sm_90) and fail when a kernel
# has no .maxntid (every kernel declares its largest block as its
# __launch_bounds__: GR_FLAT_THREADS, GR_ROW_THREADS, GR_COL_THREADS or
# GR_MAT_THREADS, which the Go side's launch table in blocks.go repeats and
# a Go test compares with the PTX), when its registers (rounded up to the
# 8 a thread the hardware allocates per warp) times that block exceed the
# 65536 registers of a multiprocessor of compute capability 7.0 to 9.0, or
# when a hot kernel (kernels/cuda/hot_kernels.txt: those a training step
# runs) spills registers to local memory. GORUN_PTXAS_FLAGS adds ptxas
# flags (the Go test of this check passes -maxrregcount to force spills).
#
# The toolchain is the one kernels/cuda/toolchain.sh unpacks (make
# cuda-toolchain) into ${GORUN_CUDA_TOOLCHAIN:-$HOME/.cache/gorun/cuda-11.8},
# else an nvcc on PATH. The host compiler (g++) only preprocesses: nvcc 11.8
# wants gcc <= 11, so it is named with -allow-unsupported-compiler.
set -euo pipefail
cd "$(dirname "$0")/../.."

mode=${1:-}
out=kernels/cuda/ptx
stamp=$out/STAMP
sources=(kernels/cuda/kernels.cu)
# No fast math: IEEE division and square root, no flush to zero; FMA
# contraction on (nvcc's default, as without --use_fast_math).
flags=(-ptx -O3 -std=c++17 -ftz=false -prec-div=true -prec-sqrt=true -fmad=true -Werror all-warnings)
# ptx file, -arch for nvcc, ptxas targets it must assemble for
targets=("kernels_sm70.ptx compute_70 sm_70" "kernels_sm80.ptx compute_80 sm_80,sm_90")
stale="kernels/cuda/ptx is stale: run make cuda-toolchain && make ptx"

# find_toolchain sets nvcc and ptxas, or returns 1.
find_toolchain() {
  local dir=${GORUN_CUDA_TOOLCHAIN:-$HOME/.cache/gorun/cuda-11.8}
  nvcc="" ptxas=""
  # The host compiler is found before PATH gets the toolkit's bin directory,
  # whose g++ is Debian's wrapper for g++-11.
  hostcc=$(command -v g++ || true)
  if [ -x "$dir/usr/lib/nvidia-cuda-toolkit/bin/nvcc" ] && [ -x "$dir/usr/bin/ptxas" ]; then
    nvcc=$dir/usr/lib/nvidia-cuda-toolkit/bin/nvcc
    ptxas=$dir/usr/bin/ptxas
    export PATH=$dir/usr/lib/nvidia-cuda-toolkit/bin:$dir/usr/bin:$PATH
  elif command -v nvcc >/dev/null; then
    nvcc=$(command -v nvcc)
    if [ -x "$(dirname "$nvcc")/ptxas" ]; then
      ptxas=$(dirname "$nvcc")/ptxas
    else
      ptxas=$(command -v ptxas || true)
    fi
    [ -n "$ptxas" ] || return 1
  else
    return 1
  fi
  if [ -z "$hostcc" ]; then
    echo "ptx.sh: nvcc needs a host compiler to preprocess: install g++" >&2
    exit 1
  fi
  version=$("$nvcc" --version | grep -o 'Cuda compilation tools.*' || true)
  [ -n "$version" ] || { echo "ptx.sh: $nvcc --version says no version" >&2; exit 1; }
}

# stamp_body prints the STAMP lines that the files determine.
stamp_body() {
  local f
  for f in "${sources[@]}"; do
    echo "source $(sha256sum <"$f" | cut -d' ' -f1) $f"
  done
  echo "flags ${flags[*]}"
  for t in "${targets[@]}"; do
    set -- $t
    if [ -f "$out/$1" ]; then
      echo "ptx $(sha256sum <"$out/$1" | cut -d' ' -f1) $out/$1"
    else
      echo "ptx missing $out/$1"
    fi
  done
}

# compile_into DIR: the PTX of every target into DIR.
compile_into() {
  local d=$1 t
  for t in "${targets[@]}"; do
    set -- $t
    "$nvcc" -ccbin "$hostcc" -allow-unsupported-compiler "${flags[@]}" -arch="$2" -o "$d/$1" "${sources[0]}" ||
      { echo "ptx.sh: nvcc failed on ${sources[0]} for $2" >&2; return 1; }
  done
}

# assemble_in DIR: ptxas every PTX in DIR for its machines, warnings as
# errors, and check its registers (regcheck).
assemble_in() {
  local d=$1 t sm
  for t in "${targets[@]}"; do
    set -- $t
    for sm in ${3//,/ }; do
      regcheck "$d/$1" "$sm" || return 1
    done
  done
}

# regcheck PTX SM: ptxas -v PTX for SM; fails (naming every kernel at
# fault) on a kernel without .maxntid, registers x .maxntid above 65536, or
# a spill in a hot kernel. Prints one line of what it found.
regcheck() {
  local ptx=$1 sm=$2 part=${3:-} log
  log=$(mktemp)
  # shellcheck disable=SC2086
  if ! "$ptxas" -arch="$sm" -O3 -Werror -v ${GORUN_PTXAS_FLAGS:-} "$ptx" -o /dev/null 2>"$log"; then
    grep -v '^ptxas info\|^    [0-9]* bytes stack' "$log" >&2
    rm -f "$log"
    echo "ptx.sh: ptxas -arch=$sm failed on $ptx" >&2
    return 1
  fi
  local hot=kernels/cuda/hot_kernels.txt
  awk -v sm="$sm" -v ptxname="$ptx" -v hotfile="$hot" -v part="$part" '
    # the hot kernels
    FILENAME == hotfile { sub(/#.*/, ""); if ($1 != "") hot[$1] = 1; next }
    # the PTX: each .entry and the .maxntid among its directives
    FILENAME == ptxname {
      if ($1 == ".entry" || $2 == ".entry" || $3 == ".entry") {
        for (i = 1; i <= NF; i++) if ($i == ".entry") { name = $(i + 1); sub(/\(.*/, "", name) }
        entries[name] = 1; inhead = 1; next
      }
      if (inhead && $1 == ".maxntid") { gsub(/,/, " "); split($0, a, " "); maxntid[name] = a[2] * (a[3] ? a[3] : 1) * (a[4] ? a[4] : 1) }
      if (inhead && $1 == "{") inhead = 0
      next
    }
    # ptxas -v
    /Compiling entry function/ { k = $0; sub(/.*function \047/, "", k); sub(/\047.*/, "", k); next }
    /bytes spill stores/ { stores[k] = $5; loads[k] = $9; stack[k] = $1; next }
    /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($(i + 1) ~ /^registers/) regs[k] = $i; next }
    END {
      bad = 0; n = 0; most = 0
      for (e in entries) {
        n++
        if (!(e in regs)) { printf "ptx.sh: %s: ptxas -v said nothing of %s\n", sm, e > "/dev/stderr"; bad = 1; continue }
        r = regs[e]; if (r > most) { most = r; mostk = e }
        if (!(e in maxntid) || maxntid[e] == 0) {
          printf "ptx.sh: %s: %s has no .maxntid: declare its largest block as __launch_bounds__ (GR_*_THREADS in kernels.cu, the launch table in kernels/cuda/blocks.go)\n", sm, e > "/dev/stderr"; bad = 1; continue
        }
        alloc = int((r + 7) / 8) * 8
        if (alloc * maxntid[e] > 65536) {
          printf "ptx.sh: %s: %s uses %d registers a thread (%d allocated) x %d threads a block = %d > 65536, the register file of a multiprocessor: it cannot launch with that block\n", sm, e, r, alloc, maxntid[e], alloc * maxntid[e] > "/dev/stderr"; bad = 1
        }
        if ((e in hot) && (stores[e] + 0 > 0 || loads[e] + 0 > 0)) {
          printf "ptx.sh: %s: hot kernel %s spills: %s bytes spill stores, %s bytes spill loads (%d registers, __launch_bounds__ %d)\n", sm, e, stores[e], loads[e], r, maxntid[e] > "/dev/stderr"; bad = 1
        }
        if ((e in hot)) nhot++
      }
      for (h in hot) if (!(h in entries) && part == "") { printf "ptx.sh: %s: %s lists %s, which the PTX does not have\n", sm, hotfile, h > "/dev/stderr"; bad = 1 }
      if (bad) { printf "ptx.sh: the register check failed for %s on %s\n", ptxname, sm > "/dev/stderr"; exit 1 }
      printf "ptx.sh: %s: %d kernels within their __launch_bounds__ (most registers: %d, %s); no spills in the %d hot kernels\n", sm, n, most, mostk, nhot
    }' "$hot" "$ptx" "$log"
  local rc=$?
  rm -f "$log"
  return $rc
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

case $mode in
build)
  if ! find_toolchain; then
    echo "ptx.sh: no CUDA toolchain (nvcc and ptxas): run make cuda-toolchain" >&2
    exit 1
  fi
  compile_into "$tmp"
  assemble_in "$tmp"
  mkdir -p "$out"
  for t in "${targets[@]}"; do
    set -- $t
    cp "$tmp/$1" "$out/$1"
  done
  { stamp_body; echo "nvcc $version"; } >"$stamp"
  echo "ptx: built ${targets[*]%% *} with $version"
  ;;
check)
  if [ ! -f "$stamp" ] || [ "$(grep -v '^nvcc ' "$stamp")" != "$(stamp_body)" ]; then
    echo "$stale" >&2
    exit 1
  fi
  if ! find_toolchain; then
    echo "ptx-check: stamps match; no CUDA toolchain here (make cuda-toolchain), so only the stamps were checked"
    exit 0
  fi
  built=$(sed -n 's/^nvcc //p' "$stamp")
  compile_into "$tmp"
  assemble_in "$out"
  if [ "$built" != "$version" ]; then
    echo "ptx-check: stamps match; kernels.cu compiles with $version and the PTX assembles for sm_70, sm_80, sm_90 (registers within the kernels' __launch_bounds__, no spills in the hot kernels), but the PTX was built with $built, so it was not compared byte for byte"
    exit 0
  fi
  for t in "${targets[@]}"; do
    set -- $t
    if ! cmp -s "$tmp/$1" "$out/$1"; then
      echo "$stale ($out/$1 differs from what nvcc builds from the sources)" >&2
      exit 1
    fi
  done
  echo "ptx-check: stamps match; rebuilt identical PTX with $version; assembles for sm_70, sm_80, sm_90 (registers within the kernels' __launch_bounds__, no spills in the hot kernels)"
  ;;
regs)
  [ $# -eq 3 ] || [ $# -eq 4 ] || { echo "usage: $0 regs FILE.ptx SM [part]" >&2; exit 2; }
  find_toolchain || { echo "ptx.sh: no CUDA toolchain (ptxas): run make cuda-toolchain" >&2; exit 1; }
  regcheck "$2" "$3" "${4:-}"
  ;;
*)
  echo "usage: $0 build|check|regs" >&2
  exit 2
  ;;
esac
