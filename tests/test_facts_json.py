"""``NodeFacts.to_json`` is ``dataclasses.asdict`` (issue 38 made it cheaper): the same
dict for a healthy node, a recorded real H100 and facts with a previous sample."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from slurmgpu.facts import NodeFacts, XidEvent
from slurmgpu.testing import make_facts

RECORDED = Path(__file__).parent / "data" / "recorded" / "h100-r580.check.json"


def as_asdict(facts: NodeFacts, include_previous: bool) -> dict[str, object]:
    data = dataclasses.asdict(facts)
    if not include_previous:
        data.pop("previous", None)
    return data


def test_to_json_is_asdict() -> None:
    recorded = NodeFacts.from_json(json.loads(RECORDED.read_text())["facts"])
    facts = make_facts()
    facts.xids = [XidEvent(xid=79, gpu=3, source="kmsg", message="fell off the bus")]
    facts.previous = make_facts(collected_at=1.0)
    for sample in (recorded, make_facts(), facts):
        for include_previous in (False, True):
            assert sample.to_json(include_previous=include_previous) == as_asdict(sample, include_previous)
            text = json.dumps(sample.to_json(include_previous=include_previous))
            assert text == json.dumps(as_asdict(sample, include_previous))
