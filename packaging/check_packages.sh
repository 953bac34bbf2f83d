#!/usr/bin/env bash
# Build the .deb and the RPM and check what they hold.
#
#   packaging/check_packages.sh [--no-build] [--deb-only|--rpm-only] [OUTDIR]
#
# OUTDIR (default dist/) receives the packages; --no-build checks the ones already there.
# The .deb: `dpkg-deb -I` (architecture, dependencies, conffiles, maintainer scripts: no
# unit enabled or started on install) and `dpkg-deb -c` (paths, modes, symlinks), and a
# few files' contents. The RPM: `rpm -qlvp`, `-qcp`, `--scripts`, `--requires`, config
# flags, and a smoke run of its venv (payload unpacked in a temporary directory: imports
# every bundled module and runs `slurmgpu --version`) where its python3.11 exists.
# Ends with "N passed, N failed"; exits non-zero on any failure.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
build=1 do_deb=1 do_rpm=1 out=
for arg; do
    case $arg in
        --no-build) build= ;;
        --deb-only) do_rpm= ;;
        --rpm-only) do_deb= ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        -*) echo "usage: $0 [--no-build] [--deb-only|--rpm-only] [OUTDIR]" >&2; exit 2 ;;
        *) out=$arg ;;
    esac
done
out=${out:-$repo/dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
version=$("$repo/packaging/version.sh")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/slurmgpu-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok   $*"; }
bad() { failed=$((failed + 1)); echo "FAIL $*"; }
# check DESCRIPTION COMMAND...: pass when the command succeeds
check() { local what=$1; shift; if "$@" >/dev/null 2>&1; then ok "$what"; else bad "$what"; fi; }
# has DESCRIPTION FILE REGEX: a line of FILE matches the extended regex
has() { if grep -Eq -- "$3" "$2"; then ok "$1"; else bad "$1 (no line matching /$3/)"; fi; }
hasnt() { if grep -Eq -- "$3" "$2"; then bad "$1 (a line matches /$3/)"; else ok "$1"; fi; }
# timed LOG COMMAND...: run it with its output in LOG, say how long it took
timed() {
    local log=$1 t0 rc=0; shift
    t0=$(date +%s)
    "$@" >"$log" 2>&1 || rc=$?
    echo "     ($(basename "$1") took $(( $(date +%s) - t0 )) s)"
    return $rc
}

# quick_loads_protocol PKG HOOK: the quick client, run through its hook symlink as a bare
# file (any python3, -I -S), loads localproto.py from beside the module the link resolves to.
quick_loads_protocol() {
    local py code
    py=$(command -v python3) || { echo "skip $1: no python3 to run the quick client"; return; }
    code='import sys; ns = {"__name__": "quickgate", "__package__": None, "__file__": sys.argv[1]}
exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), ns)
assert ns["protocol"]().__file__.endswith("/slurmgpu/localproto.py")'
    check "$1: the quick client loads localproto.py through its hook symlink" "$py" -I -S -c "$code" "$2"
}

hooks=(slurmgpu-prolog slurmgpu-epilog slurmgpu-healthcheck slurmgpu-taskprolog slurmgpu-taskprolog.py
       slurmgpu-quickgate slurmgpu-nightly-report)
units=(slurmgpu-agent.service slurmgpu-collector.service slurmgpu-report.service slurmgpu-report.timer
       slurmgpu-idle-validate.service slurmgpu-idle-validate.timer)

