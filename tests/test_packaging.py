"""Static checks of packaging/ (the .deb and the RPM) against the repository: no build.

Every file the packages install exists; the hook directory both packages install holds
every wrapper of prolog/, epilog/ and daemon/ and everything those wrappers run from
their own directory; the paths etc/slurm.conf.example and the systemd units name are
installed; versions and bundled pins agree; the units pass `systemd-analyze verify`.
packaging/check_packages.sh builds both packages and checks their contents.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGING = REPO / "packaging"
DEBIAN = PACKAGING / "deb" / "debian"
SPEC = PACKAGING / "rpm" / "slurmgpu.spec"
BUNDLED = PACKAGING / "requirements-bundled.txt"
HOOKDIR = "/usr/libexec/slurmgpu"
SITE = "usr/lib/python3/dist-packages"
UNIT_SUFFIXES = (".service", ".timer")
#: pyproject dependency -> the Debian package that provides it.
DEBIAN_NAMES = {"click": "python3-click", "clustershell": "python3-clustershell",
                "structlog": "python3-structlog", "pyzmq": "python3-zmq", "msgpack": "python3-msgpack",
                "prometheus-client": "python3-prometheus-client"}
#: Bundled in the .deb instead of a Debian dependency (Debian does not package it).
DEB_BUNDLED = {"nvidia-ml-py"}
#: Debian floors below pyproject.toml's (none: pyproject.toml's floors are bookworm's
#: versions, with which the tests pass; packaging/README.md). Each must match pyproject.toml.
DEB_LOWER_FLOORS: dict[str, str] = {}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def _config_lines(path: Path) -> list[list[str]]:
    """A debhelper config file's entries (comments and blank lines dropped)."""
    return [line.split() for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def pyproject() -> dict[str, Any]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def pyproject_floors() -> dict[str, str]:
    floors = {}
    for dep in pyproject()["project"]["dependencies"]:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)\s*", dep)
        assert m, f"unexpected requirement form: {dep!r}"
        floors[_norm(m.group(1))] = m.group(2)
    return floors


def bundled_pins() -> dict[str, tuple[str, list[str]]]:
    pins = {}
    for line in BUNDLED.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)$", line)
        assert m, f"requirements-bundled.txt: not NAME==VERSION --hash=sha256:...: {line!r}"
        pins[_norm(m.group(1))] = (m.group(2), re.findall(r"[0-9a-f]{64}", m.group(3)))
    return pins


def spec_text() -> str:
    return SPEC.read_text()


def spec_install_section() -> str:
    text = spec_text()
    return text[text.index("\n%install\n"):text.index("\n%post\n")]


def rules_var(name: str) -> str:
    m = re.search(rf"^{name}\s*:=\s*(.+)$", (DEBIAN / "rules").read_text(), re.M)
    assert m, f"debian/rules has no {name}"
    return m.group(1).strip()


# ------------------------------------------------------------------ what the repo must hold


def repo_wrappers() -> dict[str, Path]:
    """Hook directory name -> repository file, from prolog/, epilog/ and daemon/: the
    wrappers themselves and the helpers they keep beside them (symlinks into slurmgpu/)."""
    found: dict[str, Path] = {}
    for d in ("prolog", "epilog", "daemon"):
        for path in sorted((REPO / d).iterdir()):
            if path.name.endswith(UNIT_SUFFIXES) or path.name.startswith("."):
                continue
            found.setdefault(path.name, path)
    return found


def test_every_file_debian_install_names_exists() -> None:
    for entry in _config_lines(DEBIAN / "slurmgpu.install"):
        *sources, _dest = entry
        for source in sources:
            assert glob.glob(str(REPO / source)), f"debian/slurmgpu.install: {source} matches nothing"
    for name in ("slurmgpu.docs", "slurmgpu.examples"):
        for (source,) in _config_lines(DEBIAN / name):
            assert glob.glob(str(REPO / source)), f"debian/{name}: {source} matches nothing"


def test_every_file_the_spec_installs_exists() -> None:
    words = re.findall(r"(?<![\w/%{}])((?:prolog|epilog|daemon|etc|docs|examples)/[\w.*-]+|README\.md)",
                       spec_install_section())
    assert len(words) > 10
    for word in words:
        assert glob.glob(str(REPO / word)), f"slurmgpu.spec %install: {word} does not exist"


def test_the_etc_default_file_gets_its_interpreter_line() -> None:
    """Both packages rewrite the SLURMGPU_PYTHON line of etc/default-slurmgpu (sed)."""
    text = (REPO / "etc" / "default-slurmgpu").read_text()
    assert len(re.findall(r"^#?SLURMGPU_PYTHON=.*$", text, re.M)) == 1


# ---------------------------------------------------- the hook directory, both packages


