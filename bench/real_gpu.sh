#!/usr/bin/env bash
# bench/real_gpu.sh: one prepared run on a real NVIDIA GPU node (issue 10, item 6).
#
#   bench/real_gpu.sh            # on the GPU node, as root, from a checkout (not installed)
#   bench/real_gpu.sh --sim      # anywhere: the same steps against the fake libnvidia-ml.so.1
#   OUT=/some/dir IDLE_S=60 LOAD_S=20 bench/real_gpu.sh
#
# Records the node (nvidia-smi -q -x, nvidia-smi -L, versions, `slurmgpu sim record`, an
# NVML probe of the calls issue 10 is about), times `check`, the cold and the warm prolog,
# runs the agent idle and under a GPU load (CPU, RSS, spooled messages by type, the raw
# NVML clock-event rate next to it), provokes an application XID 31 on GPU 0 and captures
# what the agent, the kernel log and `slurmgpu check --xid 31:0` made of it, runs `slurmgpu
# validate --tier quick` (each test's result and duration, the time inside the tools, the
# overhead outside them: process start, CUDA context per GPU, parsing) and
# bench/gemm_probe.py (the raw GEMM rate beside the probe's, gemm-probe.json). Everything
# lands in $OUT (default bench/real-gpu-out/<host>-<UTC date>/): commit it as fixtures.
# summary.md there has the tables.
#
# Robust by construction: every step runs under `timeout`, a failed step is logged (run.log,
# steps.jsonl, logs/<step>.log) and the script goes on; the whole run is capped at
# TOTAL_BUDGET_S (default 460 s: a lent GPU machine may have ~10 minutes in all). Nothing is
# installed system-wide; no internet is needed when a usable Python is found (see below).
#
# Python for slurmgpu (3.11+, the repository on PYTHONPATH; first that works wins):
#   $REAL_GPU_PYTHON; $VENV_GPU (default .venv-gpu) from an earlier run; the carried .venv
#   ($CARRIED_VENV, default .venv);
#   a system python3 with the carried .venv's site-packages (same minor version); a system
#   python3 that already has the dependencies; a new venv (--system-site-packages) filled by
#   `pip install --no-index` (from $WHEELHOUSE, default bench/wheelhouse, when present),
#   then `pip install -e .` online (PIP_ONLINE=0 skips it). Each attempt and why it failed
#   is in run.log and env.json. Without one, the NVML-only, load and XID steps still run.
#
# Settings (environment): IDLE_S (60; --sim 5), LOAD_S (20; --sim 3), TIMING_RUNS (10),
# WARM_RUNS (20), FALLBACK_RUNS (5), AGENT_INTERVAL_S (15), LOAD_GPUS (all | 0,1,..),
# LOAD_METHOD (auto | torch | cupy | cuda), LOAD_PYTHON, LOAD_READY_TIMEOUT_S (120),
# XID (1; 0 skips the provocation), XID_GPU (0), XID_ADDR (0xdead00000000), XID_WAIT_S (5),
# VALIDATE_BURN_S (5; --sim 0.2: each `validate --tier quick` test's burn/bandwidth loop),
# DMON (1: nvidia-smi dmon during the phases), TOTAL_BUDGET_S (460), NODE (short host name),
# SIM_SCENARIO (h100-sxm-8), KEEP_WORK (0: remove the temp dir).
#
# --sim (or REAL_GPU_SIM=1): the fake libnvidia-ml.so.1 (`slurmgpu sim env SIM_SCENARIO`,
# on a copy of the scenario) instead of the driver; no nvidia-smi, no real load (the
# simulator's per-GPU "load" flag raises its clock-event rate instead), no real XID (an XID 31
# NVML event and a kernel-log record are injected): it checks the script end to end.
set -uo pipefail

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

SIM=${REAL_GPU_SIM:-0}
for arg in "$@"; do
    case $arg in
        --sim) SIM=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $arg" >&2; usage >&2; exit 2 ;;
    esac
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || exit 1
HELPER=$REPO/bench/real_gpu_helper.py
cd "$REPO" || exit 1

if [ "$SIM" = 1 ]; then MODE=sim; def_idle=5; def_load=3; def_burn=0.2; else MODE=real; def_idle=60; def_load=20; def_burn=5; fi
IDLE_S=${IDLE_S:-$def_idle}
VALIDATE_BURN_S=${VALIDATE_BURN_S:-$def_burn}
LOAD_S=${LOAD_S:-$def_load}
TIMING_RUNS=${TIMING_RUNS:-10}
WARM_RUNS=${WARM_RUNS:-20}
FALLBACK_RUNS=${FALLBACK_RUNS:-5}
AGENT_INTERVAL_S=${AGENT_INTERVAL_S:-15}
LOAD_GPUS=${LOAD_GPUS:-all}
LOAD_METHOD=${LOAD_METHOD:-auto}
LOAD_READY_TIMEOUT_S=${LOAD_READY_TIMEOUT_S:-120}
XID=${XID:-1}
XID_GPU=${XID_GPU:-0}
XID_ADDR=${XID_ADDR:-0xdead00000000}
XID_WAIT_S=${XID_WAIT_S:-5}
DMON=${DMON:-1}
TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-460}
SIM_SCENARIO=${SIM_SCENARIO:-h100-sxm-8}
PIP_ONLINE=${PIP_ONLINE:-1}
WHEELHOUSE=${WHEELHOUSE:-$REPO/bench/wheelhouse}
VENV_GPU=${VENV_GPU:-$REPO/.venv-gpu}
CARRIED_VENV=${CARRIED_VENV:-$REPO/.venv}
HOST=$(hostname -s 2>/dev/null || hostname 2>/dev/null || echo node)
NODE=${NODE:-$(printf '%s' "$HOST" | tr -c 'A-Za-z0-9._-' '-' | cut -c1-60)}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
if [ -z "${OUT:-}" ]; then
    OUT=$REPO/bench/real-gpu-out/$HOST-$STAMP
    [ "$SIM" = 1 ] && OUT=$OUT-sim
