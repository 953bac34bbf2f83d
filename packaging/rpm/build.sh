#!/usr/bin/env bash
# Build the slurmgpu RPM (Rocky/RHEL 8-9) with rpmbuild.
#
#   packaging/rpm/build.sh [--python X.Y] [--arch x86_64|aarch64] [--srpm] [OUTDIR]
#
# OUTDIR defaults to dist/. Makes Source0 (slurmgpu-VERSION.tar.gz of the checkout's files:
# tracked and untracked-but-not-ignored) and Source1 (the pinned wheels for Python X.Y,
# default 3.11, and the machine's architecture; hash-checked, cached in build/wheels/) in
# a temporary rpmbuild tree and runs `rpmbuild -bb` (and -bs with --srpm). The venv is
# made with /usr/bin/pythonX.Y, which RHEL's pythonX.Y package and Debian both have.
# On a host whose rpm database does not hold the BuildRequires (Debian: apt-get install
# rpm), rpmbuild runs with --nodeps. Nothing is written into the checkout but OUTDIR and
# build/wheels/.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
pyver=3.11
arch=$(uname -m)
srpm=
out=
while [ $# -gt 0 ]; do
    case $1 in
        --python) pyver=${2:?}; shift 2 ;;
        --arch) arch=${2:?}; shift 2 ;;
        --srpm) srpm=1; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        -*) echo "usage: $0 [--python X.Y] [--arch ARCH] [--srpm] [OUTDIR]" >&2; exit 2 ;;
        *) out=$1; shift ;;
    esac
done
out=${out:-$repo/dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PATH=/usr/sbin:/usr/bin:/sbin:/bin   # the system's python, not a pyenv/venv one
python=/usr/bin/python$pyver
command -v rpmbuild >/dev/null || { echo "$0: no rpmbuild (Debian: apt-get install rpm; RHEL: dnf install rpm-build)" >&2; exit 1; }
[ -x "$python" ] || { echo "$0: $python not found (RHEL: dnf install python$pyver)" >&2; exit 1; }

version=$("$repo/packaging/version.sh")
spec_version=$(sed -n 's/^Version: *//p' "$here/slurmgpu.spec")
if [ "$spec_version" != "$version" ]; then
    echo "$0: slurmgpu.spec says $spec_version but slurmgpu/__init__.py says $version" >&2
    exit 1
fi

top=$(mktemp -d "${TMPDIR:-/tmp}/slurmgpu-rpm.XXXXXX")
trap 'rm -rf "$top"' EXIT
mkdir -p "$top"/{SOURCES,SPECS,BUILD,RPMS,SRPMS,BUILDROOT}
t0=$(date +%s)

"$repo/packaging/source_files.sh" |
    (cd "$repo" && tar --null --no-recursion -T - --transform "s|^|slurmgpu-$version/|" \
        --owner=0 --group=0 -czf "$top/SOURCES/slurmgpu-$version.tar.gz")
wheels="$repo/build/wheels/cp${pyver/./}-$arch"
"$repo/packaging/fetch_wheels.sh" "$wheels" --arch "$arch" --python "$pyver"
mkdir -p "$top/wheels-src/wheels"
# Exactly the pinned files (the cache may hold older pins too).
grep -E '^[A-Za-z0-9]' "$repo/packaging/requirements-bundled.txt" | sed 's/ .*//' |
    while IFS='=' read -r name _ ver; do
        norm=$(echo "$name" | tr 'A-Z-' 'a-z_')
        found=
        for f in "$wheels"/*.whl; do
            base=$(basename "$f" | tr 'A-Z' 'a-z')
            case $base in "$norm-$ver-"*) cp "$f" "$top/wheels-src/wheels/"; found=1 ;; esac
        done
        [ -n "$found" ] || { echo "$0: no wheel for $name==$ver in $wheels" >&2; exit 1; }
    done
tar -C "$top/wheels-src" --owner=0 --group=0 -czf "$top/SOURCES/slurmgpu-$version-wheels.tar.gz" wheels
cp "$here/slurmgpu.spec" "$top/SPECS/"

opts=(--define "_topdir $top" --define "slurmgpu_python $python" --target "$arch")
# PACKAGER="Name <email>": the Packager tag (rpm's own macro), as a site that builds
# its own RPM signs it.
[ -z "${PACKAGER:-}" ] || opts+=(--define "packager $PACKAGER")
if ! rpm -q rpm >/dev/null 2>&1; then
    opts+=(--nodeps)   # not an rpm-based system: its rpm database has no BuildRequires
fi
echo "== rpmbuild -bb ${opts[*]} slurmgpu.spec"
rpmbuild -bb "${opts[@]}" "$top/SPECS/slurmgpu.spec"
cp "$top"/RPMS/*/slurmgpu-"$version"-*.rpm "$out/"
if [ -n "$srpm" ]; then
    rpmbuild -bs "${opts[@]}" "$top/SPECS/slurmgpu.spec"
    cp "$top"/SRPMS/slurmgpu-"$version"-*.src.rpm "$out/"
fi
echo "== built $(cd "$top/RPMS" && ls */slurmgpu-*.rpm) -> $out/ in $(( $(date +%s) - t0 )) s"
