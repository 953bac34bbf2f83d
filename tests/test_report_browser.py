"""The fleet report's HTML in a real browser: headless Chromium renders it at phone and
desktop widths (screenshots: right size, not blank), its DOM has every section, and the
browser logs no script errors (the report has no JavaScript at all).

Needs `chromium` (Debian package; .ci/run installs it). Skipped without it, except under
CI (``$CI`` set), where a missing browser fails the test instead of hiding it.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import NoReturn

import pytest

from slurmgpu.report import SECTIONS
from slurmgpu.sim.seed import seed

NOW = "2026-11-26T06:00:00Z"
END = datetime(2026, 11, 26, 6, tzinfo=UTC).timestamp()
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TIMEOUT_S = 90
WIDTHS = {"phone": 390, "desktop": 1366}
HEIGHT = 2400
CONSOLE_ERRORS = ("Uncaught", "SyntaxError", "ReferenceError", "TypeError:")


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):  # CI installs chromium: a skip would hide a failure
        pytest.fail(f"headless browser unavailable under CI: {reason}", pytrace=False)
    pytest.skip(f"headless browser unavailable: {reason}")


def _browser() -> str:
    explicit = os.environ.get("SLURMGPU_TEST_BROWSER")
    if explicit:
        return explicit
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    _unavailable("no chromium on PATH (apt-get install chromium)")


def _chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--no-default-browser-check", "--hide-scrollbars",
           "--force-device-scale-factor=1", "--enable-logging=stderr", "--v=0",
           f"--user-data-dir={profile}", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"chromium did not finish within {TIMEOUT_S} s: {' '.join(args)}")


def _png(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct scanlines) of a PNG, from its IHDR and IDAT chunks."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            ihdr = body
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", ihdr[:10])
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(colour)
    assert channels and depth == 8, f"unexpected PNG format: colour type {colour}, depth {depth}"
    raw = zlib.decompress(b"".join(idat))
    stride = 1 + width * channels
    assert len(raw) == stride * height
    # A blank page filters to the same scanline over and over; a rendered report does not.
    rows = {raw[i:i + stride] for i in range(0, len(raw), stride)}
    return width, height, len(rows)


class _Sections(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section":
            self.ids.extend(v for k, v in attrs if k == "id" and v)
        elif tag == "script":
            self.scripts += 1


@pytest.fixture(scope="module")
def report_html(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    browser = _browser()
    tmp = tmp_path_factory.mktemp("browser")
    db = tmp / "fleet.db"
    seed(db, nodes=50, days=7, end=END, seed=0)
    config = tmp / "slurmgpu.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp}"\n')
    out = tmp / "r.html"
    proc = subprocess.run([sys.executable, "-m", "slurmgpu", "report", "--format", "html", "--since", "7d",
                           "--now", NOW, "--db", str(db), "--config", str(config), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    yield browser, out


@pytest.mark.parametrize("layout", sorted(WIDTHS))
def test_screenshot(report_html: tuple[str, Path], tmp_path: Path, layout: str) -> None:
    browser, page = report_html
    shot = tmp_path / f"{layout}.png"
    width = WIDTHS[layout]
    proc = _chromium(browser, tmp_path / "profile", f"--screenshot={shot}",
                     f"--window-size={width},{HEIGHT}", page.as_uri())
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    png_width, png_height, distinct_rows = _png(shot)
    assert (png_width, png_height) == (width, HEIGHT)
    assert shot.stat().st_size > 20_000, "screenshot suspiciously small (blank page?)"
    assert distinct_rows > HEIGHT // 10, f"only {distinct_rows} distinct scanlines: blank page?"
    errors = [line for line in proc.stderr.splitlines() if any(e in line for e in CONSOLE_ERRORS)]
    assert not errors, errors
    if os.environ.get("SLURMGPU_KEEP_SCREENSHOTS"):
        shutil.copy(shot, Path(os.environ["SLURMGPU_KEEP_SCREENSHOTS"]) / shot.name)


def test_dom_has_every_section(report_html: tuple[str, Path], tmp_path: Path) -> None:
    browser, page = report_html
    proc = _chromium(browser, tmp_path / "profile", "--window-size=1366,2400", "--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    parser = _Sections()
    parser.feed(proc.stdout)
    assert [s for s in SECTIONS if s not in parser.ids] == []
    assert parser.scripts == 0  # no JavaScript in the report
    errors = [line for line in proc.stderr.splitlines() if any(e in line for e in CONSOLE_ERRORS)]
    assert not errors, errors
