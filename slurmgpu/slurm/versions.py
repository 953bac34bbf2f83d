"""What differs between the Slurm releases slurmgpu supports, in one place.

Every version-dependent choice (which command has ``--json``, which slurm.conf and
cgroup.conf keys a release wants) is a function of ``(major, minor)`` here; the CLI client
and the simulated cluster ask, they never compare versions themselves. CI runs the Slurm
integration suite on every release in ``TESTED`` (docs/admin-guide.md).
"""

from __future__ import annotations

import re

SlurmVersion = tuple[int, int]

#: The releases CI runs the mini-cluster suite on: Debian 12's and the newest.
TESTED: tuple[SlurmVersion, ...] = ((22, 5), (25, 11))
#: ``scontrol show node|job --json`` (data_parser plugins) appeared in 23.02.
SCONTROL_JSON_SINCE: SlurmVersion = (23, 2)
#: ``sinfo --json`` / ``squeue --json`` (openapi plugins, filters ignored) from 20.11.
LEGACY_JSON_SINCE: SlurmVersion = (20, 11)
#: ``CgroupPlugin=disabled`` exists (and a cgroup fs is optional) from 23.11.
CGROUP_DISABLED_SINCE: SlurmVersion = (23, 11)
#: TLS for Slurm's own traffic (``TLSType``) from 25.05.
TLS_SINCE: SlurmVersion = (25, 5)


#: What ``scontrol update state=resume`` (and libslurm) answer for a node that is not
#: drained or down, lower case: 22.05 says "specified", 25.11 "transition".
NOT_RESUMABLE_ANSWERS = ("invalid node state specified", "invalid node state transition")


def already_resumed(answer: str) -> bool:
    """Whether a refused resume only means that the node was not drained or down."""
    low = answer.lower()
    return any(text in low for text in NOT_RESUMABLE_ANSWERS)


#: Node flags under which a node's reason says why it is out of service.
_REASON_FLAGS = frozenset({"DRAIN", "FAIL", "NOT_RESPONDING", "REBOOT_REQUESTED", "REBOOT_ISSUED"})


def reason_applies(state: str, flags: frozenset[str]) -> bool:
    """Whether a node's reason is current. 22.05 clears the reason on resume; 25.11 keeps
    it until a job runs on the node, so a resumed idle node still shows the old drain's
    reason there: it counts only on a drained, failing, down or unreachable node."""
    return bool(flags & _REASON_FLAGS) or state not in ("idle", "mixed", "allocated")


def parse_version(text: str) -> SlurmVersion | None:
    """``slurm-wlm 22.05.8`` / ``slurm 24.11.5`` / ``SLURM_VERSION = 25.11.7`` -> (22, 5) /
    (24, 11) / (25, 11); None when no version is in the text."""
    m = re.search(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def version_text(version: SlurmVersion | None) -> str:
    """(25, 11) -> "25.11"; (22, 5) -> "22.05"; None -> "unknown"."""
    return "unknown" if version is None else f"{version[0]}.{version[1]:02d}"


def scontrol_json(version: SlurmVersion | None) -> bool:
    """Whether ``scontrol show node|job`` and a filtering ``squeue`` speak ``--json``."""
    return version is not None and version >= SCONTROL_JSON_SINCE


def legacy_json(version: SlurmVersion | None) -> bool:
    """Whether only ``sinfo --json`` / ``squeue --json`` (unfiltered) speak JSON."""
    return version is not None and LEGACY_JSON_SINCE <= version < SCONTROL_JSON_SINCE


def cgroup_conf_lines(version: SlurmVersion, cgroup_dir: str) -> list[str]:
    """cgroup.conf for a cluster that confines nothing (proctrack/linuxproc, task/none)."""
    if version >= CGROUP_DISABLED_SINCE:
        # No cgroup plugin at all, and no cgroup fs needed.
        return ["CgroupPlugin=disabled"]
    # 22.05 always initialises a cgroup plugin and has no `disabled`: cgroup/v1 pointed at
    # an empty private directory initialises on any host layout, and nothing creates one.
    return ["CgroupPlugin=cgroup/v1", f"CgroupMountpoint={cgroup_dir}"]


def slurm_conf_lines(version: SlurmVersion) -> list[str]:
    """The slurm.conf keys only some releases take (all else is common to 22.05..25.11)."""
    if version >= TLS_SINCE:
        return ["TLSType=tls/none"]  # plain munge-authenticated RPCs, as before 25.05
    return []
