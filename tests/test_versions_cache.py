"""The NCCL / CUDA runtime version cache of SystemVersionSource (issue 10): a hit loads
no library, any change to the library file (or to what steers the linker) loads it
again, and a broken cache is never a problem for the check.

The libraries are tiny gcc-built fakes; a counting loader around ctypes.CDLL tells
whether one was loaded. In one process dlopen() of a path already loaded returns the
first copy, so tests that need the *new* version after a change run in subprocesses.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmgpu.config.schema import Settings, VersionsSettings
from slurmgpu.sources.versions import (
    CACHE_FILE,
    CACHE_MAX_ENTRIES,
    CACHE_SCHEMA,
    LibraryVersionCache,
    SystemVersionSource,
    linker_id,
)

REPO = Path(__file__).resolve().parent.parent
NCCL_SOURCE = "int ncclGetVersion(int *v) { *v = %d; return %d; }\n"
CUDART_SOURCE = "int cudaRuntimeGetVersion(int *v) { *v = %d; return 0; }\n"


def _build(out: Path, source: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.parent / "src.c").write_text(source)
    # No -soname: a library loaded here must never satisfy a later dlopen by soname.
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", str(out), str(out.parent / "src.c")],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the fake libraries")
    base = tmp_path_factory.mktemp("cachelibs")
    return {
        "nccl_new": _build(base / "new" / "libnccl.so.2", NCCL_SOURCE % (22602, 0)),  # 2.26.2
        "nccl_old": _build(base / "old" / "libnccl.so.2", NCCL_SOURCE % (2708, 0)),  # 2.7.8
        "nccl_failing": _build(base / "fail" / "libnccl.so.2", NCCL_SOURCE % (0, 2)),
        "cudart": _build(base / "cudart" / "libcudart.so.12", CUDART_SOURCE % 12040),  # 12.4
    }


class CountingLoader:
    """ctypes.CDLL, counting what it was asked to load."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, name: str) -> ctypes.CDLL:
        self.calls.append(name)
        return ctypes.CDLL(name)


def source(tmp_path: Path, cache: Path | None, loader: CountingLoader, *, nccl: Path | None = None,
           cudart: Path | None = None, site_dirs: list[Path] | None = None) -> SystemVersionSource:
    """Only the test's own files: no linker search, no real site-packages, empty roots."""
    settings = VersionsSettings(nccl_library=str(nccl) if nccl else None,
                                cudart_library=str(cudart) if cudart else None,
                                cuda_root=str(tmp_path / "no-cuda"))
    return SystemVersionSource(settings, proc_root=tmp_path / "no-proc", sys_root=tmp_path / "no-sys",
                               ofed_info_path=tmp_path / "no-ofed_info", site_dirs=site_dirs or [],
                               search_linker=False, cache_path=cache, loader=loader)


