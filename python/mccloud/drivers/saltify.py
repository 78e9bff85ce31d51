"""The saltify driver's runner body: bootstrap Salt on a bare-metal target."""

from __future__ import annotations

import os
import shlex
import subprocess

from mccloud.orchestration.runner import Env, Outcome


def saltify(env: Env, name: str) -> Outcome:
    """Runs the bootstrap script on a bare-metal target over ssh."""
    t = env.config.saltify_target(name)
    out = Outcome()
    script = t["script"]
    if not os.path.exists(script):
        return out.fail(f"bootstrap script {script} is missing on the controller (makina-states.cloud.script)")
    if t.get("password") and not t.get("ssh_keyfile"):
        return out.fail(f"saltify target {name} uses a password: install sshpass or give an ssh_keyfile")
    cmd = [
        "ssh", "-i", t["ssh_keyfile"], "-p", str(t.get("ssh_port", 22)), "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=15", "-o", "StrictHostKeyChecking=accept-new",
        f"{t['ssh_username']}@{t['ssh_host']}", "bash -s -- " + t["script_args"],
    ]
    env.progress(f"{name}: bootstrapping over ssh ({t['ssh_username']}@{t['ssh_host']})")
    with open(script, "rb") as f:
        p = subprocess.run(cmd, stdin=f, capture_output=True, timeout=3600)
    tail = p.stderr.decode(errors="replace").strip().splitlines()[-3:]
    out.add("bootstrap", {
        "result": p.returncode == 0,
        "comment": f"{name} bootstrapped" if p.returncode == 0
        else f"bootstrap of {name} failed (exit {p.returncode}): {' '.join(map(shlex.quote, tail))}",
    })
    return out
