"""SystemVersionSource: real ctypes calls into tiny gcc-built fake libraries, and
fake cuda_root / ofed_info / sysfs / procfs trees."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurmgpu.config.schema import VersionsSettings
from slurmgpu.facts import SoftwareVersions
from slurmgpu.sources import VersionSource
from slurmgpu.sources.versions import (
    ProbeError,
    SystemVersionSource,
    decode_cuda_version,
    decode_nccl_version,
)

REPO = Path(__file__).resolve().parent.parent

FAKE_NCCL = """
int ncclGetVersion(int *version) { *version = %d; return %d; }
"""
FAKE_CUDART = """
int cudaRuntimeGetVersion(int *version) { *version = %d; return 0; }
"""
NO_SYMBOL = """
int somethingElse(void) { return 0; }
"""


@dataclass(frozen=True)
class FakeLibs:
    nccl_new: Path  # 22602 -> 2.26.2
    nccl_old: Path  # 2708 -> 2.7.8
    nccl_failing: Path  # returns ncclSystemError (2)
    nccl_nosym: Path  # no ncclGetVersion
    nccl_garbage: Path  # not an ELF file
    cudart: Path  # 12040 -> 12.4


def _build(out: Path, source: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    c_file = out.parent / "src.c"
    c_file.write_text(source)
    # No -soname on purpose: a preloaded fake must never satisfy a later
    # dlopen("libnccl.so.2") by soname in this process.
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O0", "-o", str(out), str(c_file)],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory: pytest.TempPathFactory) -> FakeLibs:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the fake libraries")
    base = tmp_path_factory.mktemp("fakelibs")
    garbage = base / "garbage" / "libnccl.so.2"
    garbage.parent.mkdir()
    garbage.write_text("this is not a shared library\n")
    return FakeLibs(
        nccl_new=_build(base / "nccl-new" / "libnccl.so.2", FAKE_NCCL % (22602, 0)),
        nccl_old=_build(base / "nccl-old" / "libnccl.so.2", FAKE_NCCL % (2708, 0)),
        nccl_failing=_build(base / "nccl-fail" / "libnccl.so.2", FAKE_NCCL % (0, 2)),
        nccl_nosym=_build(base / "nccl-nosym" / "libnccl.so.2", NO_SYMBOL),
        nccl_garbage=garbage,
        cudart=_build(base / "cudart" / "libcudart.so.12", FAKE_CUDART % 12040),
    )


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    """Empty proc/sys/etc roots, an absent ofed_info and an empty cuda_root."""
    paths = {name: tmp_path / name for name in ("proc", "sys", "etc", "cuda", "site", "ofed")}
    for name in ("proc", "sys", "etc", "cuda", "site", "ofed"):
        paths[name].mkdir()
    paths["ofed_info"] = paths["ofed"] / "ofed_info"
    return paths


def make(
    roots: dict[str, Path],
    *,
    nccl: Path | str | None = None,
    cudart: Path | str | None = None,
    site_dirs: list[Path] | None = None,
) -> SystemVersionSource:
    """A source that looks only at the test's own files (no linker, no real site-packages)."""
    settings = VersionsSettings(
        nccl_library=str(nccl) if nccl else None,
        cudart_library=str(cudart) if cudart else None,
        cuda_root=str(roots["cuda"]),
    )
    return SystemVersionSource(
        settings,
        proc_root=roots["proc"],
        sys_root=roots["sys"],
        etc_root=roots["etc"],
        ofed_info_path=roots["ofed_info"],
        site_dirs=[] if site_dirs is None else site_dirs,
        search_linker=False,
    )


def same_file(a: str, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


# -- decoding -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (22602, "2.26.2"),
        (22105, "2.21.5"),
        (21903, "2.19.3"),
        (20900, "2.9.0"),
        (2708, "2.7.8"),
        (2408, "2.4.8"),
    ],
)
def test_decode_nccl(code: int, text: str) -> None:
    assert decode_nccl_version(code) == text


