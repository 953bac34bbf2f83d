#!/usr/bin/env python3
"""Write the three Slurm hook wrappers (prolog/slurmgpu-prolog, epilog/slurmgpu-epilog,
daemon/slurmgpu-healthcheck) from one template: they must stay self-contained (a wrapper
that sources a missing helper would exit non-zero, and Slurm would drain the node), so
they are generated rather than shared. tests/test_hook_wrappers.py checks they match.

    python tools/gen_hook_wrappers.py
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WRAPPERS = {"prolog": "prolog/slurmgpu-prolog", "epilog": "epilog/slurmgpu-epilog",
            "healthcheck": "daemon/slurmgpu-healthcheck", "taskprolog": "prolog/slurmgpu-taskprolog"}
DEFAULTS = """\
for slurmgpu_defaults in /etc/default/slurmgpu /etc/sysconfig/slurmgpu; do
    # (a file that does not parse must not kill this shell: try it in a subshell first)
    if [ -r "$slurmgpu_defaults" ] && (. "$slurmgpu_defaults") >/dev/null 2>&1; then
        . "$slurmgpu_defaults"
    fi
done
"""
TASKPROLOG = """#!/bin/sh
# Slurm TaskProlog= entry point, installed as /usr/libexec/slurmgpu/slurmgpu-taskprolog.
# Prints `export SLURMGPU_CHECKPOINT_FILE=...` for the task (slurmgpu-taskprolog.py).
# Where slurmgpu is: /etc/default/slurmgpu (Debian) or /etc/sysconfig/slurmgpu (RHEL) may
# set SLURMGPU_PYTHON; otherwise the packaged paths. It never fails a task: exit 0.
""" + DEFAULTS + """\
slurmgpu_script=$(dirname "$0")/slurmgpu-taskprolog.py
for slurmgpu_py in "${SLURMGPU_PYTHON:-}" /usr/lib/slurmgpu/venv/bin/python /usr/bin/python3 python3; do
    if [ -n "$slurmgpu_py" ] && command -v "$slurmgpu_py" >/dev/null 2>&1; then
        # (the script itself always exits 0: non-zero means this interpreter cannot run it)
        "$slurmgpu_py" -I -S "$slurmgpu_script" && exit 0
    fi
