"""Read the top-level settings of a slurm.conf (for ``slurmgpu doctor``).

Only what slurmgpu needs to verify is modelled: ``Key=Value`` settings, last one wins,
key names case-insensitive (``prologflags`` is ``PrologFlags``), comments, trailing-
backslash continuations and ``Include`` lines (absolute, or relative to the including
file's directory; ``%c`` is the cluster name in lower case, as in Slurm's parser). Node and
node-set definitions are skipped: their keys (``CPUs=``, ``State=``...) describe one
node, not the cluster; partition definitions are kept apart (``SlurmConf.partitions``,
``PartitionName=DEFAULT`` lines giving the later ones their defaults).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from slurmgpu.slurm import SlurmError

ENV_VAR = "SLURM_CONF"
# Where slurm.conf lives when $SLURM_CONF does not say: upstream's default, then Debian's
# pre-23.02 packages, then a configless node's copy.
# Configless Slurm (SlurmctldParameters=enable_configless): a node has no slurm.conf of its
# own; slurmd fetches the controller's and keeps it here, where the client commands read it.
CONFIGLESS_DIR = "/run/slurm/conf"
DEFAULT_PATHS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", f"{CONFIGLESS_DIR}/slurm.conf")
# Lines whose first key starts a definition of one object; the rest of the line belongs
# to that object.
_OBJECT_KEYS = frozenset({"nodename", "partitionname", "nodeset", "downnodes", "frontendname"})
_PAIR = re.compile(r'([A-Za-z][A-Za-z0-9_]*)=("[^"]*"|\S*)')
_INCLUDE = re.compile(r"include\s+(.+)", re.IGNORECASE)
# An include chain this deep is a loop (a file including itself), not a layout.
MAX_INCLUDE_DEPTH = 16


class SlurmConfError(SlurmError):
    """slurm.conf (or a file it includes) cannot be read."""


@dataclass(frozen=True)
class Setting:
    key: str  # as written
    value: str  # quotes removed
    file: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def items(self) -> list[str]:
        """The value as a comma-separated list (``PrologFlags=Alloc,Contain``)."""
        return [item.strip() for item in self.value.split(",") if item.strip()]


@dataclass(frozen=True)
class Partition:
    name: str
    options: dict[str, str]  # lower-case key -> value (PriorityTier, PreemptMode, ...)
    file: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class SlurmConf:
    path: str
    settings: dict[str, Setting] = field(default_factory=dict)  # lower-case key -> last setting
    files: list[str] = field(default_factory=list)  # path first, then every included file
    partitions: dict[str, Partition] = field(default_factory=dict)  # name as written -> partition
    partition_defaults: dict[str, str] = field(default_factory=dict)  # PartitionName=DEFAULT

    def get(self, key: str) -> Setting | None:
        return self.settings.get(key.lower())

    def add_partition(self, pairs: list[tuple[str, str]], file: str, line: int) -> None:
        options = {key.lower(): value.strip('"') for key, value in pairs[1:]}
        name = pairs[0][1].strip('"')
        if name.upper() == "DEFAULT":
            self.partition_defaults.update(options)
            return
        self.partitions[name] = Partition(name, {**self.partition_defaults, **options}, file, line)


def find_slurm_conf(explicit: str | None = None,
                    environ: Mapping[str, str] = os.environ) -> tuple[str | None, list[str]]:
    """(the slurm.conf to read or None, the places looked at): ``explicit``, then
    ``$SLURM_CONF``, then ``DEFAULT_PATHS``. An explicit or $SLURM_CONF path is returned
    even when missing: the caller reports it, rather than silently reading another."""
    if explicit:
        return explicit, [explicit]
    if environ.get(ENV_VAR):
        return environ[ENV_VAR], [f"${ENV_VAR}={environ[ENV_VAR]}"]
    for path in DEFAULT_PATHS:
        if os.path.isfile(path):
            return path, list(DEFAULT_PATHS)
    return None, list(DEFAULT_PATHS)


def parse_slurm_conf(path: str) -> SlurmConf:
    """Read ``path`` and the files it includes; SlurmConfError when one cannot be read."""
    conf = SlurmConf(path=path)
    _read(conf, path, depth=0)
    return conf


def _read(conf: SlurmConf, path: str, depth: int) -> None:
    if depth > MAX_INCLUDE_DEPTH:
        raise SlurmConfError(f"{path}: includes nested more than {MAX_INCLUDE_DEPTH} deep "
                             "(does a file include itself?)")
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError as exc:
        raise SlurmConfError(f"{path}: {exc.strerror or exc}") from None
    conf.files.append(path)
    for lineno, line in _logical_lines(text):
        include = _INCLUDE.fullmatch(line)
        if include:
            _read(conf, _expand_include(conf, path, lineno, include.group(1).strip()), depth + 1)
            continue
        pairs = _PAIR.findall(line)
        if pairs and pairs[0][0].lower() == "partitionname":
            conf.add_partition(pairs, path, lineno)
        if not pairs or pairs[0][0].lower() in _OBJECT_KEYS:
            continue
        for key, value in pairs:
            conf.settings[key.lower()] = Setting(key, value.strip('"'), path, lineno)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each logical line: comments dropped, continuations
    joined, blank lines skipped."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw).rstrip()
        if not pending:
            start = lineno
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            out.append((start, line))
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def _strip_comment(line: str) -> str:
    """Text before an unescaped '#' (slurm.conf allows ``\\#`` for a literal one)."""
    match = re.search(r"(?<!\\)#", line)
    text = line if match is None else line[:match.start()]
    return text.replace("\\#", "#")


def _expand_include(conf: SlurmConf, path: str, lineno: int, target: str) -> str:
    cluster = conf.get("ClusterName")
    if cluster is not None:
        target = target.replace("%c", cluster.value.lower())
    target = target.split()[0].strip('"')  # Slurm reads the first word
    if not os.path.isabs(target):
        target = os.path.join(os.path.dirname(path), target)
    if not os.path.exists(target):
        raise SlurmConfError(f"{path}:{lineno}: Include {target}: no such file")
    return target