fi
mkdir -p "$OUT/logs" "$OUT/configs" || { echo "cannot create $OUT" >&2; exit 1; }
OUT=$(cd "$OUT" && pwd)
LOGS=$OUT/logs
WORK=$(mktemp -d /tmp/real-gpu.XXXXXX) || exit 1
START=$SECONDS
: >"$OUT/steps.jsonl"

# ------------------------------------------------------------------------------ plumbing

log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$OUT/run.log"; }
json_str() {
    local s=${1//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\t'/ }
    s=${s//$'\r'/}
    printf '"%s"' "$s"
}
now_s() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now_s)" 'BEGIN { printf "%.2f", b - a }'; }
budget_left() { echo $((TOTAL_BUDGET_S - (SECONDS - START))); }
record_step() {  # NAME STATUS RC SECONDS NOTE
    printf '{"step": %s, "status": %s, "rc": %s, "seconds": %s, "note": %s}\n' "$(json_str "$1")" \
        "$(json_str "$2")" "${3:-null}" "${4:-null}" "$(json_str "${5:-}")" >>"$OUT/steps.jsonl"
}
skip() { log "SKIP $1: $2"; record_step "$1" skipped null 0 "$2"; }
alive() {  # PID: running (not gone, not a zombie)
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

# step NAME TIMEOUT_S [--stdout FILE] [--ok CODES] -- COMMAND...
# Runs COMMAND under timeout (capped by what is left of TOTAL_BUDGET_S); stdout and stderr
# go to logs/NAME.log (stdout to FILE with --stdout). Returns 0 when the exit code is in
# CODES (default 0). Never aborts the script.
step() {
    local name=$1 limit=$2 stdout_file="" ok_codes=0 left rc=0 t0 dt status note=""
    shift 2
    while [ $# -gt 0 ]; do
        case $1 in
            --stdout) stdout_file=$2; shift 2 ;;
            --ok) ok_codes=$2; shift 2 ;;
            --) shift; break ;;
            *) break ;;
        esac
    done
    left=$(budget_left)
    if [ "$left" -lt 5 ]; then
        skip "$name" "time budget spent (TOTAL_BUDGET_S=$TOTAL_BUDGET_S)"
        return 125
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    log "step $name (timeout ${limit}s)"
    printf '$ %s\n' "$*" >>"$LOGS/$name.log"
    t0=$(now_s)
    if [ -n "$stdout_file" ]; then
        timeout -k 5 "$limit" "$@" >"$stdout_file" 2>>"$LOGS/$name.log" || rc=$?
    else
        timeout -k 5 "$limit" "$@" >>"$LOGS/$name.log" 2>&1 || rc=$?
    fi
    dt=$(since "$t0")
    if [[ ",$ok_codes," == *",$rc,"* ]]; then
        status=ok
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        status=timeout
        note="killed after ${limit} s"
    else
        status=failed
        note="exit $rc: $(tail -n 3 "$LOGS/$name.log" 2>/dev/null | tr '\n' ' ' | cut -c1-300)"
    fi
    record_step "$name" "$status" "$rc" "$dt" "$note"
    if [ "$status" = ok ]; then
        log "  ok (${dt} s)"
        return 0
    fi
    log "  $status (${dt} s): $note [logs/$name.log]"
    return 1
}

BG_PIDS=()
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
    local pid
    for pid in ${BG_PIDS[@]+"${BG_PIDS[@]}"}; do
        alive "$pid" && kill -TERM "$pid" 2>/dev/null
    done
    for pid in ${BG_PIDS[@]+"${BG_PIDS[@]}"}; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do alive "$pid" || break; sleep 0.2; done
        alive "$pid" && kill -KILL "$pid" 2>/dev/null
    done
    if [ "${KEEP_WORK:-0}" = 1 ]; then echo "temp files kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM HUP

keep_log() {  # SRC DEST: copy a log, only head and tail when it is long
    local n
    [ -f "$1" ] || return 0
    n=$(wc -l <"$1")
    if [ "$n" -gt 4000 ]; then
        { head -n 1000 "$1"; echo "... ($((n - 2000)) lines left out of $n) ..."; tail -n 1000 "$1"; } >"$2"
    else
        cp "$1" "$2"
    fi
}

log "bench/real_gpu.sh: mode $MODE, host $HOST, node name $NODE, output $OUT"
log "IDLE_S=$IDLE_S LOAD_S=$LOAD_S TIMING_RUNS=$TIMING_RUNS WARM_RUNS=$WARM_RUNS TOTAL_BUDGET_S=$TOTAL_BUDGET_S"

# ------------------------------------------------------------------------ Python set-up

