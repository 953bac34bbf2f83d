#!/usr/bin/env bash
# Build the slurmgpu .deb (Architecture: all) with Debian's own tooling.
#
#   packaging/deb/build.sh [--install-deps] [OUTDIR]      (OUTDIR default: dist/)
#
# Copies the checkout (tracked and untracked-but-not-ignored files: what a commit would
# hold, without .venv/, build/, dist/) to a temporary directory, puts
# packaging/deb/debian/ at its root, adds the pinned nvidia-ml-py wheel (hash-checked,
# cached in build/wheels/) as debian/vendor/, runs `dpkg-buildpackage -us -uc -b` there
# and copies the .deb to OUTDIR. Nothing is written into the checkout but OUTDIR and
# build/wheels/. --install-deps apt-get installs the Build-Depends first (root).
# DEBEMAIL (and DEBFULLNAME): the Maintainer and changelog signature of the package built.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
install_deps=
out=
for arg; do
    case $arg in
        --install-deps) install_deps=1 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        -*) echo "usage: $0 [--install-deps] [OUTDIR]" >&2; exit 2 ;;
        *) out=$arg ;;
    esac
done
out=${out:-$repo/dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PATH=/usr/sbin:/usr/bin:/sbin:/bin   # Debian's python3, not a pyenv/venv one

build_deps=(dpkg-dev debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools
            python3-click python3-zmq)
if [ -n "$install_deps" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${build_deps[@]}"
fi

version=$("$repo/packaging/version.sh")
deb_version=$(sed -n '1s/^slurmgpu (\([^)]*\)).*/\1/p' "$here/debian/changelog")
if [ "${deb_version%-*}" != "$version" ]; then
    echo "$0: debian/changelog is $deb_version but slurmgpu/__init__.py says $version: add a changelog entry" >&2
    exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/slurmgpu-deb.XXXXXX")
if [ -n "${KEEP_BUILD_DIR:-}" ]; then   # KEEP_BUILD_DIR=1: leave the build tree to inspect
    echo "keeping $tmp"
else
    trap 'rm -rf "$tmp"' EXIT
fi
src=$tmp/slurmgpu-$version
mkdir -p "$src"

t0=$(date +%s)
"$repo/packaging/source_files.sh" | (cd "$repo" && tar --null --no-recursion -T - -cf -) | tar -xf - -C "$src"
rm -rf "$src/debian"
cp -a "$here/debian" "$src/debian"
# The maintainer: a site that builds its own package names itself, with the variables
# Debian's tools (dch, debmake) read. The repository's address is a placeholder.
if [ -n "${DEBEMAIL:-}" ]; then
    maintainer="${DEBFULLNAME:-slurmgpu packager} <$DEBEMAIL>"
    case $maintainer in *$'\n'*|*'|'*) echo "$0: DEBFULLNAME/DEBEMAIL: one line without '|'" >&2; exit 2 ;; esac
    sed -i "s|^Maintainer: .*|Maintainer: $maintainer|" "$src/debian/control"
    sed -i "s|^ -- [^>]*>  | -- $maintainer  |" "$src/debian/changelog"
    echo "== maintainer: $maintainer"
fi
mkdir -p "$src/debian/vendor"
"$repo/packaging/fetch_wheels.sh" "$repo/build/wheels/any" nvidia-ml-py
cp "$repo"/build/wheels/any/nvidia_ml_py-*-py3-none-any.whl "$src/debian/vendor/"

echo "== dpkg-buildpackage -us -uc -b in $src"
(cd "$src" && dpkg-buildpackage -us -uc -b)
cp "$tmp"/slurmgpu_*_all.deb "$out/"
echo "== built $(cd "$tmp" && ls slurmgpu_*_all.deb) -> $out/ in $(( $(date +%s) - t0 )) s"
