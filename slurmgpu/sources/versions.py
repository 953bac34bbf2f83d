"""Software versions on the node: kernel, CUDA toolkit and runtime, NCCL, OFED.

This runs on the prolog's hot path, so it uses only the standard library,
starts no subprocess (no ``ofed_info -s``, no ``ldconfig``, no
``ctypes.util.find_library``) and needs no GPU: with nothing installed,
``collect()`` takes a few milliseconds.

Probes (each one isolated: a failure lands in ``SoftwareVersions.errors[name]``
and the others still run; where each value came from lands in ``sources``):

Design notes: docs/design-notes.md (``slurmgpu/sources/versions.py``).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmgpu.facts import SoftwareVersions

if TYPE_CHECKING:
    from slurmgpu.config.schema import VersionsSettings

DEFAULT_OFED_INFO = "/usr/bin/ofed_info"
DEFAULT_CUDA_ROOT = "/usr/local/cuda"

CUDART_SONAMES = ("libcudart.so.12", "libcudart.so.13", "libcudart.so.11", "libcudart.so")
CUDART_WHEEL_DIRS = ("nvidia/cuda_runtime/lib", "nvidia/cu13/lib")
NCCL_SONAMES = ("libnccl.so.2",)
NCCL_WHEEL_DIRS = ("nvidia/nccl/lib", "nvidia/cu13/lib")

# The version cache: its usual name in the state dir, its format, and a bound on its
# entries (one per library looked up; old configured paths drop out first).
CACHE_FILE = "versions-cache.json"
CACHE_SCHEMA = "slurmgpu.versions-cache/1"
CACHE_MAX_ENTRIES = 16
LD_SO_CACHE = "/etc/ld.so.cache"

Loader = Callable[[str], Any]  # ctypes.CDLL, or a test's stand-in

# How much of ofed_info to read: the -s/-n answers sit in its first lines; the
# package list after them can run to tens of kilobytes.
_OFED_READ_BYTES = 65536

# if [ "X$1" == "X-n" ]; then echo 23.10-1.1.9.0; exit 0; fi
_OFED_N_RE = r"""["']?X-n["']?\s*\]\s*;?\s*then\s+echo\s+["']?([0-9][\w.\-]*)"""
# if [ "X$1" == "X-s" ]; then echo MLNX_OFED_LINUX-23.10-1.1.9.0:; exit 0; fi
_OFED_S_RE = r"""["']?X-s["']?\s*\]\s*;?\s*then\s+echo\s+["']?([A-Za-z][\w.\-]*?):?["']?\s*;"""
# Anywhere in the text: MLNX_OFED_LINUX-23.10-1.1.9.0, OFED-internal-24.10-1.1.4, DOCA...-2.9.0
_OFED_ANY_RE = (
    r"\b((?:MLNX_OFED_LINUX|OFED-internal|DOCA[\w]*(?:-[A-Za-z][\w]*)*)-(\d+\.\d+[\w.\-]*?))(?=[:\s\"')]|$)"
)
_NUMERIC_TAIL_RE = r"-(\d+\.\d+[\w.\-]*)$"
_CUDA_TXT_RE = r"CUDA Version\s+(\d+(?:\.\d+)+)"
_CUDART_DEFINE_RE = rb"#\s*define\s+CUDART_VERSION\s+(\d+)"


class ProbeError(Exception):
    """A probe found something it could not use; the message goes to ``errors``."""


def decode_nccl_version(code: int) -> str:
    """``ncclGetVersion`` code -> "MAJOR.MINOR.PATCH" (22602 -> "2.26.2", 2708 -> "2.7.8")."""
    if code <= 0:
        raise ProbeError(f"ncclGetVersion returned an invalid code {code}")
    if code >= 20900:
        major, rest = divmod(code, 10000)
    else:
        major, rest = divmod(code, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def decode_cuda_version(code: int) -> str:
    """CUDA version integer -> "MAJOR.MINOR" (12040 -> "12.4", 12090 -> "12.9")."""
    if code <= 0:
        raise ProbeError(f"invalid CUDA version code {code}")
    return f"{code // 1000}.{(code % 1000) // 10}"


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _loaded_path(func: Any, fallback: str) -> str:
    """The file a resolved symbol lives in (``dladdr``), so ``sources`` names a path."""
    try:
        dladdr = ctypes.CDLL(None).dladdr
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        dladdr.restype = ctypes.c_int
        info = _DlInfo()
        addr = ctypes.cast(func, ctypes.c_void_p).value
        if addr and dladdr(addr, ctypes.byref(info)) and info.dli_fname:
            return os.fsdecode(info.dli_fname)
    except (OSError, AttributeError, ValueError):
        pass
    return fallback


def _query(lib: ctypes.CDLL, label: str, symbol: str) -> tuple[int, str]:
    """Call ``int symbol(int*)`` in ``lib``; returns (value, file the symbol came from)."""
    try:
        func = getattr(lib, symbol)
    except AttributeError:
        raise ProbeError(f"{label} has no symbol {symbol}") from None
    func.argtypes = [ctypes.POINTER(ctypes.c_int)]
    func.restype = ctypes.c_int
    value = ctypes.c_int(0)
    rc = func(ctypes.byref(value))
    loaded = _loaded_path(func, label)
    if rc != 0:
        raise ProbeError(f"{symbol} in {loaded} returned error {rc}")
    return value.value, loaded


def file_id(path: str | os.PathLike[str]) -> list[Any] | None:
    """``[resolved path, st_ino, st_size, st_mtime_ns]``, or None when it cannot be
    read. A library counts as unchanged while all four are; a list, as JSON keeps it."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except (OSError, ValueError):
        return None
    return [real, st.st_ino, st.st_size, st.st_mtime_ns]


def linker_id() -> list[Any]:
    """What decides which file ``dlopen("libnccl.so.2")`` opens: the preload and search
    path variables, their directories (a directory's mtime changes when a file appears
    in it) and ld.so.cache (rewritten by ldconfig, which package installs run)."""
    search = os.environ.get("LD_LIBRARY_PATH", "")
    dirs = [file_id(d) for d in search.split(":") if d]
    return [os.environ.get("LD_PRELOAD", ""), search, dirs, file_id(LD_SO_CACHE)]


def _valid_entry(entry: Any) -> bool:
    """An entry as ``LibraryVersionCache.store`` writes it (anything else is ignored).
    ``code > 0``: the decoders reject the rest, so a damaged entry cannot fake an error."""
    return (isinstance(entry, dict)
            and type(entry.get("code")) is int and entry["code"] > 0
            and isinstance(entry.get("source"), str)
            and isinstance(entry.get("path"), str)
            and isinstance(entry.get("file"), list)
            and "steer" in entry)


class LibraryVersionCache:
    """Version codes from earlier runs, in a JSON file (``path`` None: no cache).

    An entry is ``{code, source, path, file, steer}``: ``file`` is ``file_id(path)``
    when the library was read, ``steer`` what led to that file (None for a file path,
    ``linker_id()`` for a soname). It is used only while both are still the same.
    A missing, unreadable, corrupt or unwritable file is an empty cache, silently: a
    health check must never fail because of its own cache.
    """

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        self.entries: dict[str, dict[str, Any]] = {}
        self.dirty = False

    def reload(self) -> None:
        """Read the file afresh (other processes may have refreshed it)."""
        self.entries, self.dirty = {}, False
        if self.path is None:
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("schema") == CACHE_SCHEMA:
                entries = data.get("entries")
                if isinstance(entries, dict):
                    self.entries = {k: v for k, v in entries.items() if _valid_entry(v)}
        except Exception:  # whatever is wrong with the file, it is only a cache
            self.entries = {}

    def lookup(self, key: str, steer: Any) -> tuple[int, str] | None:
        entry = self.entries.get(key)
        if entry is None or entry["steer"] != steer or file_id(entry["path"]) != entry["file"]:
            return None
        return entry["code"], entry["source"]

    def store(self, key: str, path: str, file: list[Any] | None, steer: Any,
              found: tuple[int, str]) -> None:
        """Remember ``found`` for ``key``; ``file``: ``file_id(path)`` taken before the
        library was loaded, so a file replaced meanwhile is read again next time."""
        if self.path is None or file is None:
            return
        self.entries.pop(key, None)  # re-inserted last: the oldest entries go first
        self.entries[key] = {"code": found[0], "source": found[1], "path": path, "file": file,
                             "steer": steer}
        while len(self.entries) > CACHE_MAX_ENTRIES:
            del self.entries[next(iter(self.entries))]
        self.dirty = True

    def flush(self) -> None:
        """Write the file if anything changed: atomically, errors ignored."""
        if self.path is None or not self.dirty:
            return
        self.dirty = False
        try:
            from slurmgpu.fileutil import write_text_atomic  # tempfile: only when writing

            # Entries in insertion order, oldest first: the order `store` evicts them in.
            data = {"schema": CACHE_SCHEMA, "entries": self.entries}
            write_text_atomic(self.path, json.dumps(data, indent=1) + "\n")
        except Exception:  # read-only or missing state dir, full disk: next run reads again
            pass


def default_site_dirs() -> list[str]:
    """``site-packages``/``dist-packages`` directories on ``sys.path``."""
    return [p for p in sys.path if p and os.path.basename(p) in ("site-packages", "dist-packages")]


class SystemVersionSource:
    """``VersionSource`` for the local node.

    ``proc_root``, ``sys_root`` and ``ofed_info_path`` redirect the file probes
    (fixture trees in tests); ``etc_root`` is accepted for symmetry and for
    future /etc-based probes, none of which read it today. ``site_dirs``
    replaces the Python site directories searched for ``nvidia-*`` wheels, and
    ``search_linker=False`` skips the bare-soname ``dlopen`` attempts; both
    exist so tests are independent of what the test machine has installed.
    ``cache_path`` keeps library versions between processes (see
    ``LibraryVersionCache``; None: every collect loads the libraries), and
    ``loader`` is what loads a library (``ctypes.CDLL``; tests count the calls).
    """

    def __init__(
        self,
        settings: VersionsSettings | None = None,
        *,
        proc_root: str | Path = "/proc",
        sys_root: str | Path = "/sys",
        etc_root: str | Path = "/etc",
        ofed_info_path: str | Path = DEFAULT_OFED_INFO,
        site_dirs: Sequence[str | Path] | None = None,
        search_linker: bool = True,
        cache_path: str | os.PathLike[str] | None = None,
        loader: Loader = ctypes.CDLL,
    ) -> None:
        self.nccl_library = settings.nccl_library if settings else None
        self.cudart_library = settings.cudart_library if settings else None
        self.cuda_root = Path(settings.cuda_root if settings else DEFAULT_CUDA_ROOT)
        self.proc_root = Path(proc_root)
        self.sys_root = Path(sys_root)
        self.etc_root = Path(etc_root)
        self.ofed_info_path = Path(ofed_info_path)
        self.site_dirs = [
            Path(p) for p in (default_site_dirs() if site_dirs is None else site_dirs)
        ]
        self.search_linker = search_linker
        self.loader = loader
        self.cache = LibraryVersionCache(cache_path)

    def collect(self) -> SoftwareVersions:
        self.cache.reload()
        out = SoftwareVersions()
        probes: list[tuple[str, Callable[[], tuple[str, str] | None]]] = [
            ("kernel", self._kernel),
            ("cuda_toolkit", self._cuda_toolkit),
            ("cuda_runtime", self._cuda_runtime),
            ("nccl", self._nccl),
            ("ofed", self._ofed),
            ("ib_driver", self._ib_driver),
        ]
        for name, probe in probes:
            try:
                found = probe()
            except ProbeError as exc:
                out.errors[name] = str(exc)
                continue
            except Exception as exc:  # one broken probe must not hide the others
                out.errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            if found is not None:
                value, source = found
                setattr(out, name, value)
                out.sources[name] = source
        self.cache.flush()
        return out

    # -- probes: each returns (value, source) or None when not applicable ----------

    def _kernel(self) -> tuple[str, str]:
        path = self.proc_root / "sys" / "kernel" / "osrelease"
        try:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            text = ""
        if text:
            return text, str(path)
        return os.uname().release, "os.uname()"

    def _cuda_toolkit(self) -> tuple[str, str] | None:
        root = self.cuda_root
        problems: list[str] = []
        json_path = root / "version.json"
        try:
            data = json.loads(json_path.read_text(encoding="utf-8"))
            version = data["cuda"]["version"]
            if not isinstance(version, str) or not version:
                raise ValueError(f"cuda.version is {version!r}")
            return version, str(json_path)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"{json_path}: {type(exc).__name__}: {exc}")
        txt_path = root / "version.txt"
        try:
            m = re.search(_CUDA_TXT_RE, txt_path.read_text(encoding="utf-8", errors="replace"))
            if m:
                return m.group(1), str(txt_path)
            problems.append(f"{txt_path}: no 'CUDA Version' line")
        except FileNotFoundError:
            pass
        except OSError as exc:
            problems.append(f"{txt_path}: {exc}")
        header = root / "include" / "cuda_runtime_api.h"
        try:
            with open(header, "rb") as fh:
                hm = re.search(_CUDART_DEFINE_RE, fh.read(65536))
            if hm:
                return decode_cuda_version(int(hm.group(1))), f"{header} (CUDART_VERSION)"
        except FileNotFoundError:
            pass
        except OSError as exc:
            problems.append(f"{header}: {exc}")
        if problems:
            raise ProbeError("; ".join(problems))
        return None

    def _cuda_runtime(self) -> tuple[str, str] | None:
        found = self._library_version(
            "cudart_library",
            self.cudart_library,
            CUDART_SONAMES,
            CUDART_WHEEL_DIRS,
            ("libcudart.so.12", "libcudart.so.13", "libcudart.so.11"),
            "cudaRuntimeGetVersion",
        )
        if found is None:
            return None
        code, source = found
        return decode_cuda_version(code), source

    def _nccl(self) -> tuple[str, str] | None:
        found = self._library_version(
            "nccl_library",
            self.nccl_library,
            NCCL_SONAMES,
            NCCL_WHEEL_DIRS,
            ("libnccl.so.2",),
            "ncclGetVersion",
        )
        if found is None:
            return None
        code, source = found
        return decode_nccl_version(code), source

    def _library_version(
        self,
        setting: str,
        configured: str | None,
        sonames: Iterable[str],
        wheel_dirs: Iterable[str],
        wheel_names: Iterable[str],
        symbol: str,
    ) -> tuple[int, str] | None:
        if configured:
            what = f"configured {setting} {configured}"
            # A path must exist; a bare soname ("libnccl.so.2") goes to the linker.
            if os.sep not in configured:
                return self._from_linker((configured,), symbol, required=what)
            if not os.path.exists(configured):
                raise ProbeError(f"{what} does not exist")
            return self._from_file(configured, symbol, what)
        if self.search_linker:
            found = self._from_linker(tuple(sonames), symbol)
            if found is not None:
                return found
        candidate = self._wheel_library(wheel_dirs, tuple(wheel_names))
        if candidate is None:
            return None
        return self._from_file(str(candidate), symbol, str(candidate))

    def _wheel_library(self, wheel_dirs: Iterable[str], names: Sequence[str]) -> Path | None:
        """The first library file of a pip wheel (``nvidia-nccl-cu12``...) in the site dirs."""
        for site in self.site_dirs:
            for sub in wheel_dirs:
                for name in names:
                    candidate = site / sub / name
                    if candidate.is_file():
                        return candidate
        return None

    def _from_file(self, path: str, symbol: str, what: str) -> tuple[int, str]:
        """``symbol``'s answer from the library at ``path``, cached by the file's id."""
        key = f"{symbol} {path}"
        hit = self.cache.lookup(key, None)
        if hit is not None:
            return hit
        before = file_id(path)
        try:
            lib = self.loader(path)
        except OSError as exc:
            raise ProbeError(f"{what} cannot be loaded: {exc}") from None
        found = _query(lib, path, symbol)
        self.cache.store(key, path, before, None, found)
        return found

    def _from_linker(self, sonames: tuple[str, ...], symbol: str,
                     required: str | None = None) -> tuple[int, str] | None:
        """``symbol``'s answer from the first of ``sonames`` the dynamic linker finds.
        ``required`` names a configured library: failing to load it is an error then."""
        key = f"{symbol} linker {' '.join(sonames)}"
        steer = linker_id()
        hit = self.cache.lookup(key, steer)
        if hit is not None:
            return hit
        for soname in sonames:
            try:
                lib = self.loader(soname)
            except OSError as exc:
                if required:
                    raise ProbeError(f"{required} cannot be loaded: {exc}") from None
                continue  # not on the linker path
            found = _query(lib, soname, symbol)
            # found[1] is the file dladdr saw the symbol in: the one the linker chose. It
            # is taken after loading, so a file replaced in between can be cached stale,
            # until the file, the linker's search path or ld.so.cache next changes.
            loaded = found[1]
            self.cache.store(key, loaded, file_id(loaded) if os.path.isabs(loaded) else None,
                              steer, found)
            return found
        return None

    def _ofed(self) -> tuple[str, str] | None:
        path = self.ofed_info_path
        try:
            with open(path, "rb") as fh:
                text = fh.read(_OFED_READ_BYTES).decode("utf-8", errors="replace")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise ProbeError(f"{path}: {exc.strerror or exc}") from None
        numeric_m = re.search(_OFED_N_RE, text)
        name_m = re.search(_OFED_S_RE, text)
        name = name_m.group(1) if name_m else None
        numeric = numeric_m.group(1) if numeric_m else None
        if name is None or numeric is None:
            any_m = re.search(_OFED_ANY_RE, text)
            if any_m:
                name = name or any_m.group(1)
                numeric = numeric or any_m.group(2)
        if numeric is None and name is not None:
            tail = re.search(_NUMERIC_TAIL_RE, name)
            numeric = tail.group(1) if tail else None
        if numeric is None:
            raise ProbeError(f"{path}: no OFED release string found")
        return numeric, f"{path} ({name})" if name else str(path)

    def _ib_driver(self) -> tuple[str, str] | None:
        for module in ("mlx5_core", "ib_core"):
            path = self.sys_root / "module" / module / "version"
            try:
                text = path.read_text(encoding="utf-8", errors="replace").strip()
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                raise ProbeError(f"{path}: {exc.strerror or exc}") from None
            if text:
                return text, str(path)
        return None
