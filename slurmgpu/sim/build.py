"""Compile the fake ``libnvidia-ml.so.1`` (sim/fake_nvml.c) against NVIDIA's real nvml.h.

Needs gcc, cJSON (Debian ``libcjson-dev``) and nvml.h (pip ``nvidia-nvml-dev``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from slurmgpu.errors import SimError

LIBRARY_NAME = "libnvidia-ml.so.1"
SOURCE_PATH = Path(__file__).resolve().parent / "fake_nvml.c"
_STAMP_SUFFIX = ".buildhash"
_CFLAGS = ["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Wmissing-prototypes", "-Werror"]
_LDFLAGS = ["-lcjson", "-lpthread"]
_CJSON_DIRS = ("/usr/include", "/usr/local/include")


class SimToolchainError(SimError):
    """A build prerequisite (compiler, header, library) is missing: tests skip on this."""


def find_compiler() -> str:
    """The C compiler to use ($CC or gcc)."""
    cc = os.environ.get("CC", "gcc")
    path = shutil.which(cc)
    if path is None:
        raise SimToolchainError(
            f"C compiler '{cc}' not found; install it (Debian: apt-get install gcc) or set CC"
        )
    return path


def find_nvml_header() -> Path:
    """nvml.h: $SLURMGPU_NVML_INCLUDE, else the pip package nvidia-nvml-dev, else CUDA's."""
    override = os.environ.get("SLURMGPU_NVML_INCLUDE")
    if override:
        header = Path(override) / "nvml.h"
        if header.is_file():
            return header
        raise SimToolchainError(f"SLURMGPU_NVML_INCLUDE={override} has no nvml.h")
    candidates: list[Path] = []
    for dist in ("nvidia-nvml-dev", "nvidia-nvml-dev-cu12", "nvidia-nvml-dev-cu13"):
        try:
            files = importlib.metadata.files(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in files:
            if f.name == "nvml.h":
                candidates.append(Path(str(f.locate())))
    candidates.append(Path("/usr/local/cuda/include/nvml.h"))
    for header in candidates:
        if header.is_file():
            return header.resolve()
    raise SimToolchainError(
        "nvml.h not found; install it with `pip install nvidia-nvml-dev` "
        "(or point SLURMGPU_NVML_INCLUDE at the directory holding nvml.h)"
    )


def find_cjson_header() -> Path:
    """cjson/cJSON.h from Debian's libcjson-dev (also searched in $CPATH, $C_INCLUDE_PATH)."""
    dirs = [*_CJSON_DIRS]
    for var in ("CPATH", "C_INCLUDE_PATH"):
        dirs.extend(d for d in os.environ.get(var, "").split(os.pathsep) if d)
    for d in dirs:
        header = Path(d) / "cjson" / "cJSON.h"
        if header.is_file():
            return header
    raise SimToolchainError(
        "cJSON headers not found (cjson/cJSON.h); install them with `apt-get install libcjson-dev`"
    )


def _source_text() -> bytes:
    try:
        return SOURCE_PATH.read_bytes()
    except OSError as exc:
        raise SimError(f"fake NVML source missing from the package: {SOURCE_PATH}") from exc


def _build_hash(source: bytes, header: Path, compiler: str) -> str:
    digest = hashlib.sha256()
    digest.update(source)
    digest.update(header.read_bytes())
    digest.update(" ".join([compiler, *_CFLAGS, *_LDFLAGS]).encode())
    return digest.hexdigest()[:16]


def default_build_dir(build_hash: str) -> Path:
    env = os.environ.get("SLURMGPU_SIM_DIR")
    if env:
        return Path(env).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "slurmgpu" / "sim" / build_hash


def build_library(dest_dir: Path | None = None, *, force: bool = False) -> Path:
    """Compile fake_nvml.c to ``<dest>/libnvidia-ml.so.1`` unless already up to date.

    The default destination is ``$SLURMGPU_SIM_DIR`` or
    ``~/.cache/slurmgpu/sim/<hash of source+nvml.h>/``. Returns the library path.
    """
    compiler = find_compiler()
    header = find_nvml_header()
    find_cjson_header()
    source = _source_text()
    build_hash = _build_hash(source, header, compiler)
    dest = Path(dest_dir).expanduser() if dest_dir is not None else default_build_dir(build_hash)
    lib = dest / LIBRARY_NAME
    stamp = dest / (LIBRARY_NAME + _STAMP_SUFFIX)
    if not force and lib.is_file() and _read(stamp) == build_hash:
        return lib.resolve()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimError(f"cannot create build directory {dest}: {exc.strerror or exc}") from exc
    _compile(compiler, header, dest, lib)
    _write_atomic(stamp, build_hash)
    return lib.resolve()


def _compile(compiler: str, header: Path, dest: Path, lib: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{LIBRARY_NAME}.", dir=dest)
    os.close(fd)
    cmd = [
        compiler,
        *_CFLAGS,
        f"-Wl,-soname,{LIBRARY_NAME}",
        f"-I{header.parent}",
        "-o",
        tmp,
        str(SOURCE_PATH),
        *_LDFLAGS,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise _compile_error(proc.stderr)
        os.chmod(tmp, 0o755)
        os.replace(tmp, lib)  # atomic: concurrent builders never see a half-written library
    finally:
        Path(tmp).unlink(missing_ok=True)


def _compile_error(stderr: str) -> SimError:
    if "cjson" in stderr.lower() and ("No such file" in stderr or "cannot find" in stderr):
        return SimToolchainError(
            "cJSON not found by the compiler; install it with `apt-get install libcjson-dev`"
        )
    lines = [ln.strip() for ln in stderr.splitlines() if "error" in ln]
    first = lines[0] if lines else (stderr.strip().splitlines() or ["unknown error"])[0]
    return SimError(f"compiling the fake NVML library failed: {first}")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    os.replace(tmp, path)
