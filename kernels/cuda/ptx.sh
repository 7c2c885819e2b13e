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

# assemble_in DIR: ptxas every PTX in DIR for its machines, warnings as errors.
assemble_in() {
  local d=$1 t sm
  for t in "${targets[@]}"; do
    set -- $t
    for sm in ${3//,/ }; do
      "$ptxas" -arch="$sm" -O3 -Werror "$d/$1" -o /dev/null ||
        { echo "ptx.sh: ptxas -arch=$sm failed on $d/$1" >&2; return 1; }
    done
  done
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
    echo "ptx-check: stamps match; kernels.cu compiles with $version and the PTX assembles for sm_70, sm_80, sm_90, but the PTX was built with $built, so it was not compared byte for byte"
    exit 0
  fi
  for t in "${targets[@]}"; do
    set -- $t
    if ! cmp -s "$tmp/$1" "$out/$1"; then
      echo "$stale ($out/$1 differs from what nvcc builds from the sources)" >&2
      exit 1
    fi
  done
  echo "ptx-check: stamps match; rebuilt identical PTX with $version; assembles for sm_70, sm_80, sm_90"
  ;;
*)
  echo "usage: $0 build|check" >&2
  exit 2
  ;;
esac
