#!/usr/bin/env bash
# Run on a real NVIDIA GPU machine (a device window): check the node with the real
# driver and record it as a simulator scenario, so CI can replay it without a GPU.
#
#   OUT=/some/dir tools/gpu-window.sh
#
# Writes $OUT/<name>.scenario.json (slurmgpu sim record), $OUT/<name>.check.json
# (slurmgpu check --json on the real GPUs), $OUT/<name>.replay.json (check --json
# replaying the recording through the fake libnvidia-ml.so.1) and $OUT/env.txt.
# Commit the first two under tests/data/recorded/; tests/test_recorded.py replays them.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to an output directory}
mkdir -p "$OUT"
if [ ! -x .venv/bin/slurmgpu ]; then
    python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' || exit 1
fi
sg=.venv/bin/slurmgpu
model=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-' | tr -cd 'A-Za-z0-9-')
name="${model:-gpu}-$(nvidia-smi -L 2>/dev/null | wc -l)x"
{
    nvidia-smi 2>&1 | head -20
    uname -a
    $sg --version
} > "$OUT/env.txt" 2>&1
config="$OUT/config.toml"
printf '[checks]\ndisabled = ["ib.*", "pin.*"]\n' > "$config"   # no site pins on a lent machine
$sg check --json --all --config "$config" --node recorded > "$OUT/$name.check.json"; echo "check rc=$?"
time $sg check --config "$config" --node recorded > /dev/null
$sg sim record --name "$name" --description "recorded with slurmgpu sim record on $(date -u +%F)" \
    --out "$OUT/$name.scenario.json"; echo "record rc=$?"
$sg sim run --scenario "$OUT/$name.scenario.json" -- \
    $sg check --json --config "$config" --node recorded > "$OUT/$name.replay.json"; echo "replay rc=$?"
python3 - "$OUT/$name.check.json" "$OUT/$name.replay.json" <<'PY'
import json, sys
real, replay = (json.load(open(p)) for p in sys.argv[1:3])
key = lambda r: sorted((f["check"], f["severity"], f["gpu"]) for f in r["findings"] if f["severity"] != "OK")
print("real verdict", real["verdict"], "replay verdict", replay["verdict"], "same findings", key(real) == key(replay))
PY
