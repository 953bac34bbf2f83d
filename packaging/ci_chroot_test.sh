#!/usr/bin/env bash
# Install the .deb into a clean Debian root and run it: the package's own CI check.
#
#   packaging/ci_chroot_test.sh [--install-deps] [--deb FILE] [--suite bookworm]
#                               [--cache DIR] [--mirror URL] [--keep]
#
#  1. the .deb: --deb FILE, else built by packaging/deb/build.sh into dist/;
#  2. a base root, cached in DIR/SUITE (default /var/cache/slurmgpu-ci/bookworm):
#     `debootstrap --variant=minbase`, then the test's own tools (gcc, libc6-dev,
#     libcjson-dev for the GPU simulator; systemd for systemd-analyze; logrotate). Made once; a
#     later run reuses it (delete the directory to refresh it);
#  3. a throw-away root on it, DIR/SUITE-work (an overlay, else a copy), where `dpkg -i` + `apt-get -f install -y`
#     install the package and the Debian dependencies it names (downloaded .debs are kept
#     in DIR/apt-archives/SUITE for the next run);
#  4. checks there: `slurmgpu --version` (the package's version), the man pages, bash
#     completion, logrotate file, alert rules and dashboard; the minimal config passing on
#     healthy simulated nodes without InfiniBand; a drop-in winning (and one from `config
#     init --from-this-node`); `slurmgpu check` on the simulated 8x H100 node
#     (healthy: exit 0; GPU lost: exit 2), the installed prolog and TaskProlog wrappers,
#     Slurm jobs on a 2-node mini-cluster (slurmctld, slurmd, munged in the root) whose
#     slurm.conf runs the installed hooks, the hooks without python3-structlog (they
#     decide as with it), a broken install (a module with a syntax error, a wrong
#     interpreter in /etc/default/slurmgpu) that drains nothing, a lost GPU refused while slurmctld hangs, an upgrade over an edited
#     config with stdin closed (no prompt), `systemd-analyze verify` of the installed
#     units, then a purge.
#
# /proc, /sys, /dev, /dev/pts and the apt archive are bind-mounted into the work root
# and always unmounted on exit. Exits non-zero on the first failure; prints each step's
# time. --install-deps: apt-get install the host's needs (debootstrap, build deps). The
# mirror: --mirror, $MIRROR, else the host's apt sources' Debian mirror.
# Needs root (debootstrap, chroot, mount).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
deb=
suite=bookworm
cache=/var/cache/slurmgpu-ci
mirror=${MIRROR:-}
install_deps=
keep=
while [ $# -gt 0 ]; do
    case $1 in
        --install-deps) install_deps=1; shift ;;
        --deb) deb=${2:?}; shift 2 ;;
        --suite) suite=${2:?}; shift 2 ;;
        --cache) cache=${2:?}; shift 2 ;;
        --mirror) mirror=${2:?}; shift 2 ;;
        --keep) keep=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "usage: $0 [--install-deps] [--deb FILE] [--suite S] [--cache DIR] [--mirror URL] [--keep]" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "$0: needs root (debootstrap, chroot, mount)" >&2; exit 1; }
export PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8

t_start=$(date +%s)
step_t0=
step() {
    local now; now=$(date +%s)
    [ -z "$step_t0" ] || echo "   ... $(( now - step_t0 )) s"
    step_t0=$now
    echo "== $*"
}

