"""The worker of one API job (``python -m mccloud.api.worker <jobdir>``):
runs the job's ``salt-run`` calls in order (argument lists, no shell),
appends their progress lines to ``messages.jsonl``, then writes
``result.json`` and ``rc`` (0 when every call succeeded). Started detached
by :func:`mccloud.api.jobs.start`; see there for the directory's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

from mccloud.api.jobs import now, process_start, write_json

#: Keys never copied into a job's result or messages (the core's
#: ``SECRET_KEYS``, src/pillar/checks.rs, and the API's own).
SECRET_KEYS = frozenset({"password", "ssh_gateway_password", "sudo_password", "password_hash", "bindpw", "secret",
                         "tsig_secret"})


def scrub(value: Any) -> Any:
    """``value`` without any mapping entry named like a secret."""
    if isinstance(value, dict):
        return {k: ("<hidden>" if str(k).lower() in SECRET_KEYS else scrub(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def documents(stream: Any) -> Iterator[Any]:
    """The JSON documents of ``salt-run --out=json`` output, as they come
    (progress events, then the return); a line that is not JSON comes as
    its text."""
    decoder, buf = json.JSONDecoder(), ""
    for line in stream:
        buf += line
        while buf.strip():
            text = buf.lstrip()
            if not text.startswith(("{", "[", '"')):
                first, _, buf = text.partition("\n")
                if first.strip():
                    yield first.strip()
                if not _:
                    buf = ""
                continue
            try:
                doc, end = decoder.raw_decode(text)
            except ValueError:
                buf = text
                break
            buf = text[end:]
            yield doc
    if buf.strip():
        yield buf.strip()


class Job:
    def __init__(self, jobdir: Path) -> None:
        self.dir = jobdir
        self.spec = json.loads((jobdir / "job.json").read_text())

    def say(self, text: str) -> None:
        with open(self.dir / "messages.jsonl", "a") as f:
            f.write(json.dumps({"at": now(), "text": text}) + "\n")

    def run_one(self, argv: list[str], call: str) -> tuple[int, Any]:
        """Runs one ``salt-run``; returns (its exit code, its return)."""
        self.say(f"salt-run {call}")
        last: Any = None
        with open(self.dir / "salt-run.log", "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True)
            assert proc.stdout is not None
            for doc in documents(proc.stdout):
                if isinstance(doc, str):
                    self.say(doc)
                elif isinstance(doc, dict) and set(doc) <= {"message"} and doc:
                    self.say(str(doc["message"]))
                else:
                    last = doc
            rc = proc.wait()
        if isinstance(last, dict) and len(last) == 1 and isinstance(next(iter(last.values())), dict) \
                and "result" in next(iter(last.values())):
            last = next(iter(last.values()))  # outputters that wrap the return in the function's name
        if rc == 0 and isinstance(last, dict) and last.get("result") is False:
            rc = 1
        return rc, scrub(last)

    def run(self) -> int:
        runs: list[dict[str, Any]] = []
        rc = 0
        for argv, call in zip(self.spec["runs"], self.spec.get("calls") or self.spec["runs"]):
            one_rc, ret = self.run_one(list(argv), str(call))
            runs.append({"call": call, "rc": one_rc, "return": ret})
            comment = ret.get("comment") if isinstance(ret, dict) else None
            self.say(f"{call}: {'succeeded' if one_rc == 0 else 'failed'}" + (f": {comment}" if comment else ""))
            if one_rc != 0:
                rc = one_rc
                break
        write_json(self.dir / "result.json", {"runs": runs})
        (self.dir / "rc").write_text(f"{rc}\n")
        return rc


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m mccloud.api.worker JOBDIR", file=sys.stderr)
        return 2
    job = Job(Path(argv[0]))
    pid_file = job.dir / "pid"
    if not pid_file.exists():  # the runner writes it right after starting this worker; in case it could not
        pid_file.write_text(f"{os.getpid()} {process_start(os.getpid()) or ''}\n")
    try:
        return job.run()
    except BaseException as exc:  # the job must end with an rc whatever happens
        job.say(f"the worker failed: {type(exc).__name__}: {exc}")
        (job.dir / "rc").write_text("1\n")
        raise


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