def deb_hookdir() -> dict[str, str]:
    """Name in /usr/libexec/slurmgpu -> repo file (install) or package path (links)."""
    names: dict[str, str] = {}
    for *sources, dest in _config_lines(DEBIAN / "slurmgpu.install"):
        if dest.strip("/") == HOOKDIR.strip("/"):
            for source in sources:
                names[Path(source).name] = source
    for target, link in _config_lines(DEBIAN / "slurmgpu.links"):
        if str(Path(link).parent).strip("/") == HOOKDIR.strip("/"):
            names[Path(link).name] = target
    return names


def rpm_hookdir() -> set[str]:
    text = spec_text()
    files = text[text.index("\n%files\n"):text.index("\n%changelog")]
    return set(re.findall(r"^%\{hookdir\}/(\S+)$", files, re.M))


def test_both_packages_install_every_wrapper_in_the_hook_directory() -> None:
    expected = set(repo_wrappers())
    assert {"slurmgpu-prolog", "slurmgpu-epilog", "slurmgpu-healthcheck", "slurmgpu-taskprolog",
            "slurmgpu-quickgate", "slurmgpu-nightly-report"} <= expected
    assert set(deb_hookdir()) == expected, "debian/slurmgpu.install + .links vs prolog/ epilog/ daemon/"
    assert rpm_hookdir() == expected, "slurmgpu.spec %files %{hookdir} vs prolog/ epilog/ daemon/"
    install = spec_install_section()
    for name in expected:
        assert name in install, f"slurmgpu.spec %install does not make {name}"


def test_the_helpers_are_the_modules_the_checkout_links() -> None:
    """A symlink in prolog/... -> ../slurmgpu/X.py is a symlink to the installed module."""
    deb = deb_hookdir()
    install = spec_install_section()
    for name, path in repo_wrappers().items():
        if path.is_symlink():
            module = Path(os.readlink(path)).name
            assert (REPO / "slurmgpu" / module).is_file()
            assert deb[name] == f"{SITE}/slurmgpu/{module}", name
            assert re.search(rf"ln -sr \S*/%{{name}}/{re.escape(module)} %{{buildroot}}%{{hookdir}}/{re.escape(name)}$",
                             install, re.M), name
        else:
            assert os.access(path, os.X_OK), f"{path} is not executable"
            assert deb[name] == str(path.relative_to(REPO)), name


def test_what_the_wrappers_run_beside_them_is_installed() -> None:
    installed = set(repo_wrappers())
    for path in repo_wrappers().values():
        if path.is_symlink():
            continue
        for name in re.findall(r'\$\(dirname "?\$0"?\)"?/([\w.-]+)', path.read_text()):
            assert name in installed, f"{path.relative_to(REPO)} runs {name} from its own directory"


def test_the_quick_client_has_its_protocol_module_beside_it() -> None:
    """slurmgpu-quickgate (a bare file: ``python -I -S``) loads slurmgpu/localproto.py from
    the directory its path resolves to. Both packages install it as a symlink to the
    installed module, so the module's package directory holds the protocol: a module of
    the package (installed with it), never a copy in the hook directory."""
    from slurmgpu import quickgate

    protocol = REPO / "slurmgpu" / quickgate.PROTOCOL_FILE
    assert protocol.is_file() and "slurmgpu*" in pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    for name, path in repo_wrappers().items():
        if name == "slurmgpu-quickgate":
            assert path.is_symlink() and path.resolve().with_name(protocol.name) == protocol, path
    assert deb_hookdir()["slurmgpu-quickgate"] == f"{SITE}/slurmgpu/quickgate.py"
    assert re.search(r"^ln -sr \S*/%\{name\}/quickgate\.py %\{buildroot\}%\{hookdir\}/slurmgpu-quickgate$",
                     spec_install_section(), re.M)


def test_slurm_conf_example_names_installed_paths() -> None:
    text = (REPO / "etc" / "slurm.conf.example").read_text()
    paths = re.findall(r"^\s*(?:Prolog|Epilog|HealthCheckProgram|TaskProlog)\s*=\s*(\S+)", text, re.M)
    assert len(paths) == 4
    for path in paths:
        assert path.startswith(HOOKDIR + "/"), path
        assert Path(path).name in repo_wrappers(), f"slurm.conf.example: {path} is not installed"


def test_the_units_run_installed_commands() -> None:
    scripts = pyproject()["project"]["scripts"]
    for unit in (REPO / "daemon").glob("*.service"):
        for command in re.findall(r"^Exec\w+=[-+@!:]*(\S+)", unit.read_text(), re.M):
            if command.startswith("/usr/bin/"):
                assert Path(command).name in scripts, f"{unit.name}: {command} is not a console script"
            elif command.startswith(HOOKDIR + "/"):
                assert Path(command).name in repo_wrappers(), f"{unit.name}: {command} is not installed"
            else:
                assert command in ("/bin/kill", "/bin/mkdir"), f"{unit.name}: {command}"


