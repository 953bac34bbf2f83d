"""The quick client reads ``[agent] socket`` and ``query_timeout_s`` without a TOML
parser (issue 38): ``localproto.scan_table`` gives what tomllib gives, or says it is
unsure (then the client parses the file); and it runs on no Python older than 3.8."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from slurmgpu import localproto, quickgate

KEYS = localproto.AGENT_KEYS

PLAIN = [
    "",
    '[agent]\nsocket = "/f.sock"\nquery_timeout_s = 3\n',
    "[agent]\nsocket = '/lit\\\\eral.sock'  # a comment\nquery_timeout_s = 0.25 # s\n",
    '# top\n[gpu]\ncount = 8\nsocket = "/not-agent.sock"\n\n[ agent ]  # the agent\n  socket="/a#b.sock"\n',
    '[agent]\nmax_age_s = 5\n[agent.limits]\nsocket = "/sub.sock"\n[prolog]\nquery_timeout_s = 9\n',
    '[checks]\ndisabled = [\n  "ib.*",\n  "pin.*",\n]\n[agent]\nquery_timeout_s = 1_000\n',
    '[[xid.override]]\ncode = 79\n[agent]\nsocket = ""\n',
    '[agent]\nsocket = "/first.sock"\n[collector]\nendpoint = "tcp://h:1"  # socket = "/x"\n',
]
UNSURE = [
    'agent.socket = "/dotted.sock"\n',
    'agent = { socket = "/inline.sock" }\n',
    '[agent]\nsocket = """/multi\n.sock"""\n',
    '[agent]\nsocket = "/esc\\u0061ped.sock"\n',
    '["agent"]\nsocket = "/quoted-table.sock"\n',
    '[agent]\n"socket" = "/quoted-key.sock"\n',
    '[agent]\nquery_timeout_s = 0x10\n',
    '[agent]\nsocket = ["/a", "/b"]\n',
    '[agent]\nmatrix = [\n  [1, 2],\n]\nsocket = "/after.sock"\n',
]


def parsed(text: str) -> dict[str, object]:
    agent = tomllib.loads(text).get("agent", {})
    return {k: v for k, v in agent.items() if k in KEYS}


@pytest.mark.parametrize("text", PLAIN)
def test_plain_lines_read_as_tomllib_reads_them(text: str) -> None:
    assert localproto.scan_table(text, "agent", KEYS) == parsed(text)


@pytest.mark.parametrize("text", UNSURE)
def test_anything_else_is_left_to_tomllib(text: str, tmp_path: Path) -> None:
    assert localproto.scan_table(text, "agent", KEYS) is None
    config = tmp_path / "slurmgpu.toml"
    config.write_text(text)
    assert quickgate.agent_settings(str(config)) == tomllib.loads(text).get("agent", {})


def test_the_warm_path_imports_no_toml_parser(tmp_path: Path) -> None:
    config = tmp_path / "slurmgpu.toml"
    config.write_text(PLAIN[1])
    assert quickgate.agent_endpoint(["--config", str(config)], {}) == ("/f.sock", 3.0)
    import subprocess

    probe = ("import sys; from slurmgpu import quickgate; "
             f"print(quickgate.agent_endpoint(['--config', {str(config)!r}], {{}})); "
             "print('tomllib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["('/f.sock',", "3.0)", "False"]


def test_an_old_python_is_not_an_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapper takes 100..227 as the client's answer; anything else: next interpreter."""
    monkeypatch.setattr(sys, "version_info", (3, 7, 9, "final", 0))
    monkeypatch.setenv(quickgate.WRAPPER_ENV, "1")
    assert quickgate.main(["prolog"]) == quickgate.NOT_AN_ANSWER


@pytest.mark.parametrize("dropin", ['[agent]\nsocket = "/dropin.sock"\n', 'agent.socket = "/dotted-dropin.sock"\n',
                                    "[gpu]\ncount = 8\n"])
def test_dropins_are_scanned_too(tmp_path: Path, dropin: str) -> None:
    """A drop-in (``<name>.d/*.toml``) overrides the file's keys, scanned or parsed."""
    config = tmp_path / "slurmgpu.toml"
    config.write_text(PLAIN[1])
    (tmp_path / "slurmgpu.d").mkdir()
    (tmp_path / "slurmgpu.d" / "50-site.toml").write_text(dropin)
    assert quickgate.agent_settings(str(config)) == quickgate._table(quickgate.read_config(str(config)), "agent")