@pytest.mark.parametrize(
    ("code", "text"), [(12040, "12.4"), (12090, "12.9"), (11080, "11.8"), (13000, "13.0")]
)
def test_decode_cuda(code: int, text: str) -> None:
    assert decode_cuda_version(code) == text


def test_decode_rejects_nonsense() -> None:
    with pytest.raises(ProbeError):
        decode_nccl_version(0)
    with pytest.raises(ProbeError):
        decode_cuda_version(-1)


# -- NCCL ---------------------------------------------------------------------------


def test_satisfies_protocol(roots: dict[str, Path]) -> None:
    source: VersionSource = make(roots)
    assert isinstance(source.collect(), SoftwareVersions)


def test_nccl_configured(fake_libs: FakeLibs, roots: dict[str, Path]) -> None:
    v = make(roots, nccl=fake_libs.nccl_new).collect()
    assert v.nccl == "2.26.2"
    assert same_file(v.sources["nccl"], fake_libs.nccl_new)
    assert "nccl" not in v.errors


def test_nccl_old_style_code(fake_libs: FakeLibs, roots: dict[str, Path]) -> None:
    v = make(roots, nccl=fake_libs.nccl_old).collect()
    assert v.nccl == "2.7.8"
    assert same_file(v.sources["nccl"], fake_libs.nccl_old)


def test_nccl_configured_missing_is_an_error(roots: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "libnccl.so.2"
    (roots["proc"] / "sys" / "kernel").mkdir(parents=True)
    (roots["proc"] / "sys" / "kernel" / "osrelease").write_text("6.1.0-test\n")
    v = make(roots, nccl=missing).collect()
    assert v.nccl is None
    assert "nccl" not in v.sources
    assert str(missing) in v.errors["nccl"]
    assert "does not exist" in v.errors["nccl"]
    assert v.kernel == "6.1.0-test"  # the other probes still ran


def test_nccl_configured_not_loadable(fake_libs: FakeLibs, roots: dict[str, Path]) -> None:
    v = make(roots, nccl=fake_libs.nccl_garbage).collect()
    assert v.nccl is None
    assert str(fake_libs.nccl_garbage) in v.errors["nccl"]
    assert "cannot be loaded" in v.errors["nccl"]


def test_nccl_configured_bare_soname_not_found(roots: dict[str, Path]) -> None:
    v = make(roots, nccl="libslurmgpu-no-such-nccl.so.2").collect()
    assert v.nccl is None
    assert "libslurmgpu-no-such-nccl.so.2 cannot be loaded" in v.errors["nccl"]


def test_nccl_missing_symbol(fake_libs: FakeLibs, roots: dict[str, Path]) -> None:
    v = make(roots, nccl=fake_libs.nccl_nosym).collect()
    assert v.nccl is None
    assert "ncclGetVersion" in v.errors["nccl"]


def test_nccl_call_fails(fake_libs: FakeLibs, roots: dict[str, Path]) -> None:
    v = make(roots, nccl=fake_libs.nccl_failing).collect()
    assert v.nccl is None
    assert "returned error 2" in v.errors["nccl"]


def test_nccl_from_wheel_dir(fake_libs: FakeLibs, roots: dict[str, Path]) -> None:
    lib_dir = roots["site"] / "nvidia" / "nccl" / "lib"
    lib_dir.mkdir(parents=True)
    shutil.copy(fake_libs.nccl_new, lib_dir / "libnccl.so.2")
    v = make(roots, site_dirs=[roots["site"]]).collect()
    assert v.nccl == "2.26.2"
    assert same_file(v.sources["nccl"], lib_dir / "libnccl.so.2")


def test_nccl_absent_is_not_applicable(roots: dict[str, Path]) -> None:
    v = make(roots, site_dirs=[roots["site"]]).collect()
    assert v.nccl is None
    assert "nccl" not in v.errors
    assert "nccl" not in v.sources


def test_nccl_via_linker_path(fake_libs: FakeLibs, tmp_path: Path) -> None:
    """The bare-soname dlopen path; LD_LIBRARY_PATH only counts at process start."""
    code = (
        "import json; from slurmgpu.sources.versions import SystemVersionSource as S; "
        "v = S(site_dirs=[]).collect(); print(json.dumps([v.nccl, v.sources.get('nccl')]))"
    )
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_libs.nccl_new.parent))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    nccl, source = json.loads(out.stdout)
    assert nccl == "2.26.2"
    assert same_file(source, fake_libs.nccl_new)


