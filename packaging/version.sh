#!/bin/sh
# Print slurmgpu's version: `__version__` of slurmgpu/__init__.py, its one source
# (pyproject.toml reads it; debian/changelog and the RPM spec must agree: their build
# scripts and tests/test_packaging.py check it).
here=$(cd "$(dirname "$0")" && pwd)
sed -n 's/^__version__ *= *"\(.*\)"$/\1/p' "$here/../slurmgpu/__init__.py" | head -n1