# ------------------------------------------------------------------------------- .deb
if [ -n "$do_deb" ]; then
    echo "== .deb"
    if [ -n "$build" ]; then
        timed "$tmp/deb-build.log" "$here/deb/build.sh" "$out" ||
            { tail -40 "$tmp/deb-build.log"; bad "packaging/deb/build.sh"; }
    fi
    deb=$(ls "$out"/slurmgpu_"$version"-*_all.deb 2>/dev/null | tail -n1)
    if [ -z "$deb" ]; then
        bad "a slurmgpu_${version}-*_all.deb in $out"
    else
        ok "built $(basename "$deb")"
        dpkg-deb -I "$deb" >"$tmp/deb-info"
        # "mode owner path [-> target]"
        dpkg-deb -c "$deb" | awk '{ $3=""; $4=""; $5=""; print }' | sed 's/  */ /g' >"$tmp/deb-list"
        dpkg-deb -e "$deb" "$tmp/deb-control"
        mkdir -p "$tmp/deb-root" && dpkg-deb -x "$deb" "$tmp/deb-root"
        has "deb: Architecture: all" "$tmp/deb-info" '^ Architecture: all$'
        for dep in 'python3 \(>= 3\.11\)' 'python3-zmq \(>= 24\)' 'python3-click \(>= 8\.1\)' \
                   'python3-structlog \(>= 22\.3\)' 'python3-msgpack \(>= 1\.0\)' \
                   'python3-prometheus-client \(>= 0\.16\)' 'python3-clustershell \(>= 1\.9\)'; do
            has "deb: Depends ${dep//\\/}" "$tmp/deb-info" "^ Depends:.*(^|[ ,])$dep"
        done
        hasnt "deb: no dependency on an nvidia-ml-py package" "$tmp/deb-info" '^ Depends:.*(nvidia|pynvml)'
        has "deb: Provides python3-pynvml (bundled)" "$tmp/deb-info" '^ Provides:.*python3-pynvml \(= '
        for f in /etc/default/slurmgpu /etc/logrotate.d/slurmgpu; do
            has "deb: conffile $f" "$tmp/deb-control/conffiles" "^$f\$"
        done
        hasnt "deb: slurmgpu.toml is not a conffile (postinst's: an upgrade never prompts)" \
            "$tmp/deb-control/conffiles" '^/etc/slurmgpu/slurmgpu\.toml$'
        has "deb postinst: writes slurmgpu.toml only where it is absent" "$tmp/deb-control/postinst" \
            'install -m 0644 /usr/share/slurmgpu/slurmgpu.toml'
        has "deb postrm: purge removes slurmgpu.toml" "$tmp/deb-control/postrm" 'rm -f /etc/slurmgpu/slurmgpu.toml'
        hasnt "deb: no Recommends (slurm-client is a Suggests)" "$tmp/deb-info" '^ Recommends:'
        has "deb: bash completion is click's" "$tmp/deb-root/usr/share/bash-completion/completions/slurmgpu" \
            'complete .*-F _slurmgpu_completion slurmgpu'
        has "deb: man page slurmgpu-config(1) documents config check" \
            <(zcat "$tmp/deb-root/usr/share/man/man1/slurmgpu-config.1.gz") '^\.SS slurmgpu config check$'
        check "deb: the alert rules pass promtool" promtool check rules "$tmp/deb-root/usr/share/slurmgpu/slurmgpu.rules.yml"
        for p in /usr/bin/slurmgpu /usr/lib/python3/dist-packages/slurmgpu/__init__.py \
                 /usr/lib/python3/dist-packages/slurmgpu/localproto.py \
                 /usr/lib/python3/dist-packages/slurmgpu/sim/fake_nvml.c \
                 /usr/lib/python3/dist-packages/slurmgpu/sim/cluster/__init__.py \
                 /usr/lib/python3/dist-packages/slurmgpu/data/xid_catalog.toml \
                 /usr/lib/python3/dist-packages/pynvml.py /usr/share/slurmgpu/slurmgpu.toml /etc/default/slurmgpu \
                 /usr/share/doc/slurmgpu/README.md /usr/share/doc/slurmgpu/docs/keys.md \
                 /usr/share/doc/slurmgpu/etc/slurm.conf.example /usr/share/doc/slurmgpu/etc/slurmgpu.example.toml \
                 /usr/share/doc/slurmgpu/copyright /etc/logrotate.d/slurmgpu \
                 /usr/share/slurmgpu/slurmgpu.rules.yml /usr/share/slurmgpu/grafana-dashboard.json \
                 /usr/share/bash-completion/completions/slurmgpu /usr/share/man/man1/slurmgpu.1.gz \
                 /usr/share/man/man1/slurmgpu-check.1.gz /usr/share/man/man1/slurmgpu-config.1.gz; do
            has "deb: $p" "$tmp/deb-list" "^-\S* root/root \.$p\$"
        done
        for h in "${hooks[@]}"; do
            case $h in
                slurmgpu-quickgate) has "deb: hook $h -> the quickgate module" "$tmp/deb-list" \
                    "^l\S* root/root \./usr/libexec/slurmgpu/$h -> \.\./\.\./lib/python3/dist-packages/slurmgpu/quickgate\.py\$" ;;
                slurmgpu-taskprolog.py) has "deb: hook $h -> the taskprolog module" "$tmp/deb-list" \
                    "^l\S* root/root \./usr/libexec/slurmgpu/$h -> \.\./\.\./lib/python3/dist-packages/slurmgpu/taskprolog\.py\$" ;;
                *) has "deb: hook $h (0755)" "$tmp/deb-list" "^-rwxr-xr-x root/root \./usr/libexec/slurmgpu/$h\$" ;;
            esac
        done
        for u in "${units[@]}"; do
            has "deb: unit $u" "$tmp/deb-list" "^-rw-r--r-- root/root \.(/usr)?/lib/systemd/system/$u\$"
        done
        for d in /etc/slurmgpu/keys /var/lib/slurmgpu /var/lib/slurmgpu/validations /var/spool/slurmgpu; do
            has "deb: $d root-only (0700)" "$tmp/deb-list" "^drwx------ root/root \.$d/\$"
        done
        has "deb: the drop-in directory /etc/slurmgpu/slurmgpu.d" "$tmp/deb-list" '^drwxr-xr-x root/root \./etc/slurmgpu/slurmgpu\.d/$'
        hasnt "deb: no /etc/slurmgpu/slurmgpu.toml in the payload" "$tmp/deb-list" ' \./etc/slurmgpu/slurmgpu\.toml$'
        hasnt "deb: no example.py from the nvidia-ml-py wheel" "$tmp/deb-list" 'dist-packages/example\.py'
        hasnt "deb: no __pycache__ shipped (py3compile at install)" "$tmp/deb-list" '__pycache__'
        has "deb: /etc/default/slurmgpu sets SLURMGPU_PYTHON" "$tmp/deb-root/etc/default/slurmgpu" \
            '^SLURMGPU_PYTHON=/usr/bin/python3$'
        has "deb: quickgate runs with Debian's python3" \
            "$tmp/deb-root/usr/lib/python3/dist-packages/slurmgpu/quickgate.py" '^#!/usr/bin/python3 -IS$'
        quick_loads_protocol "deb" "$tmp/deb-root/usr/libexec/slurmgpu/slurmgpu-quickgate"
        has "deb: pynvml.py is NVIDIA's" "$tmp/deb-root/usr/lib/python3/dist-packages/pynvml.py" \
            'Copyright \(c\) 2011-20[0-9]+, NVIDIA Corporation'
        has "deb: /usr/bin/slurmgpu runs /usr/bin/python3" "$tmp/deb-root/usr/bin/slurmgpu" '^#!/usr/bin/python3$'
        # Maintainer scripts: nothing enabled or started on install.
        post=$tmp/deb-control/postinst
        if [ "$(grep -c 'deb-systemd-helper enable' "$post")" = "$(grep -c 'was-enabled' "$post")" ]; then
            ok "deb postinst: units enabled only if they were (reinstall)"
        else
            bad "deb postinst: enables a unit on install"
        fi
        hasnt "deb postinst: starts no unit" "$post" 'deb-systemd-invoke (start|restart|\$_dh_action)'
        has "deb postinst: try-restarts running units on upgrade" "$post" 'deb-systemd-invoke try-restart'
        has "deb prerm: stops the units on removal" "$tmp/deb-control/prerm" 'deb-systemd-invoke stop'
        has "deb postrm: purge removes the state" "$tmp/deb-control/postrm" 'rm -rf /var/lib/slurmgpu /var/spool/slurmgpu'
        if [ -e "$tmp/deb-control/preinst" ]; then
            hasnt "deb preinst: no stop before an upgrade" "$tmp/deb-control/preinst" 'deb-systemd-invoke stop'
        else
            ok "deb preinst: none (no stop before an upgrade)"
        fi
    fi
