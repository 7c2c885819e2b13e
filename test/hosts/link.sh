#!/usr/bin/env bash
# Reshapes the links of test hosts that are already up (see up.sh), or cuts
# and restores one host's link:
#
#   LINK="rate 10gbit loss 1%" test/hosts/link.sh     every host's link
#   LINK= test/hosts/link.sh                          unshaped
#   test/hosts/link.sh down 2   /   test/hosts/link.sh up 2
#
# Takes the same GORUN_HOSTS_* variables as up.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
LINK=${LINK:-}
NAME=${GORUN_HOSTS_NAME:-gorun-h}
VETH=${GORUN_HOSTS_VETH:-gr-h}
if [ "$(id -u)" != 0 ]; then echo "test/hosts/link.sh: must run as root (network namespaces)" >&2; exit 1; fi
. "$here/lib.sh"
case "${1:-}" in
  down | up)
    i=${2:?test/hosts/link.sh $1: which host? (e.g. 2)}
    ip link set "$VETH$i" "$1"
    exit 0;;
  "") ;;
  *) echo "test/hosts/link.sh: unknown argument '$1' (want: down N, up N, or none with LINK=...)" >&2; exit 1;;
esac
parse_link
n=0
for ns in $(ip netns list | awk -v n="$NAME" 'index($1, n) == 1 && substr($1, length(n) + 1) ~ /^[0-9]+$/ {print $1}'); do
  shape_link "$ns" "$VETH${ns#"$NAME"}"
  n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "test/hosts/link.sh: no hosts named $NAME* are up (run test/hosts/up.sh)" >&2; exit 1; }
echo "link of $n host(s): ${LINK:-unshaped}"