done
exit 0
"""

HEAD = {
    "prolog": ("Prolog=", "slurmgpu-prolog",
               "#  3. When slurmgpu cannot start at all, [prolog] on_error decides (fail-open, the\n"
               "#     default: exit 0 and one loud line on stderr and in syslog). Slurm drains a\n"
               "#     node whose prolog exits non-zero: never because of slurmgpu's own install.\n"),
    "epilog": ("Epilog=", "slurmgpu-epilog",
               "#  3. When slurmgpu cannot start at all, [epilog] on_error decides (fail-open, the\n"
               "#     default: exit 0 and one loud line on stderr and in syslog). Slurm drains a\n"
               "#     node whose epilog exits non-zero: never because of slurmgpu's own install.\n"),
    "healthcheck": ("HealthCheckProgram=", "slurmgpu-healthcheck",
                    "#  3. When slurmgpu cannot start at all: one loud line on stderr and in syslog,\n"
                    "#     exit 3 (unknown); the node is left as it is.\n"),
}

def render(phase: str) -> str:
    if phase == "taskprolog":
        return TASKPROLOG
    key, name, why = HEAD[phase]
    extra = ""
    if phase == "healthcheck":
        extra = ('# Slurm gives a health check only SLURMD_NODENAME: no SLURM_CONF either.\n'
                 'SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}\n')
    return f'''#!/bin/sh
# Slurm {key} entry point, installed as /usr/libexec/slurmgpu/{name}.
#  1. Where slurmgpu is: /etc/default/slurmgpu (Debian) or /etc/sysconfig/slurmgpu (RHEL)
#     may set SLURMGPU_PYTHON (an interpreter that can import slurmgpu), SLURMGPU_CONFIG,
#     SLURM_CONF or SLURMGPU_BIN; otherwise the packaged paths.
#  2. slurmgpu-quickgate (standard library only) asks the node's agent and, when it does
#     not answer, runs the full `slurmgpu {phase}`.
{why}# Slurm 22.05 runs hooks with no PATH at all: give slurmgpu (and scontrol) a sane one.
slurmgpu_phase={phase}
{DEFAULTS}PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${{PATH:+:$PATH}}
{extra}export PATH SLURMGPU_PYTHON SLURMGPU_BIN SLURMGPU_CONFIG SLURM_CONF
if [ -n "${{SLURMGPU_QUICKGATE:-}}" ] && command -v ${{SLURMGPU_QUICKGATE%% *}} >/dev/null 2>&1; then
    exec $SLURMGPU_QUICKGATE $slurmgpu_phase "$@"
fi
case $0 in */*) slurmgpu_quick=${{0%/*}}/slurmgpu-quickgate ;; *) slurmgpu_quick=./slurmgpu-quickgate ;; esac
# The quick client runs from its cached bytecode (beside its real file): a script would be
# compiled again on every job.
slurmgpu_load='import os, sys
from importlib.machinery import SourceFileLoader
quick = type(sys)("slurmgpu_quickgate")
quick.__file__ = os.path.realpath(sys.argv[1])
SourceFileLoader(quick.__name__, quick.__file__).exec_module(quick)
sys.exit(quick.main(sys.argv[2:]))'
slurmgpu_tried=
if [ -r "$slurmgpu_quick" ]; then
    # Each interpreter in turn runs the quick client, which answers with its exit code plus
    # 100 ($SLURMGPU_WRAPPER): any other status is an interpreter that could not run it
    # (/bin/false, a shell, the slurmgpu script, a Python too old): the next one is tried.
    for slurmgpu_py in "${{SLURMGPU_PYTHON:-}}" /usr/lib/slurmgpu/venv/bin/python /usr/bin/python3 python3; do
        [ -n "$slurmgpu_py" ] && command -v "$slurmgpu_py" >/dev/null 2>&1 || continue
        SLURMGPU_WRAPPER=1 "$slurmgpu_py" -I -S -c "$slurmgpu_load" "$slurmgpu_quick" $slurmgpu_phase "$@"
        slurmgpu_code=$?
        [ "$slurmgpu_code" -ge 100 ] && [ "$slurmgpu_code" -le 227 ] && exit $((slurmgpu_code - 100))
        slurmgpu_tried="$slurmgpu_tried $slurmgpu_py:$slurmgpu_code"
    done
fi
# No interpreter to run even the quick client: follow on_error from the config's text.
slurmgpu_policy=$(sed -n "/^[[:space:]]*\\[$slurmgpu_phase\\]/,/^[[:space:]]*\\[[^]]*\\]/s/^[[:space:]]*on_error[[:space:]]*=[[:space:]]*[\\"']\\(fail-closed\\)[\\"'].*/\\1/p" \\
    "${{SLURMGPU_CONFIG:-/etc/slurmgpu/slurmgpu.toml}}" 2>/dev/null)
slurmgpu_action=fail-open slurmgpu_code=0
[ "$slurmgpu_policy" = fail-closed ] && slurmgpu_action=fail-closed slurmgpu_code=1
[ "$slurmgpu_phase" = healthcheck ] && slurmgpu_action=none slurmgpu_code=3
slurmgpu_line="{{\\"event\\": \\"${{slurmgpu_phase}}_decision\\", \\"level\\": \\"error\\", \\"phase\\": \\"$slurmgpu_phase\\", \\"action\\": \\"$slurmgpu_action\\", \\"path\\": \\"none\\", \\"error\\": \\"cannot run slurmgpu: no Python 3.8+ to run $slurmgpu_quick (tried:${{slurmgpu_tried:- none}}; set SLURMGPU_PYTHON in /etc/default/slurmgpu)\\"}}"
echo "$slurmgpu_line" >&2
logger -t slurmgpu -p daemon.err -- "$slurmgpu_line" 2>/dev/null
exit $slurmgpu_code
'''

if __name__ == "__main__":
    for phase, path in WRAPPERS.items():
        (REPO / path).write_text(render(phase))