@pytest.fixture
def lib(libs: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the new NCCL, free to replace or touch."""
    path = tmp_path / "nccl" / "libnccl.so.2"
    path.parent.mkdir()
    shutil.copy(libs["nccl_new"], path)
    return path


# -- hits and misses ------------------------------------------------------------------


def test_hit_loads_no_library(lib: Path, libs: dict[str, Path], tmp_path: Path) -> None:
    cache = tmp_path / "state" / CACHE_FILE
    cache.parent.mkdir()
    first = CountingLoader()
    v1 = source(tmp_path, cache, first, nccl=lib, cudart=libs["cudart"]).collect()
    assert (v1.nccl, v1.cuda_runtime) == ("2.26.2", "12.4")
    assert first.calls == [str(libs["cudart"]), str(lib)]
    assert json.loads(cache.read_text())["schema"] == CACHE_SCHEMA

    again = CountingLoader()
    v2 = source(tmp_path, cache, again, nccl=lib, cudart=libs["cudart"]).collect()
    assert again.calls == []
    assert (v2.nccl, v2.cuda_runtime, v2.sources, v2.errors) == ("2.26.2", "12.4", v1.sources, {})


def test_no_cache_by_default(lib: Path, tmp_path: Path) -> None:
    loader = CountingLoader()
    src = source(tmp_path, None, loader, nccl=lib)
    src.collect()
    src.collect()
    assert loader.calls == [str(lib), str(lib)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nccl"]


def test_a_hit_writes_nothing(lib: Path, tmp_path: Path) -> None:
    cache = tmp_path / CACHE_FILE
    source(tmp_path, cache, CountingLoader(), nccl=lib).collect()
    before = cache.stat()
    source(tmp_path, cache, CountingLoader(), nccl=lib).collect()
    assert (cache.stat().st_ino, cache.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def _replace(path: Path) -> None:  # a package upgrade: new file renamed over the old one
    tmp = path.with_name(path.name + ".new")
    shutil.copy(path, tmp)
    os.replace(tmp, path)


def _touch(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def _grow(path: Path) -> None:  # same inode and (restored) mtime, other size
    st = path.stat()
    with open(path, "ab") as fh:
        fh.write(b"\0" * 64)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("change", [_replace, _touch, _grow], ids=["inode", "mtime", "size"])
def test_changed_file_is_read_again(lib: Path, tmp_path: Path, change: Any) -> None:
    cache = tmp_path / CACHE_FILE
    source(tmp_path, cache, CountingLoader(), nccl=lib).collect()
    change(lib)
    loader = CountingLoader()
    assert source(tmp_path, cache, loader, nccl=lib).collect().nccl is not None
    assert loader.calls == [str(lib)]
    hit = CountingLoader()  # and the new file's version is what is cached now
    source(tmp_path, cache, hit, nccl=lib).collect()
    assert hit.calls == []


def test_symlink_retargeted_is_read_again(libs: dict[str, Path], tmp_path: Path) -> None:
    link = tmp_path / "libnccl.so.2"
    link.symlink_to(libs["nccl_new"])
    cache = tmp_path / CACHE_FILE
    source(tmp_path, cache, CountingLoader(), nccl=link).collect()
    link.unlink()
    link.symlink_to(libs["nccl_old"])  # the old target is still there, unchanged
    loader = CountingLoader()
    source(tmp_path, cache, loader, nccl=link).collect()
    assert loader.calls == [str(link)]


def test_wheel_library_is_cached(libs: dict[str, Path], tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "nvidia" / "nccl" / "lib").mkdir(parents=True)
    shutil.copy(libs["nccl_new"], site / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
    cache = tmp_path / CACHE_FILE
    assert source(tmp_path, cache, CountingLoader(), site_dirs=[site]).collect().nccl == "2.26.2"
    loader = CountingLoader()
    assert source(tmp_path, cache, loader, site_dirs=[site]).collect().nccl == "2.26.2"
    assert loader.calls == []


def test_errors_are_not_cached(libs: dict[str, Path], tmp_path: Path) -> None:
    cache = tmp_path / CACHE_FILE
    for _ in range(2):
        loader = CountingLoader()
        v = source(tmp_path, cache, loader, nccl=libs["nccl_failing"]).collect()
        assert "returned error 2" in v.errors["nccl"]
        assert loader.calls == [str(libs["nccl_failing"])]
    assert not cache.exists()


def test_upgrade_between_processes_gives_the_new_version(libs: dict[str, Path], tmp_path: Path) -> None:
    """What a node sees: a prolog, then NCCL upgraded in place, then the next prolog."""
    lib_path = tmp_path / "libnccl.so.2"
    shutil.copy(libs["nccl_new"], lib_path)
    code = (
        "import json, sys; from slurmgpu.config.schema import VersionsSettings as V; "
        "from slurmgpu.sources.versions import SystemVersionSource as S; "
        "v = S(V(nccl_library=sys.argv[1]), site_dirs=[], search_linker=False, "
        "cache_path=sys.argv[2]).collect(); print(json.dumps(v.nccl))"
    )

    def nccl() -> str:
        out = subprocess.run([sys.executable, "-c", code, str(lib_path), str(tmp_path / CACHE_FILE)],
                             env=_env(), capture_output=True, text=True, check=True, cwd=tmp_path)
        return str(json.loads(out.stdout))

    assert nccl() == "2.26.2"
    tmp = tmp_path / "libnccl.so.2.new"
    shutil.copy(libs["nccl_old"], tmp)
    os.replace(tmp, lib_path)
    assert nccl() == "2.7.8"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def test_linker_lookup_cached_until_its_directory_changes(libs: dict[str, Path], tmp_path: Path) -> None:
    lib_dir = tmp_path / "ld"
    lib_dir.mkdir()
    shutil.copy(libs["nccl_new"], lib_dir / "libnccl.so.2")
    code = (
        "import ctypes, json, sys; from slurmgpu.sources.versions import SystemVersionSource as S\n"
        "calls = []\n"
        "def load(name):\n"
        "    calls.append(name)\n"
        "    return ctypes.CDLL(name)\n"
        "v = S(site_dirs=[], cache_path=sys.argv[1], loader=load).collect()\n"
        "print(json.dumps([v.nccl, [c for c in calls if 'nccl' in c]]))\n"
    )

    def run() -> list[Any]:
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / CACHE_FILE)],
                             env=_env(LD_LIBRARY_PATH=str(lib_dir)), capture_output=True, text=True,
                             check=True, cwd=tmp_path)
        return list(json.loads(out.stdout))

    assert run() == ["2.26.2", ["libnccl.so.2"]]
    assert run() == ["2.26.2", []]
    (lib_dir / "libnccl.so.2.27").write_bytes(b"")  # something new where the linker looks
    assert run() == ["2.26.2", ["libnccl.so.2"]]


def test_linker_id_follows_the_search_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    before = linker_id()
    assert linker_id() == before
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{tmp_path}:/opt/other")
    assert linker_id() != before


# -- a broken cache is no problem -----------------------------------------------------


@pytest.mark.parametrize("content", [
    b"not json at all",
    b"\xff\xfe\x00garbage",
    b"[]",
    b'{"schema": "someone-else/9", "entries": {}}',
    json.dumps({"schema": CACHE_SCHEMA, "entries": []}).encode(),
    json.dumps({"schema": CACHE_SCHEMA, "entries": {"x": "y"}}).encode(),
], ids=["text", "binary", "list", "schema", "entries-list", "entry-string"])
def test_corrupt_cache_is_ignored_and_rewritten(lib: Path, tmp_path: Path, content: bytes) -> None:
    cache = tmp_path / CACHE_FILE
    cache.write_bytes(content)
    loader = CountingLoader()
    v = source(tmp_path, cache, loader, nccl=lib).collect()
    assert (v.nccl, v.errors) == ("2.26.2", {})
    assert loader.calls == [str(lib)]
    hit = CountingLoader()
    assert source(tmp_path, cache, hit, nccl=lib).collect().nccl == "2.26.2"
    assert hit.calls == []


@pytest.mark.parametrize("code", [0, -1, "22602", True, None])
def test_damaged_entry_is_a_miss(lib: Path, tmp_path: Path, code: Any) -> None:
    """A hand-edited code must not turn into a bogus version or error."""
    cache = tmp_path / CACHE_FILE
    source(tmp_path, cache, CountingLoader(), nccl=lib).collect()
    data = json.loads(cache.read_text())
    for entry in data["entries"].values():
        entry["code"] = code
    cache.write_text(json.dumps(data))
    loader = CountingLoader()
    v = source(tmp_path, cache, loader, nccl=lib).collect()
    assert (v.nccl, v.errors, loader.calls) == ("2.26.2", {}, [str(lib)])


def test_cache_for_another_file_is_a_miss(lib: Path, libs: dict[str, Path], tmp_path: Path) -> None:
    cache = tmp_path / CACHE_FILE
    source(tmp_path, cache, CountingLoader(), nccl=lib).collect()
    data = json.loads(cache.read_text())
    (entry,) = data["entries"].values()
    entry["file"][1] += 1  # another inode
    cache.write_text(json.dumps(data))
    loader = CountingLoader()
    assert source(tmp_path, cache, loader, nccl=lib).collect().nccl == "2.26.2"
    assert loader.calls == [str(lib)]


def test_unwritable_location_is_ignored(lib: Path, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    for cache in (not_a_dir / CACHE_FILE, tmp_path / "missing" / CACHE_FILE, tmp_path):
        for _ in range(2):  # nothing stored: every run loads, none fails
            loader = CountingLoader()
            v = source(tmp_path, cache, loader, nccl=lib).collect()
            assert (v.nccl, v.errors, loader.calls) == ("2.26.2", {}, [str(lib)])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory anyway")
def test_read_only_state_dir_is_ignored(lib: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o500)
    try:
        v = source(tmp_path, state / CACHE_FILE, CountingLoader(), nccl=lib).collect()
        assert (v.nccl, v.errors) == ("2.26.2", {})
        assert list(state.iterdir()) == []
    finally:
        state.chmod(0o700)


def test_failed_write_is_ignored(lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("slurmgpu.fileutil.write_text_atomic", no_space)
    v = source(tmp_path, tmp_path / CACHE_FILE, CountingLoader(), nccl=lib).collect()
    assert (v.nccl, v.errors) == ("2.26.2", {})


def test_entries_are_bounded(tmp_path: Path) -> None:
    cache = LibraryVersionCache(tmp_path / CACHE_FILE)
    lib_file = tmp_path / "lib.so"
    lib_file.write_text("x")
    for i in range(CACHE_MAX_ENTRIES + 5):
        cache.store(f"k{i}", str(lib_file), [str(lib_file), 1, 1, 1], None, (i + 1, "s"))
    cache.flush()
    cache.reload()
    assert list(cache.entries) == [f"k{i}" for i in range(5, CACHE_MAX_ENTRIES + 5)]


# -- who passes a cache ---------------------------------------------------------------


def test_system_sources_cache_only_when_asked(tmp_path: Path) -> None:
    from slurmgpu.engine import system_sources

    plain = system_sources(Settings()).versions
    cached = system_sources(Settings(), versions_cache=str(tmp_path / CACHE_FILE)).versions
    assert isinstance(plain, SystemVersionSource) and isinstance(cached, SystemVersionSource)
    assert plain.cache.path is None
    assert cached.cache.path == tmp_path / CACHE_FILE


def test_commands_keep_the_cache_in_the_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmgpu.cli.common import load_settings
    from slurmgpu.cli.loading import versions_cache

    config = tmp_path / "slurmgpu.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path / "configured"}"\n')
    monkeypatch.delenv("SLURMGPU_STATE_DIR", raising=False)
    settings = load_settings(str(config)).settings
    assert versions_cache(settings) == str(tmp_path / "configured" / CACHE_FILE)
    monkeypatch.setenv("SLURMGPU_STATE_DIR", str(tmp_path / "env"))
    settings = load_settings(str(config)).settings
    assert versions_cache(settings) == str(tmp_path / "env" / CACHE_FILE)
