"""The return-to-service calls of the command-line client: slurmgpu's maintenance
reservation (``scontrol create|delete reservation``), the validation job (``sbatch``),
``scancel``, and the idle-time validation job (``sbatch --qos/--partition``). Names: ``slurmgpu.slurm.owned``. ``ReturnToServiceCalls`` is a part of
``CliSlurmClient``; it runs through the client's ``run`` (retries, deadline)."""

from __future__ import annotations

import getpass
import re
import subprocess
from collections.abc import Sequence

from slurmgpu.slurm import JobInfo, Reservation, SlurmError, SlurmUnreachable, common
from slurmgpu.slurm.common import SlurmCommandError, _check_job, _check_node, _first_line
from slurmgpu.slurm.owned import (
    ENDED_JOB_STATES,
    idle_job_name,
    reservation_name,
    validation_job_name,
    wrap_text,
)


def parse_reservation_text(line: str) -> Reservation:
    """One line of ``scontrol -o show reservation``."""
    first: dict[str, str] = {}
    for k, v in common.text_pairs(line):
        first.setdefault(k, v)
    flags = frozenset(f.strip().upper() for f in first.get("Flags", "").split(",") if f.strip())
    users = tuple(u for u in first.get("Users", "").split(",") if u and u != "(null)")
    return Reservation(name=first.get("ReservationName", ""), nodes=common.expand_hostlist(first.get("Nodes")),
                       flags=flags, users=users, state=first.get("State", ""))


def parse_reservations_text(text: str) -> list[Reservation]:
    return [parse_reservation_text(ln) for ln in text.splitlines() if ln.startswith("ReservationName=")]


_RESERVATION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,63}$")


def _check_reservation(name: str) -> str:
    if not isinstance(name, str) or not _RESERVATION.match(name):
        raise SlurmError(f"invalid reservation name: {name!r}")
    return name


def _check_users(users: Sequence[str]) -> str:
    if isinstance(users, str) or not users or not all(_USER.match(str(u)) for u in users):
        raise SlurmError(f"invalid reservation users: {users!r}")
    return ",".join(users)


def _check_command(command: Sequence[str]) -> Sequence[str]:
    if isinstance(command, str) or not command or not all(isinstance(word, str) and word for word in command):
        raise SlurmError(f"invalid validation command: {command!r}")
    return command


def _check_minutes(minutes: int) -> int:
    if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes < 1:
        raise SlurmError(f"invalid duration: {minutes!r} (whole minutes, at least 1)")
    return minutes


#: Slurm's answers (lower case) to reservation and sbatch requests, and what they mean.
_ANSWERS = (
    ("invalid node name specified", "no such node"),
    ("requested reservation is invalid", "no such reservation"),
    ("invalid user id", "a user in users= is unknown, or this user lacks Slurm operator rights "
                        "(root, SlurmUser, or AdminLevel=Operator in the accounting database)"),
    ("access/permission denied", "this user lacks Slurm operator rights"),
    ("requested nodes are busy", "the node runs jobs"),
)


def _explained(what: str, exc: SlurmCommandError) -> SlurmCommandError:
    """One line: what failed, what Slurm's answer means, and its own words."""
    answer = _first_line(exc.output) or str(exc)
    meaning = next((m for needle, m in _ANSWERS if needle in exc.output.lower()), None)
    text = f"{what}: {meaning} ({answer})" if meaning else f"{what}: {answer}"
    return SlurmCommandError(text, output=exc.output, returncode=exc.returncode)


