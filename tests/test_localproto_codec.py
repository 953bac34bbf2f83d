"""The agent protocol's JSON (``localproto.dumps``/``loads``: the C codec under the json
package, without importing it, issue 38) is json's: the same text, the same values, the
same refusals; and the quick client's warm path imports neither json nor re."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmgpu import localproto

VALUES: list[Any] = [
    {}, [], "", 0, -1, 10**30, 1.5, -0.0, 1e-300, True, False, None, "é ☃ \U0001f600 \x00 \" \\ \n",
    {"op": "hook", "phase": "prolog", "env": {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,1"}, "ack": True},
    {"ok": True, "exit": 1, "records": [{"time": 1795798142.8411489, "gpus": [0, 1], "problems": ["gpu.lost GPU 1"],
                                         "nested": {"a": [[], {}, [1, [2, [3]]]]}}]},
    [float("inf"), float("-inf")],
]


@pytest.mark.parametrize("value", VALUES)
def test_dumps_is_json_dumps(value: Any) -> None:
    assert localproto.dumps(value, default=str) == json.dumps(value, default=str)
    assert localproto.dumps(value) == json.dumps(value)


def test_dumps_default() -> None:
    odd = {"path": Path("/x"), "set": {1}}
    assert localproto.dumps(odd, default=str) == json.dumps(odd, default=str)
    with pytest.raises(TypeError, match="not JSON serializable"):
        localproto.dumps(odd)


@pytest.mark.parametrize("value", VALUES)
def test_loads_is_json_loads(value: Any) -> None:
    for text in (json.dumps(value), json.dumps(value, indent=2), f" \t{json.dumps(value)}\r\n"):
        assert localproto.loads(text.encode()) == json.loads(text)


def test_loads_nan() -> None:
    assert math.isnan(localproto.loads(b'[NaN]')[0])


@pytest.mark.parametrize("line", [b"", b"  ", b'{"a": }', b'{"a": 1} x', b'{"a": 1}{}', b"\xff\xfe", b'"\\x"',
                                  b'{"a": "\x01"}', b"[1,]", b"nul"])
def test_loads_refuses_what_json_refuses(line: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(line)
    with pytest.raises(ValueError):
        localproto.loads(line)
    with pytest.raises(localproto.ProtocolError):
        localproto.decode(line)


def test_the_warm_client_imports_no_json_nor_re() -> None:
    quick = Path(localproto.__file__).with_name("quickgate.py")
    probe = ("import sys\nfrom importlib.machinery import SourceFileLoader\n"
             "q = type(sys)('slurmgpu_quickgate'); q.__file__ = sys.argv[1]\n"
             "SourceFileLoader(q.__name__, q.__file__).exec_module(q)\n"
             "p = q.protocol(); p.decode(p.encode({'a': [1]}))\n"
             "print(sorted(m for m in ('json', 're', 'socket', 'tomllib', 'typing') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(quick)], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
