"""The frame builders in ``slurmgpu.wire`` give exactly the bytes the code they replaced
gave (issue 14, move 3): the collector's hand-packed acks and heartbeat replies
(``collector/server.py``'s ``_FrameBuilder``), its commands, the agent's heartbeats and
spooled messages (``wire.encode`` of an ``Envelope`` in ``agent/link.py`` and
``agent/core.py``) and the load simulator's reports and hellos (``sim/fleet.py``).

``OLD`` was produced by that code before the move, with the message id source (uuid4)
and the clock pinned (ids ``0123456789abcdef…``, ts 1790000000.25): the bytes on the wire
must not change with where they are built."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from slurmgpu import wire
from slurmgpu.sim import fleet

TS = 1790000000.25
PREFIX = "0123456789abcdef"
UUID = "0123456789abcdef0123456789abcdef"

OLD = {
    "ack_plain": (
        "87a17601a26964d92030313233343536373839616263646566303030303030303030303030303030"
        "31a46e6f6465a56770752d61a373657100a27473cb41daac4ee0100000a474797065a361636ba462"
        "6f647981a47365717393010203"),
    "ack_epoch": (
        "88a17601a26964d92030313233343536373839616263646566303030303030303030303030303030"
        "32a46e6f6465a56770752d61a373657100a27473cb41daac4ee0100000a474797065a361636ba462"
        "6f647981a4736571739107a565706f6368a6653166326133"),
    "ack_rejected": (
        "88a17601a26964d92030313233343536373839616263646566303030303030303030303030303030"
        "33a46e6f6465a56770752d62a373657100a27473cb41daac4ee0100000a474797065a361636ba462"
        "6f647982a47365717393040506a872656a65637465649105a565706f6368a26570"),
    "ack_big": (
        "87a17601a26964d92030313233343536373839616263646566303030303030303030303030303030"
        "34a46e6f6465d9696e6f64652d787878787878787878787878787878787878787878787878787878"
        "78787878787878787878787878787878787878787878787878787878787878787878787878787878"
        "787878787878787878787878787878787878787878787878787878787878787878a373657100a274"
        "73cb41daac4ee0100000a474797065a361636ba4626f647982a47365717393cf0000010000000000"
        "ce0001117000a872656a656374656491ce00011170"),
    "heartbeat_reply": (
        "87a17601a26964d92030313233343536373839616263646566303030303030303030303030303030"
        "35a46e6f6465a56770752d61a373657100a27473cb41daac4ee0100000a474797065a96865617274"
        "62656174a4626f647980"),
    "heartbeat_reply_2": (
        "87a17601a26964d92030313233343536373839616263646566303030303030303030303030303030"
        "36a46e6f6465a56770752d62a373657100a27473cb41daac4ee0100000a474797065a96865617274"
        "62656174a4626f647980"),
    "command": (
        "87a17601a26964d92066656564666163656665656466616365666565646661636566656564666163"
        "65a46e6f6465a56770752d61a373657100a27473cb41daac4ee0100000a474797065a7636f6d6d61"
        "6e64a4626f647982a7636f6d6d616e64aa636865636b706f696e74a46172677382a66a6f625f6964"
        "a137a8646561646c696e65cb4029000000000000"),
    "command_noargs": (
        "87a17601a26964d92063636363636363636363636363636363636363636363636363636363636363"
        "63a46e6f6465a56770752d61a373657100a27473cb41daac4ee0100000a474797065a7636f6d6d61"
        "6e64a4626f647982a7636f6d6d616e64a77265636865636ba46172677380"),
    "agent_heartbeat": (
        "87a17601a26964d92030313233343536373839616263646566303132333435363738396162636465"
        "66a46e6f6465a26e31a373657100a27473cb41daac4ee0100000a474797065a96865617274626561"
        "74a4626f647980"),
    "agent_hello": (
        "88a17601a26964d92030313233343536373839616263646566303132333435363738396162636465"
        "66a46e6f6465a26e31a37365712aa27473cb41daac4ee0400000a474797065a568656c6c6fa4626f"
        "647983a776657273696f6ea5312e322e33a46770757308aa696e74657276616c5f73cb402e000000"
        "000000a565706f6368a56570306368"),
    "agent_hello_noepoch": (
        "87a17601a26964d92030313233343536373839616263646566303132333435363738396162636465"
        "66a46e6f6465a26e31a37365712ba27473cb41daac4ee0100000a474797065a568656c6c6fa4626f"
        "647983a776657273696f6ea5312e322e33a46770757308aa696e74657276616c5f73cb402e000000"
        "000000"),
    "agent_report": (
        "88a17601a26964d92030313233343536373839616263646566303132333435363738396162636465"
        "66a46e6f6465a26e31a37365712aa27473cb41daac4ee0400000a474797065a67265706f7274a462"
        "6f647985a776657264696374a44641494ca866696e64696e67739187a5636865636ba76770752e65"
        "6363a87365766572697479a44641494ca367707503a77375626a656374c0a76d657373616765a344"
        "4245ae6e6f745f6170706c696361626c65c2a46461746181a364626502a96f6b5f636865636b7391"
        "ab6770752e746865726d616ca56661637473c40481a16b01a87468726f74746c6500a565706f6368"
        "a56570306368"),
    "agent_report_noepoch": (
        "87a17601a26964d92030313233343536373839616263646566303132333435363738396162636465"
        "66a46e6f6465a26e31a37365712ba27473cb41daac4ee0100000a474797065a67265706f7274a462"
        "6f647985a776657264696374a44641494ca866696e64696e67739187a5636865636ba76770752e65"
        "6363a87365766572697479a44641494ca367707503a77375626a656374c0a76d657373616765a344"
        "4245ae6e6f745f6170706c696361626c65c2a46461746181a364626502a96f6b5f636865636b7391"
        "ab6770752e746865726d616ca56661637473c40481a16b01a87468726f74746c6500"),
    "agent_event": (
        "88a17601a26964d92030313233343536373839616263646566303132333435363738396162636465"
        "66a46e6f6465a26e31a37365712aa27473cb41daac4ee0400000a474797065a56576656e74a4626f"
        "647986a46b696e64a3786964a367707503a4646174614fa776657264696374a44641494ca866696e"
        "64696e67739187a5636865636ba76770752e656363a87365766572697479a44641494ca367707503"
        "a77375626a656374c0a76d657373616765a3444245ae6e6f745f6170706c696361626c65c2a46461"
        "746181a364626502a76d657373616765b266616c6c656e206f66662074686520627573a565706f63"
        "68a56570306368"),
    "agent_event_noepoch": (
        "87a17601a26964d92030313233343536373839616263646566303132333435363738396162636465"
        "66a46e6f6465a26e31a37365712ba27473cb41daac4ee0100000a474797065a56576656e74a4626f"
        "647986a46b696e64a3786964a367707503a4646174614fa776657264696374a44641494ca866696e"
        "64696e67739187a5636865636ba76770752e656363a87365766572697479a44641494ca367707503"
        "a77375626a656374c0a76d657373616765a3444245ae6e6f745f6170706c696361626c65c2a46461"
        "746181a364626502a76d657373616765b266616c6c656e206f66662074686520627573"),
    "agent_command-result": (
        "88a17601a26964d92030313233343536373839616263646566303132333435363738396162636465"
        "66a46e6f6465a26e31a37365712aa27473cb41daac4ee0400000a474797065ae636f6d6d616e642d"
        "726573756c74a4626f647983aa636f6d6d616e645f6964d920666666666666666666666666666666"
        "6666666666666666666666666666666666a26f6bc3a6726573756c7481a4706f6e6701a565706f63"
        "68a56570306368"),
    "agent_command-result_noepoch": (
        "87a17601a26964d92030313233343536373839616263646566303132333435363738396162636465"
        "66a46e6f6465a26e31a37365712ba27473cb41daac4ee0100000a474797065ae636f6d6d616e642d"
        "726573756c74a4626f647983aa636f6d6d616e645f6964d920666666666666666666666666666666"
        "6666666666666666666666666666666666a26f6bc3a6726573756c7481a4706f6e6701"),
    "sim_hello": (
        "87a17601a26964d92030313233343536373839616263646566303132333435363738396162636465"
        "66a46e6f6465a973696d2d3030303031a373657101a27473cb41daac4ee0100000a474797065a568"
        "656c6c6fa4626f647983a776657273696f6ea373696da46770757308aa696e74657276616c5f73cb"
        "402e000000000000"),
    "sim_report_small": (
        "87a17601a26964d92030303030303030323030303030303030303030303030303030303030303030"
        "39a46e6f6465a973696d2d3030303032a373657109a27473cb41daac4ee0100000a474797065a672"
        "65706f7274a4626f647983a776657264696374a24f4ba866696e64696e677390a96f6b5f63686563"
        "6b7391a76770752e656363"),
}
# (the simulated facts blob carries every NodeFacts field: new fact fields change these)
SIM_REPORT_SHA256 = ("cddfbd80195bc81ca79fc81ba4316a03d3964e17e23b6e9b5a18c337142211d5",
                     "d96563ee14bf4b0cfa867dad8b55781f1d4355d3c602f63e01cfe5a60118e4fa")

FINDING = {"check": "gpu.ecc", "severity": "FAIL", "gpu": 3, "subject": None, "message": "DBE",
           "not_applicable": False, "data": {"dbe": 2}}
BODIES: dict[str, dict[str, Any]] = {
    "hello": {"version": "1.2.3", "gpus": 8, "interval_s": 15.0},
    "report": {"verdict": "FAIL", "findings": [FINDING], "ok_checks": ["gpu.thermal"],
               "facts": b"\x81\xa1k\x01", "throttle": 0},
    "event": {"kind": "xid", "gpu": 3, "data": 79, "verdict": "FAIL", "findings": [FINDING],
              "message": "fallen off the bus"},
    "command-result": {"command_id": "f" * 32, "ok": True, "result": {"pong": 1}},
}


def old(name: str) -> bytes:
    return bytes.fromhex(OLD[name])


def test_collector_acks_and_heartbeat_replies() -> None:
    def mid(n: int) -> str:  # (the ids the frames were recorded with)
        return f"{PREFIX}{n:016x}"

    assert wire.ack_frame("gpu-a", [1, 2, 3], id=mid(1), ts=TS) == old("ack_plain")
    assert wire.ack_frame("gpu-a", [7], epoch="e1f2a3", id=mid(2), ts=TS) == old("ack_epoch")
    assert wire.ack_frame("gpu-b", [4, 5, 6], epoch="ep", rejected=[5], id=mid(3), ts=TS) == old("ack_rejected")
    assert wire.ack_frame("node-" + "x" * 100, [2**40, 70000, 0], rejected=[70000], id=mid(4),
                          ts=TS) == old("ack_big")
    assert wire.reply_heartbeat_frame("gpu-a", id=mid(5), ts=TS) == old("heartbeat_reply")
    assert wire.reply_heartbeat_frame("gpu-b", id=mid(6), ts=TS) == old("heartbeat_reply_2")


def test_commands() -> None:
    args = {"job_id": "7", "deadline": 12.5}
    assert wire.command_frame("gpu-a", "checkpoint", args, id="feedface" * 4, ts=TS) == old("command")
    assert wire.command_frame("gpu-a", "recheck", None, id="c" * 32, ts=TS) == old("command_noargs")


def test_agent_heartbeat() -> None:
    assert wire.heartbeat_frame("n1", id=UUID, ts=TS) == old("agent_heartbeat")


@pytest.mark.parametrize("mtype", sorted(BODIES))
def test_agent_messages(mtype: str) -> None:
    body = BODIES[mtype]
    assert wire.message_frame(mtype, "n1", 42, body, epoch="ep0ch", ts=float(1790000001),
                              id=UUID) == old(f"agent_{mtype}")
    assert wire.message_frame(mtype, "n1", 43, body, ts=TS, id=UUID) == old(f"agent_{mtype}_noepoch")


def test_simulator_frames() -> None:
    assert wire.hello_frame("sim-00001", 1, version="sim", gpus=8, interval_s=15.0, id=UUID,
                            ts=TS) == old("sim_hello")
    maker = fleet.FrameMaker(seed=0, variants=4)
    part = maker.node_part("sim-00001")
    assert [hashlib.sha256(maker.report(part, 1, seq, TS + seq - 5)).hexdigest()
            for seq in (5, 6)] == list(SIM_REPORT_SHA256)
    small = wire.packed({"verdict": "OK", "findings": [], "ok_checks": ["gpu.ecc"]})
    frame = wire.ReportFrames().report(wire.ReportFrames.node_part("sim-00002"), f"{2:08x}{9:024x}", 9,
                                       TS, small)
    assert frame == old("sim_report_small")


def test_acks_offer_bundles_and_report_frames_are_encode_unchecked() -> None:
    """An ack says the bundle size offered; the simulator's hand-packed reports are what
    ``encode_unchecked`` packs."""
    got = wire.ack_frame("n1", [3, 1], epoch="ep", rejected=[1], bundle=wire.MAX_BUNDLE, ts=TS)
    assert wire.decode(got).body == {"seqs": [3, 1], "rejected": [1], "bundle": wire.MAX_BUNDLE}
    body = {"verdict": "OK", "findings": []}
    report = wire.ReportFrames().report(wire.ReportFrames.node_part("n1"), "m1", 4, TS,
                                        wire.packed(body))
    assert report == wire.encode_unchecked(wire.Envelope(type=wire.REPORT, node="n1", seq=4, body=body,
                                                         id="m1", ts=TS))
