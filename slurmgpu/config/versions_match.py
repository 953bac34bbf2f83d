"""Matching installed versions against the pins in ``[pins]``.

A spec is one of:

* an exact version, ``"550.90.07"`` (compared numerically part by part, so
  ``"12.4"`` equals ``"12.4.0"`` and ``"550.90.7"`` equals ``"550.90.07"``);
* a glob, ``"96.00.*"`` (``fnmatch``, case-sensitive, on the whole string);
* a comparison, ``">=2.21"``, ``">12"``, ``"<=13.0"``, ``"<13"``, ``"==12.4"``;
* several comparisons joined by commas, all of which must hold: ``">=12.4,<13"``.

A pin list accepts a version when any of its specs matches it; an empty list
means "not pinned" and accepts everything (see ``match_any``).

Versions compare part by part: the string is split on ``.``, ``-``, ``+``,
``_``, ``~`` and ``:`` and between runs of digits and letters; digit runs compare as
numbers, letter runs as text, and text sorts before numbers (so ``"2.21rc1"`` <
``"2.21"`` < ``"2.21.1"``). Missing trailing parts count as 0.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

__all__ = ["compare_versions", "match_any", "spec_error", "version_matches"]

_OPERATORS = (">=", "<=", "==", ">", "<")  # two-character ones first
_GLOB_CHARS = frozenset("*?[")
_VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~:-]*")
_GLOB_RE = re.compile(r"[A-Za-z0-9*?\[][A-Za-z0-9._+~:*?\[\]!-]*")
_TOKEN_RE = re.compile(r"\d+|[A-Za-z]+")

_Key = list[tuple[int, int | str]]


def _key(version: str) -> _Key:
    return [(1, int(t)) if t.isdigit() else (0, t.lower()) for t in _TOKEN_RE.findall(version)]


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as version ``a`` is older than, equal to or newer than ``b``."""
    ka, kb = _key(a), _key(b)
    pad = (1, 0)
    for i in range(max(len(ka), len(kb))):
        x = ka[i] if i < len(ka) else pad
        y = kb[i] if i < len(kb) else pad
        if x != y:
            return -1 if x < y else 1
    return 0


def _split_operator(term: str) -> tuple[str | None, str]:
    for op in _OPERATORS:
        if term.startswith(op):
            return op, term[len(op):].strip()
    return None, term


def spec_error(spec: str) -> str | None:
    """Why ``spec`` is not a valid version spec, or None when it is."""
    s = spec.strip()
    if not s:
        return "empty version spec"
    if "," in s:
        terms = [t.strip() for t in s.split(",")]
        for term in terms:
            op, _ = _split_operator(term)
            if op is None:
                return (f"invalid version spec {spec!r}: comma-separated specs must all be "
                        "comparisons (e.g. '>=12.4,<13')")
            err = spec_error(term)
            if err:
                return err
        return None
    op, version = _split_operator(s)
    if op is not None:
        if not version:
            return f"invalid version spec {spec!r}: no version after {op!r}"
        if _GLOB_CHARS & set(version):
            return f"invalid version spec {spec!r}: a comparison cannot use a glob"
        if not _VERSION_RE.fullmatch(version) or not any(c.isdigit() for c in version):
            return f"invalid version spec {spec!r}: {version!r} is not a version"
        return None
    if s[0] in "=!~<>":
        return (f"invalid version spec {spec!r}: use an exact version, a glob, or one of "
                ">=, >, <=, <, == followed by a version")
    pattern = _GLOB_RE if _GLOB_CHARS & set(s) else _VERSION_RE
    if not pattern.fullmatch(s):
        return f"invalid version spec {spec!r}"
    return None


def version_matches(actual: str, spec: str) -> bool:
    """Whether the installed version ``actual`` satisfies ``spec``.

    An invalid spec matches nothing (the loader rejects invalid specs first).
    """
    actual = actual.strip()
    s = spec.strip()
    if not s or not actual:
        return False
    if "," in s:
        terms = [t.strip() for t in s.split(",")]
        return all(_split_operator(t)[0] is not None and version_matches(actual, t)
                   for t in terms)
    op, version = _split_operator(s)
    if op is None:
        if _GLOB_CHARS & set(s):
            return fnmatch.fnmatchcase(actual, s)
        return actual == s or compare_versions(actual, s) == 0
    if not version:
        return False
    c = compare_versions(actual, version)
    if op == ">=":
        return c >= 0
    if op == ">":
        return c > 0
    if op == "<=":
        return c <= 0
    if op == "<":
        return c < 0
    return c == 0  # "=="


def match_any(actual: str, specs: Iterable[str]) -> bool:
    """Whether ``actual`` satisfies any of ``specs``; an empty list (not pinned) accepts
    every version."""
    specs = list(specs)
    if not specs:
        return True
    return any(version_matches(actual, s) for s in specs)
