#!/usr/bin/env bash
# Print, NUL-separated and relative to the checkout, the files a package is built from:
# tracked files and untracked ones git does not ignore (what a commit would hold), minus
# deletions not yet committed. Outside a git checkout: every file but .git/, .venv/,
# build/, dist/ and caches.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do
            if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
        done
else
    find . \( -name .git -o -name .venv -o -name build -o -name dist -o -name __pycache__ \
        -o -name '*.egg-info' -o -name .mypy_cache -o -name .ruff_cache -o -name .pytest_cache \
        -o -name .hypothesis \) -prune -o \( -type f -o -type l \) -printf '%P\0'
fi