SETUP_JSONL=$WORK/setup.jsonl
: >"$SETUP_JSONL"
PY="" PY_EXTRA="" PY_HOW=""
setup_note() {  # TRY RESULT DETAIL
    printf '{"try": %s, "result": %s, "detail": %s}\n' "$(json_str "$1")" "$(json_str "$2")" \
        "$(json_str "$3")" >>"$SETUP_JSONL"
    log "  python: $1: $2${3:+ - $3}"
}
system_pythons() {  # distinct interpreters on this node, python3 first
    local p r seen=" "
    for p in python3 python3.13 python3.12 python3.11 /usr/bin/python3 /usr/local/bin/python3 \
             /opt/conda/bin/python3; do
        p=$(command -v "$p" 2>/dev/null) || continue
        r=$(readlink -f "$p")
        case $seen in *" $r "*) continue ;; esac
        seen="$seen$r "
        echo "$p"
    done
}
try_python() {  # LABEL PYTHON [EXTRA_PYTHONPATH]: can it run slurmgpu from this checkout?
    local label=$1 py=$2 extra=${3:-} out rc=0
    if ! command -v "$py" >/dev/null 2>&1; then
        setup_note "$label" missing "$py"
        return 1
    fi
    out=$(PYTHONPATH="$REPO${extra:+:$extra}" timeout 90 "$py" -c 'import sys
assert sys.version_info >= (3, 11), "Python %d.%d: slurmgpu needs 3.11+" % sys.version_info[:2]
import pynvml, click, msgpack, structlog, slurmgpu.cli
print(sys.version.split()[0])' 2>&1) || rc=$?
    if [ "$rc" -eq 0 ]; then
        PY=$(command -v "$py")
        PY_EXTRA=$extra
        PY_HOW="$label, Python $out"
        setup_note "$label" ok "$py (Python $out)"
        return 0
    fi
    setup_note "$label" failed "$py: $(printf '%s' "$out" | tail -n 2 | tr '\n' ' ' | cut -c1-300)"
    return 1
}
install_try() {  # LABEL TIMEOUT COMMAND...
    local label=$1 limit=$2 rc=0
    shift 2
    log "  python: $label ..."
    printf '$ %s\n' "$*" >>"$LOGS/python-setup.log"
    timeout -k 5 "$limit" "$@" >>"$LOGS/python-setup.log" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then
        setup_note "$label" ok ""
    else
        setup_note "$label" failed "exit $rc: $(tail -n 2 "$LOGS/python-setup.log" | tr '\n' ' ' | cut -c1-300)"
    fi
    return "$rc"
}
setup_python() {
    local py ver site base="" deps findlinks=() pip
    if [ -n "${REAL_GPU_PYTHON:-}" ]; then try_python "REAL_GPU_PYTHON" "$REAL_GPU_PYTHON" && return 0; fi
    if [ -e "$VENV_GPU/bin/python" ]; then try_python "existing $VENV_GPU" "$VENV_GPU/bin/python" && return 0; fi
    if [ -e "$CARRIED_VENV/bin/python" ]; then
        try_python "carried .venv" "$CARRIED_VENV/bin/python" && return 0
    else
        setup_note "carried .venv" missing "$CARRIED_VENV/bin/python"
    fi
    for py in $(system_pythons); do
        ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
        site=$CARRIED_VENV/lib/python$ver/site-packages
        if [ -d "$site" ]; then
            try_python "system $py + carried .venv site-packages" "$py" "$site" && return 0
        fi
        try_python "system $py" "$py" && return 0
    done
    for py in $(system_pythons); do
        if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then base=$py; break; fi
    done
    if [ -z "$base" ]; then
        setup_note "new venv" failed "no Python 3.11+ on this node"
        return 1
    fi
    deps=$("$base" "$HELPER" deps "$REPO/pyproject.toml" | tr '\n' ' ')
    if [ -d "$WHEELHOUSE" ]; then findlinks=(--find-links "$WHEELHOUSE"); else
        setup_note "wheelhouse" missing "$WHEELHOUSE (pip --no-index can only use what is installed)"
    fi
    if install_try "$base -m venv --system-site-packages $VENV_GPU" 120 \
            "$base" -m venv --system-site-packages "$VENV_GPU"; then
        py=$VENV_GPU/bin/python
        pip=("$py" -m pip --disable-pip-version-check)
        # shellcheck disable=SC2086  # deps: one word per requirement
        { install_try "pip install --no-index -e ." 120 "${pip[@]}" install --no-index \
              ${findlinks[@]+"${findlinks[@]}"} --no-build-isolation -e "$REPO" \
              && try_python "new venv (--no-index -e .)" "$py"; } && return 0
        # shellcheck disable=SC2086
        { install_try "pip install --no-index <dependencies>" 120 "${pip[@]}" install --no-index \
              ${findlinks[@]+"${findlinks[@]}"} $deps && try_python "new venv (--no-index deps)" "$py"; } && return 0
        if [ "$PIP_ONLINE" = 1 ]; then
            { install_try "pip install -e . (online)" 240 "${pip[@]}" install --timeout 10 --retries 1 -e "$REPO" \
                  && try_python "new venv (online)" "$py"; } && return 0
        fi
    else
        # No venv module (Debian without python3-venv): dependencies into a directory.
        # shellcheck disable=SC2086
        { install_try "pip install --no-index --target" 120 "$base" -m pip install --no-index \
              ${findlinks[@]+"${findlinks[@]}"} --target "$WORK/pydeps" $deps \
              && try_python "$base + pip --target (--no-index)" "$base" "$WORK/pydeps"; } && return 0
        if [ "$PIP_ONLINE" = 1 ]; then
            # shellcheck disable=SC2086
            { install_try "pip install --target (online)" 240 "$base" -m pip install --timeout 10 --retries 1 \
                  --target "$WORK/pydeps" $deps && try_python "$base + pip --target (online)" "$base" "$WORK/pydeps"; } \
                && return 0
        fi
    fi
    return 1
}

log "== Python for slurmgpu"
t0=$(now_s)
if setup_python; then
    export PYTHONPATH="$REPO${PY_EXTRA:+:$PY_EXTRA}"
    HPY=$PY
    SG=("$PY" -m slurmgpu)
    record_step python-setup ok 0 "$(since "$t0")" "$PY_HOW"
else
    PY_HOW="none: every attempt failed (env.json python_setup_attempts, logs/python-setup.log)"
    record_step python-setup failed 1 "$(since "$t0")" "$PY_HOW"
    log "!! no Python can run slurmgpu here: the slurmgpu steps are skipped; NVML probe, load and XID still run"
    HPY=""
    for py in $(system_pythons); do
        if "$py" -c 'import pynvml' >/dev/null 2>&1; then HPY=$py; break; fi
    done
    [ -n "$HPY" ] || HPY=$(system_pythons | head -n 1)
    SG=()
fi
NO_SG="no Python can run slurmgpu on this node (see python-setup in env.json)"
if [ -z "$HPY" ]; then
    log "!! no python3 at all: only nvidia-smi can be recorded"
fi
have_sg() { [ ${#SG[@]} -gt 0 ]; }
have_hpy() { [ -n "$HPY" ]; }

# ------------------------------------------------------------------------------ sim mode

if [ "$SIM" = 1 ]; then
    log "== sim mode: scenario $SIM_SCENARIO through the fake libnvidia-ml.so.1"
    if ! have_sg; then
        log "sim mode needs a Python that runs slurmgpu; giving up"
        exit 1
    fi
    if simenv=$(timeout 300 "${SG[@]}" sim env "$SIM_SCENARIO" 2>>"$LOGS/sim-env.log"); then
        eval "$simenv"
        cp "$SLURMGPU_SIM_SCENARIO" "$WORK/scenario.json"  # events are injected into this copy
        export SLURMGPU_SIM_SCENARIO=$WORK/scenario.json
        export SLURMGPU_NVML_LIBRARY
        : >"$WORK/kmsg"
        export SLURMGPU_KMSG=$WORK/kmsg
        record_step sim-env ok 0 0 "$SLURMGPU_NVML_LIBRARY, scenario $SIM_SCENARIO"
    else
        record_step sim-env failed 1 0 "slurmgpu sim env $SIM_SCENARIO failed (logs/sim-env.log)"
        log "cannot set up the simulator (logs/sim-env.log)"
        exit 1
    fi
fi

# ------------------------------------------------------------------- 1. record the node

log "== 1. record the node"
DRIVER="" CUDA_VERSION=""
if [ "$SIM" = 1 ]; then
    skip nvidia-smi "sim mode: no nvidia-smi (the fake NVML library is not a driver)"
elif ! command -v nvidia-smi >/dev/null 2>&1; then
    skip nvidia-smi "nvidia-smi not found on PATH"
else
    step nvidia-smi-q-xml 90 --stdout "$OUT/nvidia-smi-q.xml" -- nvidia-smi -q -x
    step nvidia-smi-L 30 --stdout "$OUT/nvidia-smi-L.txt" -- nvidia-smi -L
    step nvidia-smi 30 --stdout "$OUT/nvidia-smi.txt" -- nvidia-smi
    step nvidia-smi-query 30 --stdout "$OUT/nvidia-smi-query.csv" -- nvidia-smi \
        --query-gpu=index,name,pci.bus_id,driver_version,vbios_version,persistence_mode,temperature.gpu,power.draw,clocks.sm,clocks.max.sm \
        --format=csv
    DRIVER=$(grep -o 'Driver Version: *[0-9.]*' "$OUT/nvidia-smi.txt" 2>/dev/null | head -n 1 | awk '{print $NF}')
    CUDA_VERSION=$(grep -o 'CUDA Version: *[0-9.]*' "$OUT/nvidia-smi.txt" 2>/dev/null | head -n 1 | awk '{print $NF}')
    log "driver ${DRIVER:-?}, CUDA ${CUDA_VERSION:-?}"
fi

NGPU=""
if have_hpy; then
    NGPU=$(timeout 60 "$HPY" "$HELPER" gpu-count 2>>"$LOGS/gpu-count.log" | tail -n 1)
fi
if ! [[ $NGPU =~ ^[0-9]+$ ]] && [ "$SIM" != 1 ] && command -v nvidia-smi >/dev/null 2>&1; then
    NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
if ! [[ $NGPU =~ ^[0-9]+$ ]] || [ "$NGPU" -lt 1 ]; then
    log "GPU count unknown: assuming 1"
    NGPU=1
fi
log "GPUs: $NGPU"

if have_sg; then
    step sim-record 120 -- "${SG[@]}" sim record --name "$NODE" \
        --description "recorded by bench/real_gpu.sh ($MODE mode) on $(date -u +%F)" --out "$OUT/record.json"
else
    skip sim-record "$NO_SG"
fi
if have_hpy; then
    step nvml-probe 120 -- "$HPY" "$HELPER" probe --all-gpus --out "$OUT/probe.json"
else
    skip nvml-probe "no python3"
fi

# -------------------------------------------------------------------------- configs

mkdir -p "$WORK/jobs" "$WORK/no-keys"
write_config() {  # FILE LABEL
    local label=$2
    mkdir -p "$WORK/run-$label"
    cat >"$1" <<EOF
# Written by bench/real_gpu.sh ($MODE mode): everything under a temporary directory.
[gpu]
count = $NGPU

[prolog]
drain = false

[paths]
state_dir = "$WORK/state-$label"

[agent]
socket = "$WORK/run-$label/agent.sock"
spool_dir = "$WORK/spool-$label"
jobs_dir = "$WORK/jobs"
spool_max_mb = 256
interval_s = $AGENT_INTERVAL_S

[collector]
keys_dir = "$WORK/no-keys"
EOF
}
COLD_CFG=$WORK/cold.toml
WARM_CFG=$WORK/warm.toml
FP_CFG=$WORK/footprint.toml
write_config "$COLD_CFG" cold   # its socket never exists: the hook falls back to the cold path
write_config "$WARM_CFG" warm
write_config "$FP_CFG" footprint
cp "$COLD_CFG" "$WARM_CFG" "$FP_CFG" "$OUT/configs/"
if have_sg; then
    step config-check 60 -- "${SG[@]}" config check "$COLD_CFG"
    step config-check-agent 60 -- "${SG[@]}" config check "$FP_CFG"
    step check-json 90 --ok 0,1,2,3 --stdout "$OUT/check.json" -- "${SG[@]}" check --config "$COLD_CFG" --json --all
fi

# ------------------------------------------------------------------------ agent helpers

AGENT_PID="" AGENT_LOG="" AGENT_STARTED="" AGENT_STOPPED="" AGENT_RC=""
start_agent() {  # LABEL CONFIG EVENTS_WAIT_S
    local label=$1 cfg=$2 events_wait=$3
    AGENT_LOG=$WORK/agent-$label.log
    AGENT_STARTED=$(now_s)
    log "start agent ($label)"
    "${SG[@]}" agent --config "$cfg" --node "$NODE" --keys-dir "$WORK/no-keys" --log-level info \
        >"$AGENT_LOG" 2>&1 &
    AGENT_PID=$!
    BG_PIDS+=("$AGENT_PID")
    step "agent-$label-ready" 90 -- "$HPY" "$HELPER" wait-agent --socket "$WORK/run-$label/agent.sock" \
        --pid "$AGENT_PID" --log "$AGENT_LOG" --timeout 60 --events-timeout "$events_wait" --out "$WORK/agent-$label-ready.json"
}
stop_agent() {  # LABEL
    local label=$1 pid=$AGENT_PID
    [ -n "$pid" ] || return 0
    if alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
        if alive "$pid"; then
            log "agent ($label) still up 10 s after SIGTERM: SIGKILL"
            kill -KILL "$pid" 2>/dev/null
        fi
    fi
    wait "$pid" 2>/dev/null
    AGENT_RC=$?
    AGENT_STOPPED=$(now_s)
    log "agent ($label) stopped, exit $AGENT_RC"
    keep_log "$AGENT_LOG" "$LOGS/agent-$label.log"
    AGENT_PID=""
}

# ---------------------------------------------------------------------------- 2. timings

log "== 2. timings"
TDIR=$WORK/timings
mkdir -p "$TDIR"
TFILES=()
: >"$WORK/timings-skipped.jsonl"
tskip() {  # ID NAME REASON
    printf '{"name": %s, "reason": %s}\n' "$(json_str "$2")" "$(json_str "$3")" >>"$WORK/timings-skipped.jsonl"
    skip "time-$1" "$3"
}
timeit() {  # ID NAME TIMEOUT [timeit options] -- COMMAND...
    local id=$1 name=$2 limit=$3
    shift 3
    TFILES+=("$TDIR/$id.json")
    step "time-$id" "$limit" -- "$HPY" "$HELPER" timeit --name "$name" --out "$TDIR/$id.json" "$@"
}
JOB_ENV=(--env "SLURMD_NODENAME=$NODE" --env SLURM_JOB_GPUS=0 --env "SLURM_JOB_UID=$(id -u)"
         --env "SLURM_JOB_USER=$(id -un)")
if have_sg; then
    step bytecode 120 -- "$PY" -m compileall -q "$REPO/slurmgpu"   # as an installed package has it
    timeit py-pass "python3 -c pass (slurmgpu's Python)" 60 --runs "$TIMING_RUNS" -- "$PY" -c pass
    timeit py-pynvml "python3 -c 'import pynvml'" 60 --runs "$TIMING_RUNS" -- "$PY" -c "import pynvml"
elif have_hpy; then
    timeit py-pass "python3 -c pass ($HPY)" 60 --runs "$TIMING_RUNS" -- "$HPY" -c pass
fi
if command -v python3 >/dev/null 2>&1 && have_hpy; then
    timeit sys-py-IS "system python3 -I -S -c pass (the quick gate's interpreter)" 60 --runs "$TIMING_RUNS" \
        -- python3 -I -S -c pass
fi
if [ "$SIM" = 1 ]; then
    tskip nvidia-smi-q "nvidia-smi -q" "sim mode: no nvidia-smi"
elif command -v nvidia-smi >/dev/null 2>&1 && have_hpy; then
    timeit nvidia-smi-q "nvidia-smi -q" 150 --runs "$TIMING_RUNS" --warmup 1 -- nvidia-smi -q
fi
if have_sg; then
    timeit check "slurmgpu check --json (python -m slurmgpu)" 120 --runs "$TIMING_RUNS" \
        -- "${SG[@]}" check --config "$COLD_CFG" --json
    console=$(dirname "$PY")/slurmgpu
    if [ -x "$console" ] && timeout 30 "$console" --version >/dev/null 2>&1; then
        timeit check-console "slurmgpu check --json (console script)" 120 --runs "$TIMING_RUNS" \
            -- "$console" check --config "$COLD_CFG" --json
    fi
    timeit prolog-cold "prolog, cold path (slurmgpu prolog)" 150 --runs "$TIMING_RUNS" --job-id-base 710000 \
        "${JOB_ENV[@]}" -- "${SG[@]}" prolog --config "$COLD_CFG"
    timeit prolog-hook-no-agent "prolog hook, agent down (prolog/slurmgpu-prolog falls back to the cold path)" 120 \
        --runs "$FALLBACK_RUNS" --warmup 1 --job-id-base 720000 "${JOB_ENV[@]}" --env "SLURMGPU_CONFIG=$COLD_CFG" \
        --env "SLURMGPU_BIN=$PY -m slurmgpu" -- "$REPO/prolog/slurmgpu-prolog"

    start_agent warm "$WARM_CFG" 0
    if [ -n "$AGENT_PID" ] && alive "$AGENT_PID"; then
        WARM_ENV=("${JOB_ENV[@]}" --env "SLURMGPU_CONFIG=$WARM_CFG" --env "SLURMGPU_BIN=$PY -m slurmgpu")
        timeit prolog-warm-hook "prolog, warm path (prolog/slurmgpu-prolog, agent up)" 90 --runs "$WARM_RUNS" \
            --warmup 3 --job-id-base 730000 "${WARM_ENV[@]}" -- "$REPO/prolog/slurmgpu-prolog"
        timeit prolog-warm-m "prolog, warm path (python -m slurmgpu.quickgate prolog)" 90 --runs "$WARM_RUNS" \
            --warmup 3 --job-id-base 740000 "${WARM_ENV[@]}" -- "$PY" -m slurmgpu.quickgate prolog
        quick=$(dirname "$PY")/slurmgpu-quickgate
        if [ -x "$quick" ] && head -n 1 "$quick" | grep -q python && [ -x "$(head -n 1 "$quick" | sed 's/^#! *//; s/ .*//')" ]; then
            timeit prolog-warm-console "prolog, warm path (slurmgpu-quickgate console script)" 90 --runs "$WARM_RUNS" \
                --warmup 3 --job-id-base 750000 "${WARM_ENV[@]}" -- "$quick" prolog
        fi
    else
        tskip prolog-warm "prolog, warm path" "the agent did not start (logs/agent-warm.log)"
    fi
    stop_agent warm
else
    for id in check prolog-cold prolog-warm; do tskip "$id" "$id" "$NO_SG"; done
fi
printf '{"python": %s, "gpus": %s, "mode": %s, "node": %s, "config": %s}\n' "$(json_str "$PY_HOW")" "$NGPU" \
    "$(json_str "$MODE")" "$(json_str "$NODE")" "$(json_str "$(cat "$COLD_CFG")")" >"$WORK/timings-meta.json"
if have_hpy; then
    step timings-json 30 -- "$HPY" "$HELPER" merge --out "$OUT/timings.json" --meta "$WORK/timings-meta.json" \
        --skipped "$WORK/timings-skipped.jsonl" ${TFILES[@]+"${TFILES[@]}"}
fi

# ------------------------------------------------------- 3. agent footprint, 4. XID

LOAD_NOTE=""
find_load_python() {
    local p
    if [ -n "${LOAD_PYTHON:-}" ]; then LOAD_PY=$LOAD_PYTHON; return; fi
    LOAD_PY=$HPY
    case $LOAD_METHOD in auto|torch|cupy) ;; *) return ;; esac
    for p in $HPY $(system_pythons); do
        if env -u PYTHONPATH timeout 120 "$p" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' \
                >>"$LOGS/load-python.log" 2>&1; then
            LOAD_PY=$p; log "load: torch with CUDA in $p"; return
        fi
    done
    for p in $HPY $(system_pythons); do
        if env -u PYTHONPATH timeout 120 "$p" -c 'import cupy; cupy.cuda.runtime.getDeviceCount()' \
                >>"$LOGS/load-python.log" 2>&1; then
            LOAD_PY=$p; log "load: cupy in $p"; return
        fi
    done
    log "load: neither torch nor cupy: the CUDA driver API spin kernel (ctypes, PTX) through $HPY"
}
dmon() {  # LABEL SECONDS: nvidia-smi dmon in the background while a phase runs
    if [ "$SIM" != 1 ] && [ "$DMON" = 1 ] && command -v nvidia-smi >/dev/null 2>&1; then
        timeout -k 5 $(($2 + 15)) nvidia-smi dmon -s pucv -d 1 -c "$2" >"$OUT/dmon-$1.txt" 2>&1 &
        DMON_PID=$!
        BG_PIDS+=("$DMON_PID")
    else
        DMON_PID=""
    fi
}
dmon_wait() { [ -n "${DMON_PID:-}" ] && { wait "$DMON_PID" 2>/dev/null || true; }; DMON_PID=""; }

provoke_xid() {
    XID_NOTE=""
    XID_T0=$(now_s)
    if [ "$XID" != 1 ]; then
        XID_NOTE="XID provocation disabled (XID=$XID)"
        skip xid-provoke "$XID_NOTE"
    elif [ "$SIM" = 1 ]; then
        XID_NOTE="sim mode: no real XID; an XID 31 NVML event (GPU $XID_GPU) and a kernel-log record were injected into the simulator"
        skip xid-provoke "$XID_NOTE"
        step xid-sim-inject 30 -- "$HPY" "$HELPER" sim-inject --scenario "$SLURMGPU_SIM_SCENARIO" --gpu "$XID_GPU" \
            --xid 31 --kmsg "$SLURMGPU_KMSG" --out "$WORK/xid-provoke.json"
    elif ! have_hpy; then
        XID_NOTE="no python3 to drive libcuda"
        skip xid-provoke "$XID_NOTE"
    else
        step xid-provoke 60 -- env -u PYTHONPATH -u CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER=PCI_BUS_ID \
            "$HPY" "$HELPER" xid --gpu "$XID_GPU" --addr "$XID_ADDR" --out "$WORK/xid-provoke.json"
    fi
    if [ "$XID" = 1 ]; then
        log "waiting ${XID_WAIT_S} s for the XID to reach the agent and the kernel log"
        sleep "$XID_WAIT_S"
    fi
    if [ "$SIM" = 1 ]; then
        { echo "# sim mode: the simulated kernel log ($SLURMGPU_KMSG), not dmesg"; cat "$SLURMGPU_KMSG"; } >"$OUT/xid-kmsg.txt"
    elif step dmesg 30 --stdout "$WORK/dmesg.txt" -- dmesg; then
        { echo "# dmesg | grep -i xid | tail -n 50 ($(date -u +%FT%TZ), XID provoked at $(date -u -d "@${XID_T0%.*}" +%FT%TZ 2>/dev/null))"
          grep -i xid "$WORK/dmesg.txt" | tail -n 50; } >"$OUT/xid-kmsg.txt"
    else
        echo "# dmesg failed: see logs/dmesg.log" >"$OUT/xid-kmsg.txt"
    fi
    if have_sg; then
        step xid-kmsg-reader 30 -- "$PY" "$HELPER" kmsg-xids --path "${SLURMGPU_KMSG:-/dev/kmsg}" \
            --since "$(awk -v t="$XID_T0" 'BEGIN { printf "%.3f", t - 5 }')" --out "$WORK/xid-kmsg-reader.json"
    fi
}

log "== 3. agent footprint (idle ${IDLE_S} s, load ${LOAD_S} s) and 4. XID"
FP_OK=0
if have_sg; then
    start_agent footprint "$FP_CFG" 20
    if [ -n "$AGENT_PID" ] && alive "$AGENT_PID"; then
        FP_OK=1
        sleep 2  # let the first poll's work finish before the idle window opens
        dmon idle "$IDLE_S"
        step phase-idle $((IDLE_S + 60)) -- "$HPY" "$HELPER" phase --pid "$AGENT_PID" --label idle \
            --seconds "$IDLE_S" --clock-events --out "$WORK/phase-idle.json"
        dmon_wait

        if [ "$SIM" = 1 ]; then
            LOAD_NOTE="sim mode: no GPU work; the simulator's \"load\" flag was to be set on GPUs $LOAD_GPUS"
            if step sim-load-on 30 -- "$HPY" "$HELPER" sim-load --scenario "$SLURMGPU_SIM_SCENARIO" \
                    --gpus "$LOAD_GPUS" --out "$WORK/load.json"; then
                step phase-load $((LOAD_S + 60)) -- "$HPY" "$HELPER" phase --pid "$AGENT_PID" --label load \
                    --seconds "$LOAD_S" --clock-events --out "$WORK/phase-load.json"
            fi
            step sim-load-off 30 -- "$HPY" "$HELPER" sim-load --scenario "$SLURMGPU_SIM_SCENARIO" \
                --gpus "$LOAD_GPUS" --off
        elif [ "$(budget_left)" -lt $((LOAD_S + 60)) ]; then
            LOAD_NOTE="time budget: $(budget_left) s left"
            skip load "$LOAD_NOTE"
        else
            find_load_python
            rm -f "$WORK/load-ready.json" "$WORK/load-stop"
            max_load=$((LOAD_READY_TIMEOUT_S + LOAD_S + 30))
            log "start load ($LOAD_METHOD, GPUs $LOAD_GPUS) with $LOAD_PY"
            timeout -k 5 $((max_load + 30)) env -u PYTHONPATH CUDA_DEVICE_ORDER=PCI_BUS_ID "$LOAD_PY" "$HELPER" load \
                --seconds "$max_load" --ready "$WORK/load-ready.json" --stop-file "$WORK/load-stop" \
                --out "$WORK/load.json" --gpus "$LOAD_GPUS" --method "$LOAD_METHOD" >"$LOGS/load.log" 2>&1 &
            LOAD_PID=$!
            BG_PIDS+=("$LOAD_PID")
            t0=$(now_s)
            waited=0
            while [ ! -f "$WORK/load-ready.json" ] && alive "$LOAD_PID" && [ "$waited" -lt $((LOAD_READY_TIMEOUT_S * 2)) ]; do
                sleep 0.5
                waited=$((waited + 1))
            done
            if [ -f "$WORK/load-ready.json" ]; then
                record_step load-start ok 0 "$(since "$t0")" "$(tr -d '\n' <"$WORK/load-ready.json" | cut -c1-200)"
                dmon load "$LOAD_S"
                step phase-load $((LOAD_S + 60)) -- "$HPY" "$HELPER" phase --pid "$AGENT_PID" --label load \
                    --seconds "$LOAD_S" --clock-events --out "$WORK/phase-load.json"
                dmon_wait
            else
                LOAD_NOTE="load did not start within ${LOAD_READY_TIMEOUT_S} s (logs/load.log)"
                record_step load-start failed 1 "$(since "$t0")" "$LOAD_NOTE"
                log "  $LOAD_NOTE"
            fi
            touch "$WORK/load-stop"
            for _ in $(seq 1 300); do alive "$LOAD_PID" || break; sleep 0.1; done
            alive "$LOAD_PID" && kill -TERM "$LOAD_PID" 2>/dev/null
            wait "$LOAD_PID" 2>/dev/null
            load_rc=$?
            if [ "$load_rc" -eq 0 ]; then record_step load ok 0 "$(since "$t0")" ""
            else record_step load failed "$load_rc" "$(since "$t0")" "$(tail -n 3 "$LOGS/load.log" | tr '\n' ' ' | cut -c1-300)"; fi
        fi

        provoke_xid
        step agent-final 15 -- "$HPY" "$HELPER" proc --pid "$AGENT_PID" --out "$WORK/agent-final.json"
    else
        LOAD_NOTE="the agent did not start (logs/agent-footprint.log)"
        provoke_xid
    fi
    stop_agent footprint
    printf '{"command": %s, "node": %s, "interval_s": %s, "started_at": %s, "stopped_at": %s, "exit_code": %s, "ready": %s, "config": %s}\n' \
        "$(json_str "${SG[*]} agent --config $FP_CFG --node $NODE")" "$(json_str "$NODE")" "$AGENT_INTERVAL_S" \
        "${AGENT_STARTED:-null}" "${AGENT_STOPPED:-null}" "${AGENT_RC:-null}" \
        "$(cat "$WORK/agent-footprint-ready.json" 2>/dev/null || echo null)" "$(json_str "$(cat "$FP_CFG")")" \
        >"$WORK/agent-footprint-meta.json"
    if [ "$FP_OK" = 1 ]; then
        step footprint-json 60 -- "$HPY" "$HELPER" footprint --spool-dir "$WORK/spool-footprint" \
            --meta "$WORK/agent-footprint-meta.json" --phase "$WORK/phase-idle.json" --phase "$WORK/phase-load.json" \
            --load "$WORK/load.json" --load-note "$LOAD_NOTE" --final "$WORK/agent-final.json" \
            --out "$OUT/footprint.json" --messages-out "$OUT/agent-messages.json"
    fi
    step xid-check 90 --ok 0,1,2,3 --stdout "$OUT/xid-check.json" -- "${SG[@]}" check --config "$COLD_CFG" \
        --xid "31:$XID_GPU" --json
else
    skip agent-footprint "$NO_SG"
    provoke_xid
fi
if have_hpy; then
    step xid-json 30 -- "$HPY" "$HELPER" xid-report --mode "$MODE" --provoke "$WORK/xid-provoke.json" \
        --messages "$OUT/agent-messages.json" --kmsg-reader "$WORK/xid-kmsg-reader.json" --dmesg "$OUT/xid-kmsg.txt" \
        --check "$OUT/xid-check.json" --note "$XID_NOTE" --out "$OUT/xid.json"
fi

# ----------------------------------------------------------------- 5. validate --tier quick

log "== 5. slurmgpu validate --tier quick"
if have_sg; then
    VALIDATE_CFG=$WORK/validate.toml
    { cat "$COLD_CFG"; printf '\n[validate]\nquick_burn_s = %s\n' "$VALIDATE_BURN_S"
      # (the probe in the Python the GPU load found with torch or cupy, when that is another one)
      if [ "$SIM" != 1 ] && [ -n "${LOAD_PY:-}" ] && [ "$LOAD_PY" != "$PY" ]; then
          printf 'probe_python = "%s"\n' "$LOAD_PY"; fi; } >"$VALIDATE_CFG"
    cp "$VALIDATE_CFG" "$OUT/configs/"
    if [ "$SIM" != 1 ]; then  # the probe's CUDA context creation per GPU, alone (CuPy or PyTorch)
        step validate-context 120 --ok 0,1,2,3 --stdout "$OUT/validate-context.jsonl" -- \
            "${LOAD_PY:-$PY}" -m slurmgpu.validate.probe context
    fi
    t0=$(now_s)
    step validate-quick 150 --ok 0,1,2,3 --stdout "$OUT/validate.json" -- \
        "${SG[@]}" validate --config "$VALIDATE_CFG" --tier quick --json
    step validate-json 30 -- "$HPY" "$HELPER" validate-report --validate "$OUT/validate.json" --wall "$(since "$t0")" \
        --context "$OUT/validate-context.jsonl" --out "$OUT/validate-summary.json"
    if [ "$SIM" != 1 ]; then  # the products' raw rate beside what the GEMM test reports
        step gemm-probe 90 --stdout "$OUT/gemm-probe.json" -- \
            "${LOAD_PY:-$PY}" "$REPO/bench/gemm_probe.py" --backend auto --seconds 2
    fi
else
    skip validate-quick "no Python for slurmgpu"
fi

# ----------------------------------------------------------------------- 6. env, summary

log "== 6. env.json and summary.md"
if have_hpy; then
    commit=${SLURMGPU_COMMIT:-$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo "unknown (no .git)")}
    src_hash=$(cd "$REPO" && find slurmgpu prolog bench -type f \( -name '*.py' -o -name '*.c' -o -name '*.sh' \
        -o -name 'slurmgpu-prolog' \) -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum 2>/dev/null \
        | sha256sum | cut -c1-16)
    dirty=""
    if git -C "$REPO" rev-parse HEAD >/dev/null 2>&1; then
        dirty=$(git -C "$REPO" status --porcelain 2>/dev/null | grep -cv '^??')
    fi
    step env-json 30 -- "$HPY" "$HELPER" env --out "$OUT/env.json" --set "host=$HOST" --set "node=$NODE" \
        --set "mode=$MODE" --set "date=$(date -u +%FT%TZ)" --set "kernel=$(uname -r)" --set "uname=$(uname -a)" \
        --set-int "cpus=$(nproc 2>/dev/null || echo 0)" \
        --set "cpu_model=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')" \
        --set "memory=$(grep -m1 MemTotal /proc/meminfo 2>/dev/null | awk '{print $2 " kB"}')" \
        --set "python=$PY" --set "python_setup=$PY_HOW" --set "helper_python=$HPY" \
        --set "git_commit=$commit" --set-int "git_modified_files=$dirty" --set "source_sha256=$src_hash" \
        --set "driver_version=$DRIVER" --set "cuda_version=$CUDA_VERSION" --set-int "gpu_count=$NGPU" \
        --set-int "idle_s=$IDLE_S" --set-int "load_s=$LOAD_S" --set-int "agent_interval_s=$AGENT_INTERVAL_S" \
        --set "load_gpus=$LOAD_GPUS" --set "load_python=${LOAD_PY:-}" \
        --set "sim_scenario=$([ "$SIM" = 1 ] && echo "$SIM_SCENARIO")" \
        --set-int "elapsed_s=$((SECONDS - START))" \
        --jsonl python_setup_attempts "$SETUP_JSONL" --probe "$OUT/probe.json"
    step summary 30 -- "$HPY" "$HELPER" summary --dir "$OUT"
else
    { echo "# Real GPU run: $HOST ($MODE mode), $(date -u +%F)"; echo; echo "No python3 on this node: see run.log."; } \
        >"$OUT/summary.md"
fi

log "done in $((SECONDS - START)) s: $OUT"
failed=$(grep -c '"status": "\(failed\|timeout\)"' "$OUT/steps.jsonl")
[ "$failed" -gt 0 ] && log "$failed step(s) failed or timed out: see steps.jsonl / summary.md"
find "$OUT" -type f -printf '%10s  %P\n' | sort -k2 | tee -a "$OUT/run.log"
exit 0