class ReturnToServiceCalls:
    """Needs the client's ``run``, ``all_jobs``, ``may_retry``, ``retry_delay_s``, ``_sleep``."""

    retry_delay_s: float

    def run(self, tool: str, *args: str, tries: int | None = None) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def all_jobs(self) -> list[JobInfo]:
        raise NotImplementedError

    def may_retry(self, attempt: int) -> bool:
        raise NotImplementedError

    def _sleep(self, seconds: float) -> object:
        raise NotImplementedError

    def reservations(self) -> list[Reservation]:
        return parse_reservations_text(self.run("scontrol", "-o", "show", "reservation").stdout)

    def _reservation(self, name: str) -> Reservation | None:
        return next((r for r in self.reservations() if r.name == name), None)

    def create_reservation(self, node: str, *, duration_min: int, users: Sequence[str]) -> Reservation:
        node, user_list, minutes = _check_node(node), _check_users(users), _check_minutes(duration_min)
        name = reservation_name(node)
        found = self._reservation(name)
        if found is None:
            self._create_reservation(name, node, minutes, user_list)
            found = self._reservation(name)
        if found is None:
            raise SlurmError(f"reservation {name} was created but slurmctld does not list it")
        return found

    def _create_reservation(self, name: str, node: str, minutes: int, users: str) -> None:
        try:
            self.run("scontrol", "create", "reservation", f"reservationname={name}", f"nodes={node}",
                     f"users={users}", "starttime=now", f"duration={minutes}", "flags=MAINT,IGNORE_JOBS")
        except SlurmCommandError as exc:
            if "duplicate reservation name" not in exc.output.lower():  # (else: made meanwhile)
                raise _explained(f"cannot create reservation {name}", exc) from exc

    def delete_reservation(self, name: str) -> bool:
        name = _check_reservation(name)
        try:
            self.run("scontrol", "delete", f"reservationname={name}")
        except SlurmCommandError as exc:
            if "requested reservation is invalid" in exc.output.lower():
                return False
            raise _explained(f"cannot delete reservation {name}", exc) from exc
        return True

    def submit_validation(self, node: str, command: Sequence[str], *, reservation: str,
                          time_limit_min: int, output: str = "/dev/null") -> str:
        """Tried once per try, each after a look for the job a timed-out try may have
        submitted: a retry never submits a second validation."""
        node = _check_node(node)
        args = ["--parsable", f"--reservation={_check_reservation(reservation)}", f"--nodelist={node}",
                "--exclusive", f"--job-name={validation_job_name(node)}",
                f"--time={_check_minutes(time_limit_min)}", f"--output={output}", "--chdir=/tmp",
                "--wrap", wrap_text(_check_command(command))]
        return self._submit_once(validation_job_name(node), args)

    def submit_idle_validation(self, node: str, command: Sequence[str], *, qos: str = "", partition: str = "",
                               time_limit_min: int, start_within_min: int) -> str:
        """Like ``submit_validation``, in a preemptible QOS and/or partition instead of a
        reservation, never requeued (a preempted run is simply ended), and removed by
        Slurm (``--deadline``) when it cannot start within ``start_within_min``."""
        node = _check_node(node)
        if not qos and not partition:
            raise SlurmError("an idle validation needs a preemptible QOS or partition")
        where = [f"--qos={_check_reservation(qos)}"] if qos else []
        where += [f"--partition={_check_reservation(partition)}"] if partition else []
        limit = _check_minutes(time_limit_min)
        deadline = f"now+{limit + _check_minutes(start_within_min)}minutes"
        args = ["--parsable", *where, f"--nodelist={node}", "--exclusive", "--no-requeue",
                f"--job-name={idle_job_name(node)}", f"--time={limit}", f"--deadline={deadline}",
                "--output=/dev/null", "--chdir=/tmp", "--wrap", wrap_text(_check_command(command))]
        return self._submit_once(idle_job_name(node), args)

    def _submit_once(self, name: str, args: Sequence[str]) -> str:
        """sbatch unless this user has an active job of that name (its id then)."""
        attempt = 0
        while True:
            attempt += 1
            existing = self._active_job_named(name)
            if existing is not None:
                return existing.job_id
            try:
                return self._sbatch(args)
            except SlurmUnreachable:
                if not self.may_retry(attempt):
                    raise
                self._sleep(self.retry_delay_s)

    def _sbatch(self, args: Sequence[str]) -> str:
        try:
            cp = self.run("sbatch", *args, tries=1)
        except SlurmCommandError as exc:
            raise _explained("sbatch of the validation failed", exc) from exc
        return _check_job(cp.stdout.strip().split(";")[0])

    def _active_job_named(self, name: str) -> JobInfo | None:
        """This user's job of that name that has not ended; one COMPLETING has (a validation
        just cancelled is COMPLETING while its node cleans up: it is not one to wait for)."""
        me = getpass.getuser()
        return next((j for j in self.all_jobs() if j.name == name and j.user == me
                     and j.state not in ENDED_JOB_STATES and j.state != "COMPLETING"), None)

    def cancel_job(self, job_id: str) -> None:
        jid = _check_job(job_id)
        try:
            self.run("scancel", jid)
        except SlurmCommandError as exc:
            low = exc.output.lower()
            if "invalid job id" not in low and "already completing or completed" not in low:
                raise
