"""Slurm's command line: running `sbatch`, `scontrol`, `sacct`, `squeue` and `scancel`, and reading
their answers.

Kept apart from the backend (orchestrator/backends/slurm.py) so the backend reads as launch, poll,
stop and fence, and so the parsing of each Slurm version's output (text, and the JSON of 23.02+)
is tested on its own. Every call goes through `run`, which tests replace with a fake cluster.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

SLURM_TIMEOUT_S = 30.0
# Slurm states, grouped by what they mean for the attempt.
PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"}
RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"}
TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "REVOKED",
    "SPECIAL_EXIT",
}
# What sbatch answers when no set of nodes could ever hold the job (e.g. too many excluded).
UNPLACEABLE = "Requested node configuration is not available"


class SlurmError(RuntimeError):
    """A Slurm command failed; the message carries its stderr."""


def run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    try:
        r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed (infra/local/slurm/up.sh installs Slurm)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv)} did not answer in {SLURM_TIMEOUT_S:.0f} s") from None
    if r.returncode != 0:
        raise SlurmError(f"{' '.join(argv)} exited {r.returncode}: {(r.stderr or r.stdout).strip()[:500]}")
    return r.stdout


def node_address(node: str) -> str:
    """The address Slurm itself uses for `node` (its NodeAddr, as the agents derive it:
    agent.slurm.node_address); the name when Slurm does not say (a resolvable name serves too)."""
    try:
        out = run(["scontrol", "show", "node", "-o", node])
    except SlurmError:
        return node
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1] or node
    return node


def slurm_job_state(job_id: int) -> dict[str, Any] | None:
    """{"state", "reason", "exit_code", "nodes"} of a job, or None if Slurm knows nothing of it.

    `scontrol show job` while slurmctld remembers the job (MinJobAge after it ends), then `sacct`
    (accounting, or the jobcomp file with -c). Not `squeue --json`: in Slurm 22.05 it ignores
    `--jobs` and dumps every job in the cluster, too much for a poll every second. Raises
    SlurmError when slurmctld does not answer, so the poll fails and is retried instead of
    declaring a running job lost.
    """
    try:
        out = run(["scontrol", "show", "job", "-o", str(job_id)])
    except SlurmError as exc:
        if "Invalid job id" not in str(exc):
            raise
        return _from_sacct(job_id)
    line = out.strip().splitlines()[0] if out.strip() else ""
    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
    return {
        "state": state_word(fields.get("JobState")),
        "reason": fields.get("Reason"),
        "exit_code": exit_code(fields.get("ExitCode")),
        "nodes": fields.get("NodeList", ""),
    }


def state_word(value: Any) -> str:
    if isinstance(value, list):  # JSON output of Slurm >= 23.02: a list of flags, the base state first
        value = value[0] if value else ""
    return str(value or "").split()[0].upper() if value else ""


def exit_code(value: Any) -> int | None:
    if isinstance(value, dict):  # JSON output of Slurm >= 23.02: {"status", "return_code": {"number"}}
        rc = value.get("return_code")
        return int(rc.get("number", 0)) if isinstance(rc, dict) else int(rc or 0)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return int(value.split(":")[0])  # "2:0" = exit code 2, signal 0
    return int(value)


def _from_sacct(job_id: int) -> dict[str, Any] | None:
    """Finished jobs slurmctld has forgotten: the accounting database, or the jobcomp file (-c)."""
    for extra in ([], ["-c"]):
        try:
            out = run(["sacct", *extra, "-n", "-P", "-X", "-j", str(job_id), "-o", "JobID,State,ExitCode,NodeList"])
        except SlurmError:
            continue
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) >= 4 and parts[0] == str(job_id):
                return {
                    "state": state_word(parts[1]),
                    "reason": None,
                    "exit_code": exit_code(parts[2]),
                    "nodes": parts[3],
                }
    return None


def job_steps(job_id: int) -> list[str]:
    """The job's running steps, `<job>.<n>` (none known: an empty list)."""
    try:
        out = run(["squeue", "-h", "--steps", f"--job={job_id}", "-o", "%i"])
    except SlurmError:
        return []
    return [s for s in out.split() if re.fullmatch(rf"{job_id}\.\d+", s)]


def hostlist(names: list[str]) -> str:
    """`names` for an #SBATCH value: joined with commas, or where that is too long for one
    (a spare allocation excludes every node a large job used), Slurm's own compressed form
    (`scontrol show hostlist`: node[1-64]); the joined names when scontrol does not answer."""
    joined = ",".join(names)
    if len(joined) <= 256:
        return joined
    try:
        return run(["scontrol", "show", "hostlist", joined]).strip() or joined
    except SlurmError:
        return joined


def find_job_by_name(name: str) -> int | None:
    try:
        out = run(["squeue", "-h", "--states=all", f"--name={name}", "-o", "%i"])
    except SlurmError:
        return None
    ids = [int(x) for x in out.split() if x.strip().isdigit()]
    return max(ids) if ids else None
