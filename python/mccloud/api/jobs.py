"""The long verbs' jobs: each is a directory under the master's cachedir
(``mccloud/api-jobs/<id>/``) holding what was asked (``job.json``), the
worker's pid and start time (``pid``), its progress lines
(``messages.jsonl``), and once done its exit code (``rc``) and result
(``result.json``). The worker (:mod:`mccloud.api.worker`) runs the real
``salt-run`` of the master's configuration, detached from the runner that
started it; :func:`read` tells running, succeeded, failed or lost (the
worker is gone without an exit code: killed, or the machine rebooted).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

#: A job id: UTC time of its start (to the millisecond: ids sort as the jobs
#: started) and 6 random hex digits.
JOB_ID = re.compile(r"^\d{8}T\d{9}-[0-9a-f]{6}$")
STATES = ("running", "succeeded", "failed", "lost")


def root(opts: Mapping[str, Any]) -> Path:
    """The jobs' directory under the master's cachedir."""
    return Path(str(opts.get("cachedir") or "/var/cache/salt/master")) / "mccloud" / "api-jobs"


def now() -> str:
    """The current UTC time as the jobs write it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_json(path: Path, data: Any) -> None:
    """Writes ``path`` atomically (a reader never sees half of it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of ``/proc/<pid>/stat``,
    in clock ticks since boot), or None when there is no such process or it
    is a zombie (it has exited; its parent has not reaped it yet): a pid
    reused by another process has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat[stat.rfind(")") + 2:].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else None


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` (a worker starts its own session:
    its group is its pid) still has a live member, such as the ``salt-run``
    of a worker that was killed alone."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[0] not in ("Z", "X") and fields[2] == str(pgid):
            return True
    return False


def quote_arg(arg: str) -> str:
    """One ``salt-run`` argument, its value JSON-quoted: Salt YAML-parses
    every argument (``0x10`` would become 16, ``yes`` True, ``null`` None:
    a job acting on another VM); a JSON string parses back to itself. A
    ``key=value`` keyword keeps its key bare."""
    key, eq, value = arg.partition("=")
    if eq and key.isidentifier():
        return f"{key}={json.dumps(value)}"
    return json.dumps(arg)


def salt_run_command(opts: Mapping[str, Any], fun: str, args: Sequence[str]) -> list[str]:
    """The ``salt-run`` of the master's configuration, as an argument list
    (never through a shell): this interpreter's Salt, JSON output, every
    argument value JSON-quoted (:func:`quote_arg`)."""
    config_dir = str(opts.get("config_dir") or os.path.dirname(str(opts.get("conf_file") or "")) or "/etc/salt")
    return [sys.executable, "-c", "import sys, salt.scripts; sys.exit(salt.scripts.salt_run())",
            "-c", config_dir, "--out=json", "--no-color", fun, *(quote_arg(str(a)) for a in args)]


def start(opts: Mapping[str, Any], kind: str, target: str, node: str, owners: Sequence[str], user: str,
          runs: Sequence[Sequence[str]]) -> str:
    """Starts a job running the runner calls ``runs`` (``[fun, arg, ...]``
    each, in order, stopping at the first failure) in a detached worker;
    returns its id."""
    base = root(opts)
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    while True:
        now_ns = time.time_ns()
        job_id = (time.strftime("%Y%m%dT%H%M%S", time.gmtime(now_ns // 10**9)) + f"{now_ns // 10**6 % 1000:03d}-"
                  + secrets.token_hex(3))
        jobdir = base / job_id
        try:
            jobdir.mkdir(mode=0o700)
            break
        except FileExistsError:
            continue
    spec = {"id": job_id, "kind": kind, "target": target, "node": node, "owners": list(owners), "user": user,
            "started": now(), "runs": [salt_run_command(opts, r[0], list(r[1:])) for r in runs],
            "calls": [" ".join(r) for r in runs]}
    write_json(jobdir / "job.json", spec)
    with open(os.devnull, "rb") as devnull, open(jobdir / "worker.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mccloud.api.worker", str(jobdir)], stdin=devnull,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    (jobdir / "pid").write_text(f"{proc.pid} {process_start(proc.pid) or ''}\n")
    return job_id


def messages(jobdir: Path) -> list[dict[str, str]]:
    """The job's progress lines (``{"at", "text"}``)."""
    out = []
    try:
        lines = (jobdir / "messages.jsonl").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            m = json.loads(line)
        except ValueError:  # a line being written
            continue
        if isinstance(m, dict):
            out.append({"at": str(m.get("at", "")), "text": str(m.get("text", ""))})
    return out


def state(jobdir: Path) -> tuple[str, str | None]:
    """The job's state and when it finished."""
    rc_file = jobdir / "rc"
    if rc_file.exists():
        try:
            rc = int(rc_file.read_text().split()[0])
        except (ValueError, IndexError):
            rc = 1
        finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rc_file.stat().st_mtime))
        return ("succeeded" if rc == 0 else "failed"), finished
    try:
        pid_text, *start_text = (jobdir / "pid").read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        # Just started: the runner writes the pid right after the worker starts.
        return "running", None
    alive = process_start(pid)
    if alive is not None and (not start_text or alive == start_text[0]):
        return "running", None
    if (jobdir / "rc").exists():  # finished between the two reads
        return state(jobdir)
    if group_alive(pid):  # the worker is gone, its salt-run still works
        return "running", None
    return "lost", None


def spec(opts: Mapping[str, Any], job_id: str) -> tuple[Path, dict[str, Any]] | None:
    """The job directory and what was asked, or None when there is no such job."""
    if not JOB_ID.match(job_id):
        return None
    jobdir = root(opts) / job_id
    try:
        return jobdir, json.loads((jobdir / "job.json").read_text())
    except (OSError, ValueError):
        return None


def read(opts: Mapping[str, Any], job_id: str) -> dict[str, Any] | None:
    """The job as the API shows it, or None when there is no such job."""
    found = spec(opts, job_id)
    if found is None:
        return None
    jobdir, asked = found
    current, finished = state(jobdir)
    result = None
    if current in ("succeeded", "failed"):
        try:
            result = json.loads((jobdir / "result.json").read_text())
        except (OSError, ValueError):
            result = None
    return {"id": asked["id"], "kind": asked["kind"], "target": asked["target"], "node": asked.get("node"),
            "owners": asked.get("owners") or [], "user": asked["user"], "calls": asked.get("calls") or [],
            "state": current, "started": asked["started"], "finished": finished, "messages": messages(jobdir),
            "result": result}


def ids(opts: Mapping[str, Any]) -> list[str]:
    """Every job id, newest first."""
    try:
        names = os.listdir(root(opts))
    except OSError:
        return []
    return sorted((n for n in names if JOB_ID.match(n)), reverse=True)
