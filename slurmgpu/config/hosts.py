"""``[[hosts]]`` sections: the nodes a section applies to (a hostlist, Slurm/ClusterShell
syntax) and the values it sets. ClusterShell is imported only to parse a hostlist, after
its size is bounded from the text (a typo such as ``gpu-[1-99999999]`` must not hang a hook).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import field
from typing import Any

from slurmgpu.config.tomltext import quote
from slurmgpu.record import record

# A [[hosts]] hostlist is expanded into a set of names when it is parsed, so a typo such as
# "gpu-[1-99999999]" would hang every hook; its size is counted from the text first.
MAX_HOSTLIST_NODES = 100_000
#: The keys of a [[hosts]] section besides the settings' tables.
HOST_KEYS = ("nodes", "name")

Table = dict[str, Any]
Tables = dict[str, Table]


@record(frozen=True)
class HostSection:
    """One ``[[hosts]]`` section: its nodes and the tables it sets."""

    index: int  # position among the [[hosts]] sections, from 0
    nodes: str  # the hostlist as written
    values: Tables  # validated tables this section sets
    name: str | None = None
    nodeset: Any = field(default=None, repr=False, compare=False)  # ClusterShell NodeSet
    # The hostlist's node names, once ``names()`` expanded them.
    expanded: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def label(self) -> str:
        name = f" {self.name}" if self.name else ""
        return f"hosts[{self.index}]{name} ({self.nodes})"

    def parsed(self) -> Any:
        """The hostlist's NodeSet, parsed on first use."""
        nodeset = self.nodeset
        if nodeset is None:
            nodeset = parse_nodeset(self.nodes)
            object.__setattr__(self, "nodeset", nodeset)
        return nodeset

    def matches(self, node: str) -> bool:
        nodeset = self.parsed()
        try:
            return node in nodeset
        except Exception:  # a node name that is not valid hostlist syntax matches nothing
            return False

    def names(self) -> frozenset[str]:
        """Every node name of the hostlist (at most ``MAX_HOSTLIST_NODES``), expanded
        once and kept: for many lookups (``HostIndex``)."""
        if self.expanded is None:
            object.__setattr__(self, "expanded", frozenset(str(n) for n in self.parsed()))
        assert self.expanded is not None
        return self.expanded


# A node name that ClusterShell reads as itself (no brackets, set operators, commas or
# spaces): its membership in a hostlist is membership in the hostlist's expanded names.
_PLAIN_NODE_RE = r"[A-Za-z0-9_.-]+"


class HostIndex:
    """The ``[[hosts]]`` sections matching each of many nodes (the fleet report): each
    section's hostlist is expanded once into a set of names, where ``HostSection.matches``
    parses the node's name into a NodeSet on every call (~60 us)."""

    def __init__(self, hosts: Sequence[HostSection]) -> None:
        self.hosts = tuple(hosts)
        self._names: list[frozenset[str]] | None = None

    def matching(self, node: str) -> list[HostSection]:
        """The sections naming ``node``, in file order (as ``HostSection.matches``)."""
        if not self.hosts:
            return []
        if not re.fullmatch(_PLAIN_NODE_RE, node):
            return [h for h in self.hosts if h.matches(node)]
        if self._names is None:
            self._names = [h.names() for h in self.hosts]
        return [h for h, names in zip(self.hosts, self._names, strict=True) if node in names]


def parse_nodeset(nodes: str) -> Any:
    """Parse a hostlist; raises ValueError with a readable message."""
    if not nodes.strip():
        raise ValueError("empty hostlist")
    if "@" in nodes:
        raise ValueError(f"invalid hostlist {quote(nodes)}: node groups (@group) are not "
                         "supported; list the nodes")
    if hostlist_size_bound(nodes) > MAX_HOSTLIST_NODES:
        raise ValueError(f"hostlist {quote(nodes)} names more than {MAX_HOSTLIST_NODES:,} "
                         "nodes; a typo in a range?")

    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

    try:
        nodeset = NodeSet(nodes, resolver=RESOLVER_NOGROUP)
    except NodeSetException as e:
        raise ValueError(f"invalid hostlist {quote(nodes)}: {e}") from None
    if len(nodeset) == 0:
        raise ValueError(f"hostlist {quote(nodes)} names no nodes")
    for part in re.split(r"[,!&^]", nodes):  # NodeSet would keep "a1 a2" as one name
        if any(c.isspace() for c in part.strip()):
            raise ValueError(f"invalid hostlist {quote(nodes)}: node names cannot contain "
                             "spaces; separate nodes and ranges with commas")
    return nodeset


_RANGE_ITEM_RE = r"\s*(\d+)(?:-(\d+))?(?:/(\d+))?\s*"


def hostlist_size_bound(nodes: str) -> int:
    """An upper bound on the nodes ``nodes`` expands to, from the text alone: each
    top-level element (split at ``,`` and the set operators outside brackets) counts the
    product of its bracket ranges. Malformed ranges count 0 here; NodeSet reports them."""
    total, depth, start = 0, 0, 0
    for i, c in enumerate(nodes + ","):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif depth == 0 and c in ",!&^":
            total += _element_size_bound(nodes[start:i])
            start = i + 1
    return total


def _element_size_bound(element: str) -> int:
    size = 1
    for group in re.findall(r"\[([^\[\]]*)\]", element):
        count = 0
        for item in group.split(","):
            m = re.fullmatch(_RANGE_ITEM_RE, item)
            if not m:
                continue
            lo, hi, step = m.groups()
            if max(len(lo), len(hi or "")) > 18:  # also keeps int() under its digit limit
                return MAX_HOSTLIST_NODES + 1
            span = int(hi) - int(lo) if hi else 0
            count += max(span, 0) // max(int(step or 1), 1) + 1
        size *= max(count, 1)
        if size > MAX_HOSTLIST_NODES:  # stop before the product itself grows huge
            return size
    return size
