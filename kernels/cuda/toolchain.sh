#!/usr/bin/env bash
# Fetches the CUDA toolchain that `make ptx` and `make ptx-check` use (nvcc,
# ptxas, the CUDA headers, libdevice) and the libraries whose symbol tables
# the Go tests read (libcuda1, libnvidia-ml1, libcublas11, libcudart11.0),
# from Debian bookworm's nvidia-cuda-toolkit 11.8, without installing
# anything system-wide: the packages are in the contrib and non-free
# components, which a stock apt configuration lacks, so a private apt
# configuration downloads them and dpkg -x unpacks them into
#
#   ${GORUN_CUDA_TOOLCHAIN:-$HOME/.cache/gorun/cuda-11.8}
#
# (~1 GB to download, ~30 s to unpack). A second run finds the marker file
# and does nothing. The last line printed is the directory. Needs apt-get
# and dpkg-deb (any Debian or Ubuntu machine), network access to
# $GORUN_DEBIAN_MIRROR (default http://deb.debian.org/debian); no root.
set -euo pipefail

dir=${GORUN_CUDA_TOOLCHAIN:-$HOME/.cache/gorun/cuda-11.8}
mirror=${GORUN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
marker=.gorun-toolchain
nvcc_rel=usr/lib/nvidia-cuda-toolkit/bin/nvcc

if [ -f "$dir/$marker" ] && [ -x "$dir/$nvcc_rel" ]; then
  echo "$dir"
  exit 0
fi
if [ -e "$dir" ]; then
  echo "toolchain.sh: $dir exists but is not a toolchain this script unpacked (no $marker): remove it first" >&2
  exit 1
fi

for tool in apt-get dpkg-deb tar; do
  command -v "$tool" >/dev/null || { echo "toolchain.sh: $tool not found (needs a Debian-like machine)" >&2; exit 1; }
done

# Everything happens in a staging directory next to the target, renamed
# into place at the end, so an interrupted run leaves no half toolchain.
mkdir -p "$(dirname "$dir")"
stage=$(mktemp -d "$dir.stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
apt=$stage/apt
root=$stage/root
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs" "$root"

signed=""
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] && signed=" [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
echo "deb$signed $mirror bookworm main contrib non-free non-free-firmware" >"$apt/sources.list"

aptopts=(
  -o "Dir::Etc::SourceList=$apt/sources.list"
  -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$apt/lists"
  -o "Dir::Cache=$apt/cache"
  -o "Dir::Cache::Archives=$apt/cache/archives"
  -o "Dir::Etc::Preferences=/dev/null"
  -o "Dir::Etc::PreferencesParts=/dev/null"
  -o "APT::Architecture=$(dpkg --print-architecture)"
  -o "APT::Architectures::=$(dpkg --print-architecture)"
  -o "APT::Sandbox::User=$(id -un)"
  -o "Debug::NoLocking=true"
  -o "Acquire::Languages=none"
)

pkgs=(nvidia-cuda-toolkit libnvvm4 nvidia-cuda-dev libcuda1 libnvidia-ml1 libcublas11 libcudart11.0)

t0=$SECONDS
echo "toolchain.sh: reading the package lists of Debian bookworm (contrib non-free) from $mirror" >&2
apt-get -q "${aptopts[@]}" update >"$apt/update.log" 2>&1 || { cat "$apt/update.log" >&2; exit 1; }
echo "toolchain.sh: downloading ${pkgs[*]} (~1 GB)" >&2
(cd "$apt/debs" && apt-get -q "${aptopts[@]}" download "${pkgs[@]}") >"$apt/download.log" 2>&1 ||
  { cat "$apt/download.log" >&2; exit 1; }
t1=$SECONDS

echo "toolchain.sh: unpacking into $dir" >&2
for deb in "$apt"/debs/*.deb; do
  case $(basename "$deb") in
    nvidia-cuda-dev_*) # only the headers: the rest is static libraries
      dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$root" --wildcards './usr/include/*' ;;
    *)
      dpkg-deb -x "$deb" "$root" ;;
  esac
done

# nvcc reads nvcc.profile next to itself; Debian's is a symlink to
# /etc/nvcc.profile, which is not there. This one finds cicc, libdevice and
# the headers relative to nvcc. (ptxas is in usr/bin: ptx.sh puts it on PATH.)
bin=$root/usr/lib/nvidia-cuda-toolkit/bin
rm -f "$bin/nvcc.profile"
cat >"$bin/nvcc.profile" <<'EOF'
NVVMIR_LIBRARY_DIR = $(_HERE_)/../libdevice
PATH		+= $(_HERE_):
INCLUDES	+= "-I$(_HERE_)/../../../include" $(_SPACE_)
EOF

[ -x "$root/$nvcc_rel" ] && [ -x "$root/usr/bin/ptxas" ] && [ -f "$root/usr/include/cuda_fp16.h" ] ||
  { echo "toolchain.sh: the unpacked packages lack nvcc, ptxas or cuda_fp16.h" >&2; exit 1; }
version=$("$root/$nvcc_rel" --version | grep -o 'release [0-9.]*, V[0-9.]*')
{
  echo "Debian bookworm packages unpacked by kernels/cuda/toolchain.sh:"
  for deb in "$apt"/debs/*.deb; do basename "$deb"; done
  echo "nvcc: $version"
} >"$root/$marker"

mv -T "$root" "$dir"
echo "toolchain.sh: nvcc $version; download $((t1 - t0)) s, unpack $((SECONDS - t1)) s" >&2
echo "$dir"
