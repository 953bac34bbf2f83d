#!/usr/bin/env bash
# Build the vendored Slurm source into PREFIX for the mini-cluster and pyslurm.
#
#   tools/build_slurm.sh PREFIX
#
#  1. the source: $SLURMGPU_VENDOR_DIR (default <repo>/../shared/vendor) holds
#     slurm-$SLURM_VERSION.tar.xz (default 25.11.7) and SHA256SUMS; the tarball is
#     checked against SHA256SUMS before anything else and refused on a mismatch;
#  2. idempotent: PREFIX/.slurmgpu-build records version, checksum and configure
#     options; when it matches, the script says so and returns at once;
#  3. build deps from Debian's packages (libmunge-dev for auth/munge, libjson-c-dev for
#     the json serializer behind the commands' --json, libyaml-dev), only those missing;
#  4. configure with what the mini-cluster needs (slurmctld, slurmd with
#     --enable-multiple-slurmd, the client commands, libslurm.so for pyslurm, munge,
#     json) and without what it does not (slurmrestd, PAM, X11, sview, static libs,
#     debug symbols, optimisation: a test build), then `nice make -j` and
#     `make install` from a temporary tree.
# Prints the build's wall time. $SLURMGPU_BUILD_JOBS: make's -j (default: nproc).
# Needs root only to install missing build deps.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
prefix=${1:?usage: tools/build_slurm.sh PREFIX}
version=${SLURM_VERSION:-25.11.7}
vendor=${SLURMGPU_VENDOR_DIR:-$here/../shared/vendor}
tarball=slurm-$version.tar.xz
jobs=${SLURMGPU_BUILD_JOBS:-$(nproc)}
configure_options=(
    --sysconfdir="$prefix/etc" --enable-multiple-slurmd --disable-static
    --disable-debug --disable-slurmrestd --disable-pam --disable-x11 --disable-sview
    --without-hdf5 --without-pmix --without-ucx --without-rdkafka --without-nvml
    --without-rsmi --without-oneapi --without-freeipmi --without-hwloc
    --without-jwt --without-lua --without-readline --without-mysql_config
    --with-munge --with-json CFLAGS=-O0\ -pipe
)
build_deps=(gcc make libc6-dev pkg-config python3 xz-utils libmunge-dev libjson-c-dev libyaml-dev)

die() { echo "build_slurm.sh: $*" >&2; exit 1; }

[ -f "$vendor/$tarball" ] || die "no $tarball in $vendor (set SLURMGPU_VENDOR_DIR)"
grep -q " $tarball\$" "$vendor/SHA256SUMS" || die "$tarball not listed in $vendor/SHA256SUMS"
checksum=$(grep " $tarball\$" "$vendor/SHA256SUMS" | cut -d' ' -f1)
(cd "$vendor" && grep " $tarball\$" SHA256SUMS | sha256sum -c --quiet -) \
    || die "$tarball does not match SHA256SUMS: refusing to build"

stamp="$prefix/.slurmgpu-build"
wanted=$(printf 'version=%s\nsha256=%s\nconfigure=%s\n' "$version" "$checksum" "${configure_options[*]}")
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && [ -x "$prefix/sbin/slurmctld" ]; then
    echo "build_slurm.sh: Slurm $version already built in $prefix"
    exit 0
fi

missing=()
for pkg in "${build_deps[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "build_slurm.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/build-slurm.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
tar -xJf "$vendor/$tarball" -C "$work"
cd "$work/slurm-$version"
echo "build_slurm.sh: configure (log: $work/configure.log)"
nice -n 15 ./configure --prefix="$prefix" "${configure_options[@]}" >"$work/configure.log" 2>&1 \
    || { tail -n 30 "$work/configure.log"; die "configure failed"; }
grep -q '^#define HAVE_JSON 1' config.h \
    || die "configure found no json-c: the commands' --json would be missing"
echo "build_slurm.sh: make -j$jobs"
nice -n 15 make -j"$jobs" >"$work/make.log" 2>&1 || { tail -n 40 "$work/make.log"; die "make failed"; }
rm -f "$stamp"
nice -n 15 make install >"$work/install.log" 2>&1 || { tail -n 40 "$work/install.log"; die "make install failed"; }
printf '%s\n' "$wanted" >"$stamp"
echo "build_slurm.sh: Slurm $version built into $prefix in $(( $(date +%s) - started )) s"