fi

# ------------------------------------------------------------------------------- RPM
if [ -n "$do_rpm" ]; then
    echo "== RPM"
    if [ -n "$build" ]; then
        timed "$tmp/rpm-build.log" "$here/rpm/build.sh" "$out" ||
            { tail -40 "$tmp/rpm-build.log"; bad "packaging/rpm/build.sh"; }
    fi
    rpmf=$(ls "$out"/slurmgpu-"$version"-*.rpm 2>/dev/null | grep -v '\.src\.rpm$' | tail -n1)
    if [ -z "$rpmf" ]; then
        bad "a slurmgpu-${version}-*.rpm in $out"
    else
        ok "built $(basename "$rpmf")"
        rpm -qlvp "$rpmf" 2>/dev/null | awk '{ $2=""; $4=""; $5=""; $6=""; $7=""; $8=""; print }' |
            sed 's/  */ /g' >"$tmp/rpm-list"
        rpm -qp --scripts "$rpmf" >"$tmp/rpm-scripts" 2>/dev/null
        rpm -qp --requires "$rpmf" >"$tmp/rpm-requires" 2>/dev/null
        rpm -qp --provides "$rpmf" >"$tmp/rpm-provides" 2>/dev/null
        rpm -qp --qf '[%{FILENAMES} %{FILEFLAGS:fflags}\n]' "$rpmf" >"$tmp/rpm-flags" 2>/dev/null
        mkdir -p "$tmp/rpm-root"
        command -v cpio >/dev/null || echo "(no cpio: the RPM's files cannot be unpacked; apt-get install cpio)"
        (cd "$tmp/rpm-root" && rpm2cpio "$rpmf" | cpio -idm --quiet)
        # The %post scriptlet alone
        sed -n '/^postinstall scriptlet/,/^[a-z]*uninstall scriptlet/p' "$tmp/rpm-scripts" >"$tmp/rpm-post"
        for p in /usr/bin/slurmgpu /usr/lib/slurmgpu/venv/bin/slurmgpu /usr/lib/slurmgpu/venv/pyvenv.cfg \
                 /etc/slurmgpu/slurmgpu.toml /etc/sysconfig/slurmgpu /usr/share/doc/slurmgpu/README.md \
                 /usr/share/doc/slurmgpu/etc/slurm.conf.example /usr/share/doc/slurmgpu/etc/slurmgpu.example.toml \
                 /etc/logrotate.d/slurmgpu /usr/share/slurmgpu/slurmgpu.rules.yml \
                 /usr/share/slurmgpu/grafana-dashboard.json /usr/share/bash-completion/completions/slurmgpu; do
            has "rpm: $p" "$tmp/rpm-list" "^\S+ root $p( -> .*)?\$"
        done
        for m in slurmgpu/__init__.py slurmgpu/localproto.py slurmgpu/sim/fake_nvml.c slurmgpu/sim/cluster/__init__.py \
                 pynvml.py zmq/__init__.py structlog/__init__.py \
                 click/__init__.py ClusterShell/__init__.py msgpack/__init__.py prometheus_client/__init__.py \
                 yaml/__init__.py; do
            has "rpm: venv holds $m" "$tmp/rpm-list" "^-\S+ root /usr/lib/slurmgpu/venv/lib/python3\.[0-9]+/site-packages/$m\$"
        done
        hasnt "rpm: no pip in the venv" "$tmp/rpm-list" 'site-packages/pip/'
        for h in "${hooks[@]}"; do
            case $h in
                slurmgpu-quickgate|slurmgpu-taskprolog.py)
                    has "rpm: hook $h -> the venv's module" "$tmp/rpm-list" \
                        "^l\S+ root /usr/libexec/slurmgpu/$h -> \.\./\.\./lib/slurmgpu/venv/lib/python3\.[0-9]+/site-packages/slurmgpu/${h#slurmgpu-}" ;;
                *) has "rpm: hook $h (0755)" "$tmp/rpm-list" "^-rwxr-xr-x root /usr/libexec/slurmgpu/$h\$" ;;
            esac
        done
        check "rpm: hook symlinks resolve inside the package" test -f "$tmp/rpm-root/usr/libexec/slurmgpu/slurmgpu-quickgate" -a -f "$tmp/rpm-root/usr/libexec/slurmgpu/slurmgpu-taskprolog.py" -a -f "$tmp/rpm-root/usr/bin/slurmgpu"
        for u in "${units[@]}"; do
            has "rpm: unit $u" "$tmp/rpm-list" "^-rw-r--r-- root /usr/lib/systemd/system/$u\$"
        done
        for d in /etc/slurmgpu/keys /var/lib/slurmgpu /var/lib/slurmgpu/validations /var/spool/slurmgpu; do
            has "rpm: $d root-only (0700)" "$tmp/rpm-list" "^drwx------ root $d\$"
        done
        for f in /etc/slurmgpu/slurmgpu.toml /etc/sysconfig/slurmgpu /etc/logrotate.d/slurmgpu; do
            has "rpm: $f is %config(noreplace)" "$tmp/rpm-flags" "^$f cn\$"
        done
        has "rpm: the drop-in directory /etc/slurmgpu/slurmgpu.d" "$tmp/rpm-list" '^d\S+ root /etc/slurmgpu/slurmgpu\.d$'
        has "rpm: man page slurmgpu-config(1)" "$tmp/rpm-list" '^-\S+ root /usr/share/man/man1/slurmgpu-config\.1(\.gz)?$'
        has "rpm: /etc/sysconfig/slurmgpu sets SLURMGPU_PYTHON" "$tmp/rpm-root/etc/sysconfig/slurmgpu" \
            '^SLURMGPU_PYTHON=/usr/lib/slurmgpu/venv/bin/python$'
        has "rpm: /usr/bin/slurmgpu runs the venv's python" "$tmp/rpm-root/usr/lib/slurmgpu/venv/bin/slurmgpu" \
            '^#!/usr/lib/slurmgpu/venv/bin/python'
        has "rpm: quickgate runs with the venv's python" \
            "$(ls "$tmp"/rpm-root/usr/lib/slurmgpu/venv/lib/python3.*/site-packages/slurmgpu/quickgate.py 2>/dev/null | head -n1)" \
            '^#!/usr/lib/slurmgpu/venv/bin/python -IS$'
        quick_loads_protocol "rpm" "$tmp/rpm-root/usr/libexec/slurmgpu/slurmgpu-quickgate"
        hasnt "rpm: no buildroot path left" "$tmp/rpm-root/usr/lib/slurmgpu/venv/pyvenv.cfg" 'BUILDROOT|rpmbuild'
        # Scriptlets: presets on install (RHEL: disabled), disable+stop on erase, try-restart on upgrade.
        has "rpm %post: systemd preset (no enable)" "$tmp/rpm-scripts" 'preset slurmgpu-agent\.service|install-system-units slurmgpu-agent\.service'
        hasnt "rpm %post: no systemctl enable/start" "$tmp/rpm-post" 'systemctl .*(enable|start|restart) '
        has "rpm %preun: disable --now on erase" "$tmp/rpm-scripts" 'disable --now slurmgpu-agent|remove-system-units slurmgpu-agent'
        has "rpm %postun: try-restart on upgrade" "$tmp/rpm-scripts" 'try-restart slurmgpu-agent|mark-restart-system-units slurmgpu-agent'
        has "rpm: Requires python3.11" "$tmp/rpm-requires" '^/usr/bin/python3\.[0-9]+$'
        hasnt "rpm: no venv library leaks into Requires" "$tmp/rpm-requires" '^(lib.*\.so|python3\.?[0-9]*dist)'
        hasnt "rpm: no venv library leaks into Provides" "$tmp/rpm-provides" '\.so|^python3\.?[0-9]*dist'
        has "rpm: Provides bundled(python3dist(pyzmq))" "$tmp/rpm-provides" '^bundled\(python3dist\(pyzmq\)\) = '
        # Smoke: the venv, unpacked elsewhere, runs (its interpreter is the system's python3.X).
        venv=$tmp/rpm-root/usr/lib/slurmgpu/venv
        interp=$(readlink "$venv/bin/python3"* 2>/dev/null | grep '^/' | head -n1)
        if [ -n "$interp" ] && [ -x "$interp" ]; then
            check "rpm venv: imports slurmgpu and every bundled module" "$venv/bin/python" -c \
                'import slurmgpu.cli, pynvml, zmq, structlog, click, ClusterShell.NodeSet, msgpack, prometheus_client, yaml'
            if v=$("$venv/bin/python" -m slurmgpu --version 2>&1) && [ "$v" = "slurmgpu, version $version" ]; then
                ok "rpm venv: slurmgpu --version ($v)"
            else
                bad "rpm venv: slurmgpu --version: $v"
            fi
            check "rpm venv: slurmgpu checks list" "$venv/bin/python" -m slurmgpu checks list
        else
            echo "skip rpm venv smoke run: its interpreter ${interp:-?} is not on this machine"
        fi
    fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
