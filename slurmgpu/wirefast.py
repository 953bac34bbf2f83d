"""The collector's decoding of received frames: ``wire.decode``, and the body's bytes as
received (what the store keeps).

Reports, and the bundles that carry a backlog of them, are most of what a collector
decodes (at 10,000 nodes draining spools, ~15,000 a second). When msgspec is installed
(``pip install msgspec``; Debian 13: ``python3-msgspec``), those frames are decoded and
checked in C against typed schemas, ~6 us a report against ~15 us for ``wire.decode``'s
unpacking and Python checks and re-packing the body on this project's 2.0 GHz benchmark
machine. Without msgspec, every frame takes ``wire.decode``.

The fast path answers exactly what ``wire.decode`` would, or not at all: it takes only a
frame whose every key is known and every value has the one type and bound ``wire.decode``
accepts, from a node name, epoch and summary ``wire.decode`` has already accepted once
(its findings are then made by ``wire.decode_finding``, as ``wire.decode`` makes them).
Anything else (another message type, facts sent as a map, an unknown key, a repeated
key, NUL in a string, a finding's data nested deeper than checks make it, a first frame
from a node, any invalid frame)
goes to ``wire.decode``, which decides it and says what is wrong. ``tests/test_wirefast.py`` holds the two to the same
answers over generated and mutated frames.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from slurmgpu import wire, wiresummary
from slurmgpu.result import Finding
from slurmgpu.wire import (
    ACKED,
    BUNDLE,
    MAX_BUNDLE,
    MAX_CHECK_NAME,
    MAX_CHECKS,
    MAX_EPOCH,
    MAX_FINDINGS,
    MAX_FRAME,
    MAX_GPUS,
    MAX_ID,
    MAX_NODE_NAME,
    MAX_SEQ,
    MAX_SEVERITY,
    MAX_SHORT,
    MAX_TEXT,
    MAX_THROTTLE,
    MAX_TS,
    PROTOCOL_VERSION,
    REPORT,
    Envelope,
    WireError,
    body_bytes,
    decode,
)

Decoded = tuple[Envelope, bytes]

try:
    import msgspec
    from msgspec import UNSET, Meta, Raw, Struct, UnsetType
except ImportError:  # the optional accelerator (pyproject's "fast" extra)
    msgspec = None  # type: ignore[assignment]


def decode_plain(frame: bytes) -> Decoded:
    """``wire.decode(frame)`` and, for a type the store keeps, the body's bytes as
    received (``wire.body_bytes``; b"" for the others: heartbeats, bundles, acks)."""
    env = decode(frame)
    return env, (body_bytes(frame, env.body, env.epoch) if env.type in ACKED else b"")


if msgspec is not None:
    class _Envelope(Struct, forbid_unknown_fields=True):
        v: Annotated[int, Meta(ge=PROTOCOL_VERSION, le=PROTOCOL_VERSION)]
        id: Annotated[str, Meta(min_length=1, max_length=MAX_ID)]
        node: Annotated[str, Meta(min_length=1, max_length=MAX_NODE_NAME)]
        seq: Annotated[int, Meta(ge=0, le=MAX_SEQ)]
        ts: Annotated[float, Meta(ge=0.0, le=MAX_TS)]  # (an int is taken as a float, as decode does)
        type: Literal["report", "bundle"]
        body: Raw
        epoch: Annotated[str, Meta(max_length=MAX_EPOCH)] = ""

    # A finding's data as checks make it (scalars; lists of them; maps of those): values
    # whose Python form msgspec and msgpack agree on (no ext types, string keys only).
    _Leaf = str | int | float | bool | None
    _Data = dict[str, _Leaf | list[_Leaf] | dict[str, _Leaf | list[_Leaf]]]

    class _Finding(Struct, forbid_unknown_fields=True):
        """A finding as agents send it (``wire.encode_finding``); ``wire.decode_finding``
        makes it a ``Finding`` after this check, as ``wire.decode`` does."""

        check: Annotated[str, Meta(max_length=MAX_CHECK_NAME)]
        severity: Annotated[str, Meta(max_length=MAX_SEVERITY)]
        gpu: Annotated[int, Meta(ge=0, lt=MAX_GPUS)] | None = None
        subject: Annotated[str, Meta(max_length=MAX_SHORT)] | None = None
        message: Annotated[str, Meta(max_length=MAX_TEXT)] | None = None
        not_applicable: _Leaf = None
        data: _Data | None = None

    class _Report(Struct, forbid_unknown_fields=True):
        """A report, its facts and summary pre-packed (as agents send them)."""

        verdict: Annotated[str, Meta(max_length=MAX_SEVERITY)]
        findings: Annotated[list[_Finding], Meta(max_length=MAX_FINDINGS)]
        ok_checks: (Annotated[list[Annotated[str, Meta(max_length=MAX_CHECK_NAME)]],
                              Meta(max_length=MAX_CHECKS)] | UnsetType | None) = UNSET
        throttle: Annotated[int, Meta(ge=0, le=MAX_THROTTLE)] | UnsetType | None = UNSET
        summary: bytes | UnsetType | None = UNSET
        facts: bytes | UnsetType | None = UNSET

    class _Bundle(Struct, forbid_unknown_fields=True):
        frames: Annotated[list[bytes], Meta(min_length=1, max_length=MAX_BUNDLE)]

    _envelope = msgspec.msgpack.Decoder(_Envelope).decode
    _checkers: dict[str, Callable[[Any], Any]] = {
        REPORT: msgspec.msgpack.Decoder(_Report).decode,
        BUNDLE: msgspec.msgpack.Decoder(_Bundle).decode}
    _plain_map = msgspec.msgpack.Decoder().decode  # (a checked body: what msgpack.unpackb gives)
    _good_nodes, _good_epochs = wire._GOOD_NODES, wire._GOOD_EPOCHS
    _good_summaries = wiresummary._GOOD_SUMMARIES
    _new_envelope, _set_attr = object.__new__, object.__setattr__
    _decode_finding = wire.decode_finding
    _map_size = wire.map_size

    def _fast(frame: bytes) -> Decoded | None:
        """A report or bundle frame decoded in C; None: ``wire.decode`` decides it."""
        if len(frame) > MAX_FRAME:
            return None
        try:
            head = _envelope(frame)
            raw = head.body
            mtype = head.type
            checked = _checkers[mtype](raw)  # (the types and bounds, every byte of the body)
            body = {"frames": checked.frames} if mtype == BUNDLE else _plain_map(raw)
        except Exception:  # msgspec's errors, UnicodeDecodeError: wire.decode says which
            return None
        node, epoch = head.node, head.epoch
        # (a key repeated, or an empty epoch sent; NUL, which a store cannot keep)
        if _map_size(frame) != (8 if epoch else 7) or "\x00" in head.id:
            return None
        if node not in _good_nodes.items or (epoch and epoch not in _good_epochs.items):
            return None
        findings: tuple[Finding, ...] = ()
        if mtype == BUNDLE:
            packed = b""
        else:
            if "\x00" in body["verdict"] or "\x00" in "".join(body.get("ok_checks") or ()):
                return None
            if body["findings"]:
                try:  # (as wire.decode makes them; its checks passed above)
                    findings = tuple([_decode_finding(f, REPORT) for f in body["findings"]])
                except WireError:
                    return None
            summary = body.get("summary")
            if summary is not None and summary not in _good_summaries.items:
                return None
            packed = bytes(raw)
        # (as wire.decode builds it: the fields set at once)
        env = _new_envelope(Envelope)
        _set_attr(env, "__dict__", {"type": mtype, "node": node, "seq": head.seq, "body": body,
                                    "id": head.id, "ts": head.ts, "v": head.v, "epoch": epoch,
                                    "findings": findings})
        return env, packed

    def decode_received(frame: bytes) -> Decoded:
        """``frame`` decoded as ``wire.decode`` does (the same envelope, the same
        WireError), with the body's bytes as received (``decode_plain``)."""
        return _fast(frame) or decode_plain(frame)

    FAST = True
else:
    decode_received = decode_plain
    FAST = False