base=$cache/$suite
work=$cache/$suite-work
archives=$cache/apt-archives/$suite
mounts=()
# Daemons the mini-cluster step started inside the root (slurmctld, slurmd, munged) if
# it failed half-way: nothing may run there once the root is unmounted.
kill_root_procs() {
    local p pids=()
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/root" 2>/dev/null)" = "$work" ] && pids+=("${p#/proc/}")
    done
    [ ${#pids[@]} -gt 0 ] || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    sleep 2
    kill -KILL "${pids[@]}" 2>/dev/null || true
}
cleanup() {
    local rc=$? i
    [ -z "${work:-}" ] || kill_root_procs
    for (( i=${#mounts[@]}-1; i>=0; i-- )); do
        umount "${mounts[$i]}" 2>/dev/null || umount -l "${mounts[$i]}" 2>/dev/null || true
    done
    if [ -z "$keep" ] && [ -d "$work" ]; then
        # Only once nothing is mounted there any more.
        if ! awk -v w="$work" '$2 == w || index($2, w "/") == 1 { f = 1 } END { exit !f }' /proc/mounts; then
            rm -rf --one-file-system "$work" "$work.d"
        fi
    fi
    [ $rc -eq 0 ] && echo "== all checks passed in $(( $(date +%s) - t_start )) s" ||
        echo "== FAILED (exit $rc) after $(( $(date +%s) - t_start )) s" >&2
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Mounts left under the work root by a run that was killed (SIGKILL skips the trap):
# unmount them, deepest first, before anything there is deleted.
release_stale() {
    local m
    awk -v w="$work" '$2 == w || index($2, w "/") == 1 { print $2 }' /proc/mounts | sort -r |
        while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
    if awk -v w="$work" '$2 == w || index($2, w "/") == 1 { f = 1 } END { exit !f }' /proc/mounts; then
        echo "$0: $work still has mounts; not touching it" >&2
        exit 1
    fi
}
wipe_work() { release_stale; rm -rf --one-file-system "$work" "$work.d"; }

bind() {  # bind SRC DEST-inside-work
    mkdir -p "$work$2"
    mount --bind "$1" "$work$2"
    mounts+=("$work$2")
}
in_root() { chroot "$work" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }
must() { "$@" || { echo "check failed: $*" >&2; return 1; }; }
expect_exit() {  # expect_exit CODE COMMAND...: run in the root, require that exit code
    local want=$1 rc=0; shift
    in_root "$@" || rc=$?
    [ "$rc" = "$want" ] || { echo "exit $rc, expected $want: $*" >&2; return 1; }
}

if [ -z "$mirror" ]; then
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk '$1 == "deb" && $2 ~ /\/debian\/?$/ { print $2; exit }' || true)
    [ -n "$mirror" ] || mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk '$1 == "URIs:" && $2 ~ /\/debian\/?$/ { print $2; exit }' || true)
    mirror=${mirror:-http://deb.debian.org/debian}
fi

if [ -n "$install_deps" ]; then
    step "host: apt-get install debootstrap and the .deb's build dependencies"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends debootstrap dpkg-dev debhelper dh-python \
        pybuild-plugin-pyproject python3-all python3-setuptools python3-click python3-zmq \
        python3-venv python3-pip
fi
command -v debootstrap >/dev/null || { echo "$0: no debootstrap (apt-get install debootstrap, or --install-deps)" >&2; exit 1; }

if [ -z "$deb" ]; then
    step "build the .deb (packaging/deb/build.sh)"
    "$here/deb/build.sh" "$repo/dist" >"$repo/dist/.ci-deb-build.log" 2>&1 ||
        { tail -40 "$repo/dist/.ci-deb-build.log"; exit 1; }
    version=$("$repo/packaging/version.sh")
    deb=$(ls "$repo"/dist/slurmgpu_"$version"-*_all.deb | tail -n1)
fi
[ -f "$deb" ] || { echo "$0: no such .deb: $deb" >&2; exit 1; }
echo "   package: $deb"

# nvml.h for the GPU simulator's fake libnvidia-ml (NVIDIA's header, from pip's
# nvidia-nvml-dev): the checkout's .venv has it after `pip install -e '.[dev]'`.
nvml_h=${SLURMGPU_NVML_INCLUDE:+$SLURMGPU_NVML_INCLUDE/nvml.h}
if [ -z "$nvml_h" ] && [ -x "$repo/.venv/bin/python" ]; then
    nvml_h=$("$repo/.venv/bin/python" -c 'import slurmgpu.sim.build as b; print(b.find_nvml_header())' 2>/dev/null || true)
fi
if [ -z "$nvml_h" ] || [ ! -f "$nvml_h" ]; then
    step "fetch nvml.h (pip download nvidia-nvml-dev)"
    mkdir -p "$cache/nvml"
    if ! ls "$cache"/nvml/nvidia_nvml_dev-*.whl >/dev/null 2>&1; then
        pip=(/usr/bin/python3 -m pip)
        [ -x "$repo/.venv/bin/python" ] && pip=("$repo/.venv/bin/python" -m pip)
        "${pip[@]}" download -q --no-deps --only-binary=:all: -d "$cache/nvml" nvidia-nvml-dev
    fi
    whl=$(ls "$cache"/nvml/nvidia_nvml_dev-*.whl | tail -n1)
    /usr/bin/python3 - "$whl" "$cache/nvml/nvml.h" <<'EOF'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
name = next(n for n in z.namelist() if n.endswith("/nvml.h"))
open(sys.argv[2], "wb").write(z.read(name))
EOF
    nvml_h=$cache/nvml/nvml.h
fi

if [ ! -e "$base/.slurmgpu-ci-debootstrap" ]; then
    step "debootstrap --variant=minbase $suite $base $mirror"
    rm -rf "$base.tmp"
    mkdir -p "$cache"
    debootstrap --variant=minbase "$suite" "$base.tmp" "$mirror" >"$cache/debootstrap-$suite.log" 2>&1 ||
        { tail -30 "$cache/debootstrap-$suite.log"; exit 1; }
    rm -rf "$base"
    mv "$base.tmp" "$base"
    touch "$base/.slurmgpu-ci-debootstrap"
else
    step "reuse the cached $suite root ($base)"
fi
mkdir -p "$archives/partial"

# The test's own tools; the marker names the list, so a cache made with an older list is
# topped up.
tools="gcc libc6-dev libcjson-dev systemd slurmctld slurmd slurm-client munge logrotate"
tools_marker=$base/.slurmgpu-ci-tools-$(printf '%s' "$tools" | md5sum | cut -c1-12)
if [ ! -e "$tools_marker" ]; then
    step "base root: the test's tools ($tools)"
    wipe_work
    cp -a "$base" "$work"
    cp /etc/resolv.conf "$work/etc/resolv.conf"
    bind /proc /proc
    bind /dev /dev
    bind /dev/pts /dev/pts
    bind "$archives" /var/cache/apt/archives
    printf '#!/bin/sh\nexit 101\n' >"$work/usr/sbin/policy-rc.d"; chmod 755 "$work/usr/sbin/policy-rc.d"
    in_root apt-get update -qq
    # shellcheck disable=SC2086  # one package per word
    in_root apt-get install -y -qq --no-install-recommends $tools >/dev/null
    in_root apt-get clean
    for (( i=${#mounts[@]}-1; i>=0; i-- )); do umount "${mounts[$i]}"; done
    mounts=()
    rm -f "$work"/.slurmgpu-ci-tools*
    touch "$work${tools_marker#"$base"}"
    rm -rf "$base"
    mv "$work" "$base"
fi

step "fresh work root: an overlay on the base (a copy where overlayfs is unavailable)"
wipe_work
mkdir -p "$work" "$work.d/upper" "$work.d/work"
if mount -t overlay overlay -o "lowerdir=$base,upperdir=$work.d/upper,workdir=$work.d/work" "$work" 2>/dev/null; then
    mounts+=("$work")
else
    rmdir "$work"
    cp -a "$base" "$work"
fi
cp /etc/resolv.conf "$work/etc/resolv.conf"
bind /proc /proc
bind /sys /sys
bind /dev /dev
bind /dev/pts /dev/pts
bind "$archives" /var/cache/apt/archives
# Debian's policy: no daemon starts inside a chroot.
printf '#!/bin/sh\nexit 101\n' >"$work/usr/sbin/policy-rc.d"; chmod 755 "$work/usr/sbin/policy-rc.d"
mkdir -p "$work/opt/nvml/include"
cp "$nvml_h" "$work/opt/nvml/include/nvml.h"
cp "$deb" "$work/tmp/slurmgpu.deb"

step "apt-get update"
in_root apt-get update -qq

step "dpkg -i (missing dependencies expected) + apt-get -f install -y"
in_root dpkg -i /tmp/slurmgpu.deb >/dev/null 2>&1 || true
in_root apt-get -f install -y -qq --no-install-recommends >/dev/null
must grep -q '^install ok installed ' <<<"$(in_root dpkg-query -W -f='${Status} ${Version}\n' slurmgpu)"
in_root dpkg-query -W -f='   installed slurmgpu ${Version}\n' slurmgpu
in_root sh -c 'dpkg-query -W -f="\${Package} \${Version}\n" python3 python3-zmq python3-structlog python3-prometheus-client python3-click python3-msgpack python3-clustershell | sed "s/^/   /"'

step "slurmgpu --version"
v=$(in_root slurmgpu --version)
echo "   $v"
must [ "$v" = "slurmgpu, version $(in_root dpkg-query -W -f='${Version}' slurmgpu | sed 's/-[^-]*$//')" ]

step "installed files: modes, conffiles, hooks"
for d in /var/lib/slurmgpu /var/lib/slurmgpu/validations /var/spool/slurmgpu /etc/slurmgpu/keys; do
    must [ "$(stat -c %a:%U:%G "$work$d")" = 700:root:root ]
done
must grep -qx 'SLURMGPU_PYTHON=/usr/bin/python3' "$work/etc/default/slurmgpu"
in_root python3 -c 'import pynvml, slurmgpu.cli; print("   pynvml from", pynvml.__file__)'
for h in slurmgpu-prolog slurmgpu-epilog slurmgpu-healthcheck slurmgpu-taskprolog slurmgpu-taskprolog.py \
         slurmgpu-quickgate slurmgpu-nightly-report; do
    must in_root test -r "/usr/libexec/slurmgpu/$h"
done
in_root slurmgpu config check /etc/slurmgpu/slurmgpu.toml
must cmp "$work/usr/share/slurmgpu/slurmgpu.toml" "$work/etc/slurmgpu/slurmgpu.toml"
must [ -z "$(grep -x /etc/slurmgpu/slurmgpu.toml "$work/var/lib/dpkg/info/slurmgpu.conffiles")" ]

step "man pages, bash completion, logrotate, alert rules and dashboard"
for p in /usr/share/man/man1/slurmgpu.1.gz /usr/share/man/man1/slurmgpu-check.1.gz \
         /usr/share/man/man1/slurmgpu-config.1.gz /usr/share/man/man1/slurmgpu-doctor.1.gz \
         /etc/logrotate.d/slurmgpu /usr/share/slurmgpu/slurmgpu.rules.yml \
         /usr/share/slurmgpu/grafana-dashboard.json /usr/share/doc/slurmgpu/etc/slurmgpu.example.toml; do
    must [ -s "$work$p" ]
done
must zgrep -q '^\.SS slurmgpu config init$' "$work/usr/share/man/man1/slurmgpu-config.1.gz"
words=$(in_root bash -c 'source /usr/share/bash-completion/completions/slurmgpu
    COMP_WORDS=(slurmgpu config i); COMP_CWORD=2; _slurmgpu_completion slurmgpu; echo "${COMPREPLY[*]}"')
echo "   completion of 'slurmgpu config i': $words"
must [ "$words" = init ]
in_root logrotate --debug /etc/logrotate.d/slurmgpu 2>&1 | grep -E '^(rotating pattern|considering log)' | sed 's/^/   /'
must grep -qx /etc/logrotate.d/slurmgpu "$work/var/lib/dpkg/info/slurmgpu.conffiles"

step "the minimal config: a healthy simulated node without InfiniBand passes (8x H100, 1x H200)"
sim_env=(env SLURMGPU_NVML_INCLUDE=/opt/nvml/include SLURMGPU_SIM_DIR=/var/tmp/slurmgpu-sim)
must [ ! -e "$work/sys/class/infiniband" ]
for scenario in h100-sxm-8 h200-r580; do
    expect_exit 0 "${sim_env[@]}" slurmgpu sim run --scenario "$scenario" -- slurmgpu check
done
echo "   /etc/slurmgpu/slurmgpu.toml as installed: exit 0 on both"

step "a drop-in wins: /etc/slurmgpu/slurmgpu.d/ in name order"
must [ -d "$work/etc/slurmgpu/slurmgpu.d" ]
printf '[gpu]\ncount = 4\n' >"$work/etc/slurmgpu/slurmgpu.d/50-site.toml"
out=$(in_root "${sim_env[@]}" slurmgpu sim run --scenario h100-sxm-8 -- slurmgpu check) && rc=0 || rc=$?
must [ "$rc" = 2 ]
must grep -q '8 GPUs present, 4 expected' <<<"$out"
echo "   50-site.toml: count = 4 -> exit 2 (8 GPUs present, 4 expected)"
in_root "${sim_env[@]}" slurmgpu sim run --scenario h100-sxm-8 -- \
    slurmgpu config init --from-this-node --out /etc/slurmgpu/slurmgpu.d/60-this-node.toml | sed 's/^/   /'
expect_exit 0 "${sim_env[@]}" slurmgpu sim run --scenario h100-sxm-8 -- slurmgpu check
echo "   60-this-node.toml (config init: count = 8, the driver, VBIOS, model pinned) -> exit 0"
expect_exit 2 "${sim_env[@]}" slurmgpu sim run --scenario h100-sxm-8-r535 -- slurmgpu check
echo "   the same pins on an R535 node -> exit 2"
rm -f "$work"/etc/slurmgpu/slurmgpu.d/*.toml

step "slurmgpu check on the simulated 8x H100 node (builds the fake NVML with gcc)"
conf=/usr/share/doc/slurmgpu/etc/sim-h100.toml
expect_exit 0 "${sim_env[@]}" slurmgpu sim run --scenario h100-sxm-8 -- \
    slurmgpu check --config "$conf" --node gpu-h100-001
echo "   (healthy: exit 0)"
out=$(in_root "${sim_env[@]}" slurmgpu sim run --scenario fault-gpu-lost -- \
    slurmgpu check --config "$conf" --node gpu-h100-001) && rc=0 || rc=$?
echo "$out" | sed 's/^/   /'
must [ "$rc" = 2 ]
must grep -q 'gpu\.lost' <<<"$out"

step "the installed Slurm hooks: prolog (agent down: full path) and TaskProlog"
expect_exit 0 "${sim_env[@]}" slurmgpu sim run --scenario h100-sxm-8 -- \
    env SLURM_JOB_ID=42 SLURMD_NODENAME=gpu-h100-001 SLURM_JOB_GPUS=0,1 SLURMGPU_CONFIG="$conf" \
    /usr/libexec/slurmgpu/slurmgpu-prolog
line=$(in_root env SLURM_JOB_ID=42 /usr/libexec/slurmgpu/slurmgpu-taskprolog)
echo "   taskprolog: $line"
must [ "$line" = "export SLURMGPU_CHECKPOINT_FILE=/run/slurmgpu/jobs/42/checkpoint" ]

# A broken install drains nothing (issue 28 item 1): every installed hook exits as
# [<phase>] on_error says (fail-open: 0; the health check: 3) with ONE decision line.
nodb=(env SLURM_JOB_ID=42 SLURMD_NODENAME=gpu-h100-001 SLURM_JOB_GPUS=0,1 SLURMGPU_CONFIG="$conf")
hooks_follow_on_error() {  # hooks_follow_on_error WHAT
    local h want rc err
    for h in prolog epilog healthcheck; do
        want=0; [ "$h" = healthcheck ] && want=3
        rc=0; err=$(in_root "${nodb[@]}" /usr/libexec/slurmgpu/slurmgpu-$h 2>&1 >/dev/null) || rc=$?
        [ "$rc" = "$want" ] || { echo "$1: slurmgpu-$h exited $rc, expected $want: $err" >&2; return 1; }
        [ "$(grep -c "\"${h}_decision\"" <<<"$err")" = 1 ] ||
            { echo "$1: slurmgpu-$h: not one decision line: $err" >&2; return 1; }
    done
    echo "   $1: prolog 0, epilog 0, healthcheck 3, one decision line each"
}
hook_exits() {  # the exit status of each hook, one decision line each
    local h rc err out=
    for h in prolog epilog healthcheck; do
        rc=0; err=$(in_root "${nodb[@]}" /usr/libexec/slurmgpu/slurmgpu-$h 2>&1 >/dev/null) || rc=$?
        [ "$(grep -c "\"${h}_decision\"" <<<"$err")" = 1 ] ||
            { echo "slurmgpu-$h: not one decision line: $err" >&2; return 1; }
        out+="$h $rc "
    done
    echo "$out"
}
# The hooks import no structlog (issue 38): without it they judge the node as with it.
step "python3-structlog removed: the hooks decide as with it"
with_it=$(hook_exits)
in_root dpkg -r --force-depends python3-structlog >/dev/null 2>&1
without_it=$(hook_exits)
in_root apt-get install -y -qq --no-install-recommends python3-structlog >/dev/null
[ "$with_it" = "$without_it" ] || { echo "with structlog: $with_it; without: $without_it" >&2; exit 1; }
echo "   exits with and without it: $without_it"
step "a broken install drains nothing: a module with a syntax error"
pkg=$(in_root python3 -c 'import os, slurmgpu; print(os.path.dirname(slurmgpu.__file__))')
for m in gate.py log.py checks/__init__.py; do
    cp -p "$work$pkg/$m" "$work/tmp/saved.py"
    printf '\ndef broken(:\n' >>"$work$pkg/$m"
    hooks_follow_on_error "def broken(: in $m"
    cp -p "$work/tmp/saved.py" "$work$pkg/$m"
done
# A wrong interpreter in /etc/default/slurmgpu: the next one that has slurmgpu gates for
# real (a lost GPU refused: exit 1, slurmctld being absent; a healthy node: exit 0).
step "a wrong interpreter in /etc/default/slurmgpu: the packaged python3 gates instead"
cp -p "$work/etc/default/slurmgpu" "$work/tmp/default.saved"
for wrong in SLURMGPU_PYTHON=/bin/false SLURMGPU_PYTHON=/bin/sh SLURMGPU_PYTHON=/usr/bin/slurmgpu SLURMGPU_BIN=/bin/false; do
    { grep -v '^SLURMGPU_PYTHON=' "$work/tmp/default.saved"; echo "$wrong"; } >"$work/etc/default/slurmgpu"
    for case in h100-sxm-8:0 fault-gpu-lost:1; do
        expect_exit "${case#*:}" "${sim_env[@]}" slurmgpu sim run --scenario "${case%%:*}" -- \
            env SLURM_JOB_ID=43 SLURMD_NODENAME=gpu-h100-001 SLURM_JOB_GPUS=5 SLURMGPU_CONFIG="$conf" \
            /usr/libexec/slurmgpu/slurmgpu-prolog 2>/dev/null
    done
    echo "   $wrong: healthy 0, lost GPU 1"
done
cp -p "$work/tmp/default.saved" "$work/etc/default/slurmgpu"

step "Slurm jobs through the installed hooks (2-node mini-cluster in the root, no agents)"
# slurm.conf's Prolog/Epilog/TaskProlog run /usr/libexec/slurmgpu/slurmgpu-* as installed:
# the sim's shim exports only what simulates each node (its fake GPUs, kernel log, state
# dir), nothing that says where slurmgpu is. The admin's one line: which config to use.
simdir=/var/tmp/slurmgpu-simc
echo "SLURMGPU_CONFIG=$simdir/etc/slurmgpu.toml" >>"$work/etc/default/slurmgpu"
in_root "${sim_env[@]}" slurmgpu sim cluster up --nodes 2 --no-agents \
    --installed-hooks /usr/libexec/slurmgpu --dir "$simdir" --timeout 120 | sed 's/^/   /'
must grep -qx "Prolog=$simdir/hooks/prolog" "$work$simdir/etc/slurm.conf"
must grep -qx "exec /usr/libexec/slurmgpu/slurmgpu-prolog \"\$@\"" "$work$simdir/hooks/prolog"
in_slurm() { in_root sh -c "eval \"\$(slurmgpu sim cluster env --dir $simdir)\"; $1"; }
in_root slurmgpu sim cluster inject gpu-n2 fault-gpu-lost --dir "$simdir"
# A healthy node runs the job (the TaskProlog exports the checkpoint file); a node with a
# lost GPU is drained by slurmgpu's prolog, with its reason.
out=$(in_slurm "sbatch --wait -w gpu-n1 --gres=gpu:1 -o $simdir/ok.out --wrap 'echo ckpt=\$SLURMGPU_CHECKPOINT_FILE' && cat $simdir/ok.out")
echo "   healthy node: $out"
must grep -q '^ckpt=.*/checkpoint$' <<<"$out"
in_slurm "sbatch -w gpu-n2 --gres=gpu:8 -o /dev/null --wrap true" | sed 's/^/   /'
reason=
for _ in $(seq 120); do
    reason=$(in_slurm "sinfo -h -n gpu-n2 -o '%T|%E'")
    case $reason in drain*slurmgpu*) break ;; esac
    sleep 0.5
done
echo "   node with a lost GPU: $reason"
must grep -q '^drain.*|slurmgpu: gpu.lost GPU 5' <<<"$reason"
# A FAIL is never opened by a timeout (issue 28 item 2): slurmctld hangs (SIGSTOP: each
# scontrol waits out MessageTimeout) and the installed prolog still refuses the job.
ctld=
for p in /proc/[0-9]*; do
    if [ "$(readlink "$p/root" 2>/dev/null)" = "$work" ] && [ "$(cat "$p/comm" 2>/dev/null)" = slurmctld ]; then
        ctld=${p#/proc/}
        break
    fi
done
must [ -n "$ctld" ]
kill -STOP "$ctld"
rc=0; in_root env SLURMD_NODENAME=gpu-n2 SLURM_JOB_ID=99 SLURM_JOB_GPUS=5 "$simdir/hooks/prolog" \
    2>/dev/null || rc=$?
kill -CONT "$ctld"
echo "   lost GPU, slurmctld hanging: prolog exit $rc"
must [ "$rc" = 1 ]
must grep -q '"job": "99".*"verdict": "FAIL".*"exit": 1' "$work$simdir/nodes/gpu-n2/state/gate.jsonl"
in_root slurmgpu sim cluster down --purge --dir "$simdir"

step "an upgrade over an edited config, stdin closed: no prompt, the edits kept"
# The next release, as far as dpkg can tell: a higher version whose shipped config changed
# (and /etc/default/slurmgpu was edited above, by the cluster step).
echo '[healthcheck]  # edited by the site' >>"$work/etc/slurmgpu/slurmgpu.toml"
echo 'resume = false' >>"$work/etc/slurmgpu/slurmgpu.toml"
edited=$(sha256sum <"$work/etc/slurmgpu/slurmgpu.toml")
repack=$work/tmp/repack
rm -rf "$repack"
dpkg-deb -R "$deb" "$repack"
old_version=$(sed -n 's/^Version: //p' "$repack/DEBIAN/control")
sed -i "s/^Version: .*/&+upgrade1/" "$repack/DEBIAN/control"
echo '# (a comment a later release added)' >>"$repack/usr/share/slurmgpu/slurmgpu.toml"
dpkg-deb --root-owner-group -b "$repack" "$work/tmp/slurmgpu-upgrade.deb" >/dev/null
rm -rf "$repack"
in_root dpkg -i /tmp/slurmgpu-upgrade.deb </dev/null >/dev/null
must grep -qx "install ok installed $old_version+upgrade1" <<<"$(in_root dpkg-query -W -f='${Status} ${Version}\n' slurmgpu)"
must [ "$(sha256sum <"$work/etc/slurmgpu/slurmgpu.toml")" = "$edited" ]
must [ -z "$(find "$work/etc/slurmgpu" "$work/etc/default" -name '*.dpkg-*')" ]
in_root slurmgpu config check
v=$(in_root slurmgpu --version)
must [ "$v" = "slurmgpu, version $(in_root dpkg-query -W -f='${Version}' slurmgpu | sed 's/-[^-]*$//')" ]
echo "   $old_version -> $old_version+upgrade1 with stdin closed: configured, the edited config kept; $v"

step "systemd-analyze verify the installed units"
units=$(in_root sh -c 'for f in /lib/systemd/system/slurmgpu-* /usr/lib/systemd/system/slurmgpu-*; do
    [ -e "$f" ] && readlink -f "$f"; done | sort -u')
echo "$units" | sed 's/^/   /'
must [ "$(echo "$units" | wc -l)" -ge 4 ]
# shellcheck disable=SC2086  # one unit path per word
in_root env SYSTEMD_LOG_LEVEL=warning systemd-analyze verify $units

step "dpkg --purge slurmgpu (maintainer scripts; state removed)"
in_root dpkg --purge slurmgpu >/dev/null
for p in /var/lib/slurmgpu /var/spool/slurmgpu /usr/bin/slurmgpu /usr/libexec/slurmgpu \
         /etc/slurmgpu/slurmgpu.toml /etc/logrotate.d/slurmgpu; do
    must [ ! -e "$work$p" ]
done
step "done"
