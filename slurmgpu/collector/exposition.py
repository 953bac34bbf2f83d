"""The Prometheus text format (version 0.0.4) of ``/metrics``, with the per-node families
written straight to text.

prometheus-client formats every sample through a ``Sample`` tuple, a label-dict sort and
name validation: ~20 us a sample, most of a 10,000-node scrape (~40k per-node samples).
A ``NodeFamily`` keeps its rows as (label values, value) and writes its lines itself,
byte for byte what ``prometheus_client.generate_latest`` writes for the same family (its
``samples`` builds the ``Sample`` list for anyone who asks: tests, a plain registry).
Every other family still goes through ``generate_latest``.

The format (https://prometheus.io/docs/instrumenting/exposition_formats/): per family a
``# HELP name doc`` line (backslash and newline escaped), a ``# TYPE name type`` line,
then one ``name{label="value",...} value`` line per sample, labels in name order, label
values with backslash, double quote and newline escaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString


def escape_label_value(value: str) -> str:
    """A label value as the text format quotes it: ``\\`` ``"`` and newline escaped."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def escape_help(text: str) -> str:
    """A HELP text: backslash and newline escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


# floatToGoString of the small integer values per-node gauges mostly carry (codes, 0/1).
_SMALL: dict[float, str] = {i: floatToGoString(i) for i in range(-1, 130)}


def format_value(value: float) -> str:
    """A sample value as prometheus-client writes it (Go's float formatting)."""
    if type(value) is int:  # (not a bool)
        text = _SMALL.get(value)
        if text is not None:
            return text
    elif type(value) is float and 0.0 <= value < 1e6:  # under 7 integer digits: repr, as Go
        return repr(value)
    return str(floatToGoString(value))


def format_values(values: list[float]) -> list[str]:
    """``format_value`` of each value; a column of small ints, or of floats, in one pass."""
    kinds = set(map(type, values))
    if kinds == {int}:
        try:
            return [_SMALL[v] for v in values]
        except KeyError:
            pass
    elif kinds == {float}:
        go = floatToGoString
        return [repr(v) if 0.0 <= v < 1e6 else str(go(v)) for v in values]
    return [format_value(v) for v in values]


class NodeFamily(Metric):
    """A gauge family with many samples, written to text without ``Sample`` objects.
    Its samples are columns: ``columns[i]`` the values of ``labels[i]``, ``values`` the
    samples' values (no object per sample: a 10k-node scrape allocates no 40k tuples for
    the garbage collector to walk); ``add`` appends one sample. ``prefixes``: each
    sample's line up to its value, as ``prefixes()`` writes them (kept by a caller that
    writes the same samples, their values aside, scrape after scrape)."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str],
                 columns: Sequence[Sequence[str]] = (), values: Sequence[float] = (),
                 prefixes: list[str] | None = None) -> None:
        # (no Metric.__init__: its ``samples`` list is this class's property)
        self.name, self.documentation, self.type, self.unit = name, documentation, "gauge", ""
        self.labels = tuple(labels)
        self.columns = [list(c) for c in columns] if columns else [[] for _ in labels]
        self.values = list(values)
        self._prefixes = prefixes

    def add(self, label_values: Sequence[str], value: float) -> None:
        for column, label_value in zip(self.columns, label_values, strict=True):
            column.append(label_value)
        self.values.append(value)
        self._prefixes = None

    @property
    def samples(self) -> list[Sample]:  # type: ignore[override]
        return [Sample(self.name, dict(zip(self.labels, label_values, strict=True)), value, None, None)
                for *label_values, value in zip(*self.columns, self.values, strict=True)]

    def prefixes(self) -> list[str]:
        """Each sample's line up to its value: ``name{label="value",...} ``, labels in
        name order, label values escaped."""
        order = sorted(range(len(self.labels)), key=lambda i: self.labels[i])  # by name
        columns = [self._escaped(self.columns[i]) for i in order]
        if len(columns) == 1:  # {node="..."}: the usual case
            start = f'{self.name}{{{self.labels[order[0]]}="'
            return [f'{start}{n}"}} ' for n in columns[0]]
        starts = [f'{"," if k else ""}{self.labels[i]}="' for k, i in enumerate(order)]
        if len(columns) == 2:  # {gpu="...",node="..."}
            first, second = f"{self.name}{{{starts[0]}", f'"{starts[1]}'
            return [f'{first}{a}{second}{b}"}} ' for a, b in zip(*columns, strict=True)]
        if not columns:
            return [f'{self.name}{{"}} '] * len(self.values)
        quote = '"'
        return [f'{self.name}{{{quote.join(s + v for s, v in zip(starts, label_values, strict=True))}"}} '
                for label_values in zip(*columns, strict=True)]

    def text(self) -> str:
        """The family's HELP, TYPE and sample lines, as ``generate_latest`` writes them."""
        head = (f"# HELP {self.name} {escape_help(self.documentation)}\n"
                f"# TYPE {self.name} {self.type}\n")
        prefixes = self.prefixes() if self._prefixes is None else self._prefixes
        return head + "".join([f"{p}{v}\n" for p, v in zip(prefixes, format_values(self.values), strict=True)])

    @staticmethod
    def _escaped(column: list[str]) -> list[str]:
        joined = "".join(column)
        if "\\" in joined or '"' in joined or "\n" in joined:
            return [escape_label_value(v) for v in column]
        return column


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def generate(collector: Collector) -> bytes:
    """The text format of everything ``collector.collect()`` yields (a registry, say):
    ``generate_latest``'s bytes, with each ``NodeFamily`` written by itself."""
    from prometheus_client import generate_latest

    out: list[bytes] = []
    pending: list[Metric] = []
    for metric in collector.collect():
        if isinstance(metric, NodeFamily):
            if pending:
                out.append(generate_latest(_Families(pending)))
                pending = []
            out.append(metric.text().encode())
        else:
            pending.append(metric)
    if pending:
        out.append(generate_latest(_Families(pending)))
    return b"".join(out)