def test_both_packages_install_every_unit() -> None:
    units = sorted(p.name for p in (REPO / "daemon").iterdir() if p.name.endswith(UNIT_SUFFIXES))
    assert sorted(rules_var("UNITS").split()) == units
    files = spec_text()[spec_text().index("\n%files\n"):]
    assert sorted(re.findall(r"^%\{_unitdir\}/(\S+)$", files, re.M)) == units
    install = spec_install_section()
    for unit in units:
        assert f"daemon/{unit}" in install


def test_no_unit_is_enabled_or_started_on_install() -> None:
    rules = (DEBIAN / "rules").read_text()
    calls = re.findall(r"^\tdh_installsystemd\b(.*(?:\\\n.*)*)", rules, re.M)
    assert calls
    for call in calls:
        assert "--no-enable" in call and "--no-start" in call, call
    text = spec_text()
    post = text[text.index("\n%post\n") + len("\n%post\n"):text.index("\n%preun\n")]
    assert re.fullmatch(r"\s*%systemd_post [\w. -]+\s*", post), post  # the preset policy only


def test_private_dirs_are_root_only_in_both_packages() -> None:
    private = ("etc/slurmgpu/keys", "var/lib/slurmgpu", "var/spool/slurmgpu")
    rules = (DEBIAN / "rules").read_text()
    dirs = {line[0] for line in _config_lines(DEBIAN / "slurmgpu.dirs")}
    for d in private:
        assert d in dirs
        assert re.search(rf"^\tchmod 0700 .*\$\(PKG\)/{re.escape(d)}\b", rules, re.M), d
    files = spec_text()[spec_text().index("\n%files\n"):]
    for macro in (r"%\{_sysconfdir\}/slurmgpu/keys", r"%\{_localstatedir\}/lib/slurmgpu",
                  r"%\{_localstatedir\}/spool/slurmgpu"):
        assert re.search(rf"^%dir %attr\(0700,root,root\) {macro}$", files, re.M), macro
    for conf in (r"%\{_sysconfdir\}/slurmgpu/slurmgpu.toml", r"%\{_sysconfdir\}/sysconfig/slurmgpu"):
        assert re.search(rf"^%config\(noreplace\) {conf}$", files, re.M), conf


# ------------------------------------------------------------- versions and bundled pins


def source_version() -> str:
    """``__version__`` as slurmgpu/__init__.py spells it (what packaging/version.sh prints)."""
    m = re.search(r'^__version__ = "([^"]+)"$', (REPO / "slurmgpu" / "__init__.py").read_text(), re.M)
    assert m, "slurmgpu/__init__.py has no __version__ line"
    return m.group(1)


def test_one_version_everywhere() -> None:
    """slurmgpu/__init__.py is the one source: pyproject.toml reads it, the changelog's
    newest entry and the spec's Version: must equal it, packaging/version.sh prints it."""
    version = source_version()
    project = pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "slurmgpu.__version__"}
    changelog = (DEBIAN / "changelog").read_text().splitlines()[0]
    m = re.match(r"slurmgpu \(([^)]+)-\d+\) ", changelog)
    assert m and m.group(1) == version, changelog
    m = re.search(r"^Version:\s*(\S+)$", spec_text(), re.M)
    assert m and m.group(1) == version
    printed = subprocess.run([str(PACKAGING / "version.sh")], capture_output=True, text=True, check=True)
    assert printed.stdout.strip() == version


def test_the_installed_metadata_has_the_source_version() -> None:
    """What `pip install` recorded (the dist-info pyproject.toml's dynamic version made) is
    __init__.py's version, and so is `slurmgpu --version`."""
    from importlib.metadata import version as dist_version

    from slurmgpu import __version__

    assert dist_version("slurmgpu") == __version__ == source_version()


def test_license_is_an_spdx_string() -> None:
    """PEP 639: setuptools stops reading the `license` table after 2027-02-18."""
    assert pyproject()["project"]["license"] == "Apache-2.0"


def test_bundled_pins_cover_pyproject_and_agree_everywhere() -> None:
    pins = bundled_pins()
    floors = pyproject_floors()
    for name, floor in floors.items():
        assert name in pins, f"{name} (pyproject.toml) is not pinned in requirements-bundled.txt"
        assert _version(pins[name][0]) >= _version(floor), f"{name}: pin below pyproject.toml's >={floor}"
    # The RPM's bundled() provides name every runtime pin (not the build-only pip/setuptools).
    provides = dict(re.findall(r"^Provides:\s+bundled\(python3dist\(([\w.-]+)\)\) = (\S+)$", spec_text(), re.M))
    runtime = {n: v for n, (v, _) in pins.items() if n not in ("pip", "setuptools")}
    assert {_norm(n): v for n, v in provides.items()} == runtime
    # The .deb bundles pynvml.py from exactly the pinned wheel.
    version, hashes = pins["nvidia-ml-py"]
    assert rules_var("PYNVML_VERSION") == version
    assert rules_var("PYNVML_SHA256") in hashes
    control = (DEBIAN / "control").read_text()
    assert f"python3-pynvml (= {version})" in control
    assert version in (DEBIAN / "copyright").read_text() and rules_var("PYNVML_SHA256") in (DEBIAN / "copyright").read_text()


