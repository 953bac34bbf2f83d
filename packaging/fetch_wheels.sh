#!/usr/bin/env bash
# Download the wheels the packages bundle (packaging/requirements-bundled.txt), every one
# checked against its pinned sha256, into DEST.
#
#   packaging/fetch_wheels.sh DEST [--arch x86_64|aarch64] [--python 3.11] [NAME ...]
#
# NAMEs pick requirements by name (e.g. nvidia-ml-py); the default is all of them. A
# second run reuses what DEST holds (tried offline first), so builds repeat without the
# network. pip: $PIP (a command), else the checkout's .venv, else `python3 -m pip`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
reqs="$here/requirements-bundled.txt"

usage() { echo "usage: $0 DEST [--arch ARCH] [--python X.Y] [NAME ...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
dest=$1; shift
arch=$(uname -m)
pyver=3.11
names=()
while [ $# -gt 0 ]; do
    case $1 in
        --arch) arch=${2:?}; shift 2 ;;
        --python) pyver=${2:?}; shift 2 ;;
        -*) usage ;;
        *) names+=("$1"); shift ;;
    esac
done

if [ -n "${PIP:-}" ]; then
    read -r -a pip <<<"$PIP"
elif [ -x "$repo/.venv/bin/python" ] && "$repo/.venv/bin/python" -m pip --version >/dev/null 2>&1; then
    pip=("$repo/.venv/bin/python" -m pip)
elif /usr/bin/python3 -m pip --version >/dev/null 2>&1; then
    pip=(/usr/bin/python3 -m pip)
else
    echo "$0: no pip: set PIP, create the checkout's .venv, or apt-get install python3-pip" >&2
    exit 1
fi

mkdir -p "$dest"
req=$(mktemp)
trap 'rm -f "$req"' EXIT
# The requirement lines (no comments), optionally only the NAMEs asked for.
grep -E '^[A-Za-z0-9]' "$reqs" >"$req.all"
if [ ${#names[@]} -gt 0 ]; then
    : >"$req"
    for n in "${names[@]}"; do
        grep -i -E "^${n//./\\.}==" "$req.all" >>"$req" || { echo "$0: $n is not in $reqs" >&2; rm -f "$req.all"; exit 1; }
    done
else
    cp "$req.all" "$req"
fi
rm -f "$req.all"

abi=cp${pyver/./}
opts=(download --quiet --disable-pip-version-check --no-deps --require-hashes -r "$req" -d "$dest"
      --only-binary=:all: --python-version "$pyver" --implementation cp --abi "$abi"
      --platform "manylinux_2_28_$arch" --platform "manylinux_2_26_$arch"
      --platform "manylinux2014_$arch" --platform "manylinux_2_17_$arch")
if "${pip[@]}" "${opts[@]}" --no-index --find-links "$dest" >/dev/null 2>&1; then
    echo "fetch_wheels: reused $(wc -l <"$req") pinned wheel(s) in $dest"
else
    "${pip[@]}" "${opts[@]}" 2> >(grep -v "^WARNING: Location" >&2)
    echo "fetch_wheels: downloaded $(wc -l <"$req") pinned wheel(s) into $dest"
fi
