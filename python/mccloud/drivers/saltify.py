"""The saltify driver's runner body: a bare-metal target becomes a minion
of the controller over ssh, with the same bootstrap and pre-seeded key as a
VM."""

from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any, Mapping

from mccloud.orchestration import minions
from mccloud.orchestration.runner import Env, Outcome

#: Where the bootstrap script lands on the target.
SCRIPT = "/usr/local/sbin/mccloud-bootstrap-salt"


def ssh_command(t: Mapping[str, Any], known_hosts: Path) -> tuple[list[str], dict[str, str]]:
    """The ssh command line for target ``t`` (key, or password through
    sshpass's environment: never on a command line) and its environment.
    Host keys are learnt on first contact into mccloud's own known hosts
    file (``<controller key>.known_hosts``, never root's ``known_hosts``)
    and checked after."""
    env = dict(os.environ)
    cmd = ["ssh", "-p", str(t.get("ssh_port") or 22), "-o", "ConnectTimeout=15",
           "-o", "StrictHostKeyChecking=accept-new", "-o", f"UserKnownHostsFile={known_hosts}",
           "-o", "LogLevel=ERROR"]
    if t.get("password") and not t.get("ssh_keyfile"):
        env["SSHPASS"] = str(t["password"])
        cmd = ["sshpass", "-e", *cmd, "-o", "PubkeyAuthentication=no"]
    else:
        cmd += ["-i", str(t["ssh_keyfile"]), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"]
    return [*cmd, f"{t['ssh_username']}@{t['ssh_host']}"], env


def payload(minion: Mapping[str, Any], with_wheelhouse: Path | None) -> bytes:
    """A tar of what the target needs before its minion first starts (the
    files the VM bootstrap SLS writes), and the wheelhouse when the target
    has no Salt yet."""
    conf = minion["conf_dir"].lstrip("/")
    files: list[tuple[str, str, int]] = [
        (f"{conf}/minion.d/mccloud.conf", minion["config"], 0o644),
        (f"{conf}/pki/minion/minion.pem", minion["pem"], 0o400),
        (f"{conf}/pki/minion/minion.pub", minion["pub"], 0o644),
        (f"{conf}/pki/minion/minion_master.pub", minion["master_pub"], 0o644),
        (SCRIPT.lstrip("/"), minion["script"], 0o755),
    ]
    if minion["mode"] == "mastersalt":
        files.append(("etc/salt/minion.d/mccloud-local.conf",
                      "# Managed by mccloud: this host's own Salt runs masterless.\nfile_client: local\n", 0o644))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in (f"{conf}/pki", f"{conf}/pki/minion"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o700
            tar.addfile(info)
        for name, text, mode in files:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        if with_wheelhouse is not None:
            tar.add(str(with_wheelhouse), arcname=minion["wheelhouse"].lstrip("/"))
    return buf.getvalue()


def saltify(env: Env, name: str) -> Outcome:
    """Makes bare-metal target ``name`` a minion over ssh: checks the ssh
    access, pre-seeds its key on the master of its mode, sends the minion's
    configuration, keys, the bootstrap script (and the wheelhouse when the
    target has no Salt), runs the script, then waits until the target
    answers ``test.ping``."""
    t = dict(env.config.saltify_target(name))
    cloud = env.config.cloud_settings()
    t["master"] = t.get("master") or cloud["master"]
    t["master_port"] = t.get("master_port") or cloud["master_port"]
    out = Outcome()
    if t.get("password") and not t.get("ssh_keyfile") and not shutil.which("sshpass"):
        return out.fail(f"saltify target {name} uses a password: install sshpass on the controller "
                        "or give an ssh_keyfile")
    if t.get("ssh_keyfile") and not os.path.exists(str(t["ssh_keyfile"])):
        return out.fail(f"ssh key {t['ssh_keyfile']} of saltify target {name} does not exist on the controller")
    key = Path(str(env.config.controller_settings()["ssh_key"]))
    known_hosts = key.with_name(key.name + ".known_hosts")
    ssh, ssh_env = ssh_command(t, known_hosts)
    where = f"{t['ssh_username']}@{t['ssh_host']}:{t.get('ssh_port') or 22}"
    env.progress(f"{name}: checking ssh access ({where})")
    probe = subprocess.run([*ssh, f"test -x {minions.SALT_PREFIX}/bin/salt-minion && echo has-salt || echo no-salt"],
                           capture_output=True, text=True, timeout=60, env=ssh_env)
    if probe.returncode != 0:
        how = "password" if "SSHPASS" in ssh_env and ssh[0] == "sshpass" else f"key {t.get('ssh_keyfile')}"
        reason = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
        if "Host key verification failed" in reason:
            reason += (f" (its host key is not the one in {known_hosts}: if {t['ssh_host']} was reinstalled, "
                       f"remove its line with ssh-keygen -R {t['ssh_host']} -f {known_hosts})")
        return out.fail(f"saltify {name}: ssh to {where} with {how} failed: {reason}")
    has_salt = "has-salt" in probe.stdout
    out.add("ssh", {"result": True, "comment": f"{where} reachable; Salt {'present' if has_salt else 'absent'}"})
    wheels = None
    if not has_salt:
        wheels = minions.wheelhouse_dir(env.opts)
        problem = minions.wheelhouse_state(wheels)
        if problem:
            return out.fail(f"saltify {name}: the target has no Salt and {problem}: "
                            "run mc_cloud_controller.wheelhouse")
    minion = minions.seed(env.opts, name, t)
    out.add("key", {"result": True, "comment": f"key of {name} generated and accepted on the {minion['mode']} master",
                    "changes": {"accepted": minion["mode"]}})
    args = " ".join(shlex.quote(a) for a in str(minion["script_args"]).split())
    sudo = "" if t["ssh_username"] == "root" else "sudo -n "
    remote = f"{sudo}tar -C / -xf - && {sudo}/bin/sh {SCRIPT} {args}"
    env.progress(f"{name}: bootstrapping over ssh ({'configuring' if has_salt else 'installing Salt from the wheelhouse'})")
    p = subprocess.run([*ssh, remote], input=payload(minion, wheels), capture_output=True, timeout=3600, env=ssh_env)
    if p.returncode != 0:
        tail = p.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {p.returncode}"]
        out.add("bootstrap", {"result": False,
                              "comment": f"bootstrap of {name} failed (exit {p.returncode}): {tail[0]}"})
        return out
    out.add("bootstrap", {"result": True, "comment": f"{name} bootstrapped ({minion['mode']} mode)"})
    why = minions.wait_answering(env.opts, name, minion["mode"], env.progress)
    out.add("minion", {"result": why is None, "comment": why or f"{name} answers test.ping"})
    if out.result:
        out.comment = f"{name} is a minion of the {minion['mode']} master and answers test.ping"
    return out
