#!/usr/bin/env bash
# bench/real_gpu_site.sh: prepare, on a machine with PyPI, the site-packages that
# bench/real_gpu.sh needs on a lent GPU machine whose Python lacks slurmgpu's dependencies.
#
#   bench/real_gpu_site.sh [DIR] [PYTHON_VERSION]     # defaults: .gpuvenv 3.12
#
# Downloads cp<version> manylinux wheels of the dependencies that such an image lacks
# (pyzmq, structlog, ClusterShell; it has nvidia-ml-py, click, msgpack, prometheus-client,
# PyYAML) and unzips them into DIR/lib/python<version>/site-packages. Carry DIR to the GPU
# machine and run `CARRIED_VENV=$PWD/DIR bench/real_gpu.sh` there: with no DIR/bin/python,
# the script runs the system python3 with that site-packages (docs/benchmarks.md, "Real GPU
# run"). DIR must be ignored by git (e.g. in .git/info/exclude) and travel as a carried path.
set -euo pipefail
dir=${1:-.gpuvenv}
ver=${2:-3.12}
site=$dir/lib/python$ver/site-packages
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$ver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$wheels" pyzmq structlog ClusterShell
mkdir -p "$site"
for w in "$wheels"/*.whl; do
    if command -v unzip >/dev/null; then unzip -q -o "$w" -d "$site"; else python3 -m zipfile -e "$w" "$site"; fi
done
echo "$site: $(ls "$site" | tr '\n' ' ')"