# -- CUDA runtime -------------------------------------------------------------------


def test_cudart_configured(fake_libs: FakeLibs, roots: dict[str, Path]) -> None:
    v = make(roots, cudart=fake_libs.cudart).collect()
    assert v.cuda_runtime == "12.4"
    assert same_file(v.sources["cuda_runtime"], fake_libs.cudart)


def test_cudart_configured_missing(roots: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "libcudart.so.12"
    v = make(roots, cudart=missing).collect()
    assert v.cuda_runtime is None
    assert str(missing) in v.errors["cuda_runtime"]


@pytest.mark.parametrize("sub", ["nvidia/cuda_runtime/lib", "nvidia/cu13/lib"])
def test_cudart_from_wheel_dir(fake_libs: FakeLibs, roots: dict[str, Path], sub: str) -> None:
    lib_dir = roots["site"] / sub
    lib_dir.mkdir(parents=True)
    name = "libcudart.so.13" if "cu13" in sub else "libcudart.so.12"
    shutil.copy(fake_libs.cudart, lib_dir / name)
    v = make(roots, site_dirs=[roots["site"]]).collect()
    assert v.cuda_runtime == "12.4"
    assert same_file(v.sources["cuda_runtime"], lib_dir / name)


# -- CUDA toolkit -------------------------------------------------------------------


def test_cuda_toolkit_version_json(roots: dict[str, Path]) -> None:
    (roots["cuda"] / "version.json").write_text(
        json.dumps(
            {
                "cuda": {"name": "CUDA SDK", "version": "12.4.1"},
                "cuda_cudart": {"version": "12.4.127"},
            }
        )
    )
    (roots["cuda"] / "version.txt").write_text("CUDA Version 11.8.89\n")  # ignored: json wins
    v = make(roots).collect()
    assert v.cuda_toolkit == "12.4.1"
    assert v.sources["cuda_toolkit"] == str(roots["cuda"] / "version.json")


def test_cuda_toolkit_version_txt(roots: dict[str, Path]) -> None:
    (roots["cuda"] / "version.txt").write_text("CUDA Version 11.8.89\n")
    v = make(roots).collect()
    assert v.cuda_toolkit == "11.8.89"
    assert v.sources["cuda_toolkit"] == str(roots["cuda"] / "version.txt")


def test_cuda_toolkit_header_fallback(roots: dict[str, Path]) -> None:
    (roots["cuda"] / "include").mkdir()
    (roots["cuda"] / "include" / "cuda_runtime_api.h").write_text(
        "/* header */\n#define CUDART_VERSION  12080\n"
    )
    v = make(roots).collect()
    assert v.cuda_toolkit == "12.8"
    assert "cuda_runtime_api.h" in v.sources["cuda_toolkit"]


def test_cuda_toolkit_garbled_json(roots: dict[str, Path]) -> None:
    (roots["cuda"] / "version.json").write_text("{not json")
    v = make(roots).collect()
    assert v.cuda_toolkit is None
    assert "version.json" in v.errors["cuda_toolkit"]


def test_cuda_toolkit_garbled_json_with_txt_fallback(roots: dict[str, Path]) -> None:
    (roots["cuda"] / "version.json").write_text('{"cuda": {}}')
    (roots["cuda"] / "version.txt").write_text("CUDA Version 11.8.89\n")
    v = make(roots).collect()
    assert v.cuda_toolkit == "11.8.89"
    assert "cuda_toolkit" not in v.errors


def test_cuda_toolkit_absent(roots: dict[str, Path]) -> None:
    shutil.rmtree(roots["cuda"])
    v = make(roots).collect()
    assert v.cuda_toolkit is None
    assert "cuda_toolkit" not in v.errors


# -- OFED, IB driver, kernel --------------------------------------------------------

MLNX_OFED_INFO = """#!/bin/bash
usage()
{
\tcat <<EOF
Usage: $0 [options]
EOF
}
if [ "X$1" == "X-s" ]; then echo MLNX_OFED_LINUX-23.10-1.1.9.0:; exit 0; fi
if [ "X$1" == "X-n" ]; then echo 23.10-1.1.9.0; exit 0; fi
if [ "X$1" != "X-l" ] && [ "X$1" != "X" ]; then usage; exit 1; fi

cat << EOF
MLNX_OFED_LINUX-23.10-1.1.9.0 (OFED-23.10-1.1.9):

clusterkit:
mlnx_ofed_clusterkit/clusterkit-1.11.442-1.src.rpm
EOF
"""

DOCA_OFED_INFO = MLNX_OFED_INFO.replace(
    "MLNX_OFED_LINUX-23.10-1.1.9.0", "OFED-internal-24.10-1.1.4"
).replace("23.10-1.1.9.0", "24.10-1.1.4")

OLD_OFED_INFO = """#!/bin/bash
cat << EOF
MLNX_OFED_LINUX-4.5-1.0.1.0 (OFED-4.5-1.0.1):

ar_mgr:
osm_plugins/ar_mgr/ar_mgr-1.0-0.40.g32c9c85.tar.gz
EOF
"""


@pytest.mark.parametrize(
    ("script", "numeric", "name"),
    [
        (MLNX_OFED_INFO, "23.10-1.1.9.0", "MLNX_OFED_LINUX-23.10-1.1.9.0"),
        (DOCA_OFED_INFO, "24.10-1.1.4", "OFED-internal-24.10-1.1.4"),
        (OLD_OFED_INFO, "4.5-1.0.1.0", "MLNX_OFED_LINUX-4.5-1.0.1.0"),
    ],
)
def test_ofed_from_ofed_info_text(
    roots: dict[str, Path], script: str, numeric: str, name: str
) -> None:
    roots["ofed_info"].write_text(script)
    v = make(roots).collect()
    assert v.ofed == numeric
    assert v.sources["ofed"] == f"{roots['ofed_info']} ({name})"


def test_ofed_absent(roots: dict[str, Path]) -> None:
    v = make(roots).collect()
    assert v.ofed is None
    assert "ofed" not in v.errors


def test_ofed_unrecognised(roots: dict[str, Path]) -> None:
    roots["ofed_info"].write_text("#!/bin/sh\necho hello\n")
    v = make(roots).collect()
    assert v.ofed is None
    assert str(roots["ofed_info"]) in v.errors["ofed"]


def test_ib_driver_mlx5_core(roots: dict[str, Path]) -> None:
    for module, version in (("mlx5_core", "23.10-1.1.9"), ("ib_core", "23.10-1.1.9-ib")):
        (roots["sys"] / "module" / module).mkdir(parents=True)
        (roots["sys"] / "module" / module / "version").write_text(version + "\n")
    v = make(roots).collect()
    assert v.ib_driver == "23.10-1.1.9"
    assert v.sources["ib_driver"] == str(roots["sys"] / "module/mlx5_core/version")


def test_ib_driver_ib_core_fallback(roots: dict[str, Path]) -> None:
    (roots["sys"] / "module" / "mlx5_core").mkdir(parents=True)  # inbox: no version file
    (roots["sys"] / "module" / "ib_core").mkdir(parents=True)
    (roots["sys"] / "module" / "ib_core" / "version").write_text("24.04-0.6.6\n")
    v = make(roots).collect()
    assert v.ib_driver == "24.04-0.6.6"
    assert v.sources["ib_driver"].endswith("module/ib_core/version")


def test_ib_driver_inbox(roots: dict[str, Path]) -> None:
    (roots["sys"] / "module" / "mlx5_core").mkdir(parents=True)
    v = make(roots).collect()
    assert v.ib_driver is None
    assert "ib_driver" not in v.errors


def test_kernel_from_proc(roots: dict[str, Path]) -> None:
    (roots["proc"] / "sys" / "kernel").mkdir(parents=True)
    (roots["proc"] / "sys" / "kernel" / "osrelease").write_text("6.1.0-28-amd64\n")
    v = make(roots).collect()
    assert v.kernel == "6.1.0-28-amd64"
    assert v.sources["kernel"].endswith("sys/kernel/osrelease")


def test_kernel_fallback_uname(roots: dict[str, Path]) -> None:
    v = make(roots).collect()
    assert v.kernel == os.uname().release
    assert v.sources["kernel"] == "os.uname()"


# -- the whole collect() ------------------------------------------------------------


def test_everything_at_once(fake_libs: FakeLibs, roots: dict[str, Path]) -> None:
    (roots["cuda"] / "version.json").write_text('{"cuda": {"version": "12.4.1"}}')
    roots["ofed_info"].write_text(MLNX_OFED_INFO)
    (roots["sys"] / "module" / "mlx5_core").mkdir(parents=True)
    (roots["sys"] / "module" / "mlx5_core" / "version").write_text("23.10-1.1.9\n")
    v = make(roots, nccl=fake_libs.nccl_new, cudart=fake_libs.cudart).collect()
    assert (v.nccl, v.cuda_runtime, v.cuda_toolkit, v.ofed, v.ib_driver) == (
        "2.26.2",
        "12.4",
        "12.4.1",
        "23.10-1.1.9.0",
        "23.10-1.1.9",
    )
    assert v.errors == {}
    assert set(v.sources) == {"kernel", "nccl", "cuda_runtime", "cuda_toolkit", "ofed", "ib_driver"}


def test_unexpected_probe_failure_is_isolated(
    roots: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = make(roots)

    def boom() -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(source, "_cuda_toolkit", boom)
    v = source.collect()
    assert v.errors["cuda_toolkit"] == "RuntimeError: kaboom"
    assert v.kernel  # later/earlier probes unaffected
    assert set(v.errors) == {"cuda_toolkit"}


def test_defaults_without_settings() -> None:
    source = SystemVersionSource()
    assert source.cuda_root == Path("/usr/local/cuda")
    assert source.nccl_library is None and source.cudart_library is None
    assert source.ofed_info_path == Path("/usr/bin/ofed_info")


def test_nothing_installed_starts_no_subprocess(roots: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The prolog's hot path: no ``ofed_info``, no ``ldconfig``, no ``find_library`` (its
    speed: a few ms, the module's docstring; no wall-clock bound in a unit test)."""
    import ctypes.util
    import subprocess

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a subprocess or library search: {args}")

    monkeypatch.setattr(subprocess.Popen, "__init__", refused)
    monkeypatch.setattr(ctypes.util, "find_library", refused)
    v = make(roots, site_dirs=[roots["site"]]).collect()
    assert v.kernel and not v.errors


def test_real_machine_collect_does_not_raise() -> None:
    v = SystemVersionSource().collect()
    assert v.kernel
    for name in v.sources:
        assert getattr(v, name) is not None


def test_imports_stay_light() -> None:
    code = (
        "import sys; import slurmgpu.sources.versions, slurmgpu.sources.infiniband; "
        "print(sorted(m for m in ('structlog', 'click', 'pynvml', 'ClusterShell') if m in sys.modules))"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