def test_debian_depends_cover_pyproject() -> None:
    control = (DEBIAN / "control").read_text()
    block = control[control.index("\nPackage: slurmgpu\n"):]
    depends = re.search(r"^Depends:(.*(?:\n[ \t].*)*)", block, re.M)
    assert depends
    entries = {}
    for item in depends.group(1).split(","):
        m = re.match(r"\s*([a-z0-9.+-]+)(?:\s*\(>=\s*([^)]+)\))?\s*$", item)
        if m:
            entries[m.group(1)] = m.group(2)
    for name, floor in pyproject_floors().items():
        if name in DEB_BUNDLED:
            continue
        assert name in DEBIAN_NAMES, f"{name}: which Debian package provides it? (DEBIAN_NAMES)"
        package = DEBIAN_NAMES[name]
        assert package in entries, f"debian/control does not depend on {package}"
        want = DEB_LOWER_FLOORS.get(name, floor)
        have = entries[package]
        assert have is not None and _version(have) == _version(want), \
            f"{package} (>= {have}) in debian/control; pyproject.toml says >={floor}"


# -------------------------------------------------------------------- scripts and units


def test_packaging_scripts_parse_and_are_executable() -> None:
    scripts = [*PACKAGING.glob("*.sh"), *PACKAGING.glob("*/build.sh"), DEBIAN / "rules"]
    assert len(scripts) >= 6
    for script in scripts:
        assert os.access(script, os.X_OK), f"{script.relative_to(REPO)} is not executable"
        if script.suffix == ".sh":
            subprocess.run(["bash", "-n", str(script)], check=True)
    for name in ("slurmgpu.postrm", "slurmgpu.prerm"):
        subprocess.run(["sh", "-n", str(DEBIAN / name)], check=True)
        assert "#DEBHELPER#" in (DEBIAN / name).read_text()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    """The commands they run are not installed here (checked above): stand-ins for them."""
    units = [p for p in (REPO / "daemon").iterdir() if p.name.endswith(UNIT_SUFFIXES)]
    stub = tmp_path / "stub"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    for unit in units:
        text = re.sub(r"(/usr/bin/slurmgpu|/usr/libexec/slurmgpu/[\w-]+)\b", str(stub), unit.read_text())
        (tmp_path / unit.name).write_text(text)
    proc = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / u.name) for u in units)],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"})
    assert proc.returncode == 0, proc.stdout + proc.stderr


def control_field(name: str) -> list[str]:
    """The package names a debian/control field of the binary package lists."""
    text = re.sub(r"^#.*\n", "", (DEBIAN / "control").read_text(), flags=re.M)
    m = re.search(rf"^{name}:(.*(?:\n[ \t].*)*)", text.split("\nPackage:", 1)[1], re.M)
    return [] if m is None else [p.split()[0] for p in m.group(1).replace("\n", " ").split(",") if p.strip()]


def test_slurm_client_is_only_suggested() -> None:
    """A site's own Slurm build has its scontrol: Debian's must not be pulled in to come
    first in the wrappers' PATH (Recommends are installed by default)."""
    assert "slurm-client" not in control_field("Recommends") + control_field("Depends")
    assert "slurm-client" in control_field("Suggests")


#: The .deb's conffiles, as released. dpkg asks about a conffile that both the admin and
#: the new package changed, and with no terminal (apt-get under clush or Ansible) that
#: question fails the upgrade. Change one only when it must, and say so in the changelog.
CONFFILE_SHA256 = {
    "etc/default-slurmgpu": "5564d5a3d60f0bb4d4dea522335fe15aed563a87ae4cc78db398e0be4668d419",
    "etc/logrotate-slurmgpu": "6f1eede9eb090832699e407bd560dda6b87dfa92d9a7b9b51eea39aff21843f9",
}


def test_the_conffiles_change_only_on_purpose() -> None:
    import hashlib

    for path, digest in CONFFILE_SHA256.items():
        assert hashlib.sha256((REPO / path).read_bytes()).hexdigest() == digest, (
            f"{path} changed: every node that edited it will be asked about it at the next "
            "upgrade; if that is meant, update CONFFILE_SHA256 and say so in debian/changelog")
    assert "etc/slurmgpu.toml" not in CONFFILE_SHA256  # postinst's, not a conffile
