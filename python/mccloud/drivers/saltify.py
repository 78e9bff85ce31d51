"""The saltify driver (:class:`SaltifyDriver`, behind the
``mc_cloud_saltify`` runner): a bare-metal target becomes a minion of the
controller over ssh, with the same bootstrap and pre-seeded key as a VM."""

from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from mccloud.orchestration import minions
from mccloud.drivers.contract import Driver, NoHooks, Step
from mccloud.orchestration.runner import Env, Outcome, run

#: Where the bootstrap script lands on the target.
SCRIPT = "/usr/local/sbin/mccloud-bootstrap-salt"


def ssh_command(t: Mapping[str, Any], known_hosts: Path, pinned: bool = False) -> tuple[list[str], dict[str, str]]:
    """The ssh command line for target ``t`` (key, or password through
    sshpass's environment: never on a command line) and its environment.
    A target with ``ssh_host_key`` is checked against that key alone
    (``pinned``: ``known_hosts`` holds only it); otherwise its host key is
    learnt on first contact into mccloud's own known hosts file
    (``<controller key>.known_hosts``, never root's ``known_hosts``) and
    checked after."""
    env = dict(os.environ)
    cmd = ["ssh", "-p", str(t.get("ssh_port") or 22), "-o", "ConnectTimeout=15",
           "-o", f"StrictHostKeyChecking={'yes' if pinned else 'accept-new'}",
           "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
           "-o", "LogLevel=ERROR"]
    if t.get("password") and not t.get("ssh_keyfile"):
        env["SSHPASS"] = str(t["password"])
        cmd = ["sshpass", "-e", *cmd, "-o", "PubkeyAuthentication=no"]
    else:
        cmd += ["-i", str(t["ssh_keyfile"]), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"]
    return [*cmd, f"{t['ssh_username']}@{t['ssh_host']}"], env


def known_hosts_for(t: Mapping[str, Any], key: Path) -> tuple[Path, bool]:
    """The known hosts file for target ``t`` and whether its key is pinned:
    a target with ``ssh_host_key`` gets a file of its own holding only that
    key (``<controller key>.pinned/<name>``, rewritten at every run);
    others share ``<controller key>.known_hosts`` (trust on first use)."""
    pinned = str(t.get("ssh_host_key") or "").split()[:2]
    if not pinned:
        return key.with_name(key.name + ".known_hosts"), False
    d = key.with_name(key.name + ".pinned")
    d.mkdir(mode=0o700, exist_ok=True)
    port = int(t.get("ssh_port") or 22)
    host = str(t["ssh_host"]) if port == 22 else f"[{t['ssh_host']}]:{port}"
    path = d / str(t["name"])
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{host} {' '.join(pinned)}\n")
    tmp.replace(path)
    return path, True


def remote_command(t: Mapping[str, Any], script_args: str) -> tuple[str, bytes]:
    """The command the target runs (unpack the payload, run the bootstrap
    script) and what precedes the payload on its standard input: a login
    other than root goes through sudo, with ``-n`` (no password), or with
    ``-S`` and the target's ``sudo_password`` as the first line of the
    input (never on a command line)."""
    args = " ".join(shlex.quote(a) for a in script_args.split())
    run = f"tar -C / -xf - && exec /bin/sh {SCRIPT} {args}".rstrip()
    if t["ssh_username"] == "root":
        return f"/bin/sh -c {shlex.quote(run)}", b""
    if t.get("sudo_password"):
        return f"sudo -S -p '' /bin/sh -c {shlex.quote(run)}", str(t["sudo_password"]).encode() + b"\n"
    return f"sudo -n /bin/sh -c {shlex.quote(run)}", b""


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
    if t.get("ssh_gateway"):
        return out.fail(f"saltify {name}: saltify connects to its targets directly, not through the ssh gateway "
                        f"{t['ssh_gateway']}: remove pillar key makina-states.cloud.saltify.targets.{name}.ssh_gateway "
                        "(or makina-states.cloud.saltify.ssh_gateway)")
    key = Path(str(env.config.controller_settings()["ssh_key"]))
    known_hosts, pinned = known_hosts_for(t, key)
    ssh, ssh_env = ssh_command(t, known_hosts, pinned)
    where = f"{t['ssh_username']}@{t['ssh_host']}:{t.get('ssh_port') or 22}"
    env.progress(f"{name}: checking ssh access ({where})")
    probe = subprocess.run([*ssh, f"test -x {minions.SALT_PREFIX}/bin/salt-minion && echo has-salt || echo no-salt"],
                           capture_output=True, text=True, timeout=60, env=ssh_env)
    if probe.returncode != 0:
        how = "password" if "SSHPASS" in ssh_env and ssh[0] == "sshpass" else f"key {t.get('ssh_keyfile')}"
        reason = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
        if "Host key verification failed" in reason and pinned:
            reason += (f" (its host key is not the ssh_host_key of pillar key "
                       f"makina-states.cloud.saltify.targets.{name}: check the server, then the pillar)")
        elif "Host key verification failed" in reason:
            reason += (f" (its host key is not the one in {known_hosts}: if {t['ssh_host']} was reinstalled, "
                       f"remove its line with ssh-keygen -R {t['ssh_host']} -f {known_hosts})")
        return out.fail(f"saltify {name}: ssh to {where} with {how} failed: {reason}")
    has_salt = "has-salt" in probe.stdout
    trust = ("host key pinned (ssh_host_key)" if pinned else
             f"host key learnt on first contact into {known_hosts}: pin it with ssh_host_key")
    out.add("ssh", {"result": True, "comment": f"{where} reachable ({trust}); "
                                               f"Salt {'present' if has_salt else 'absent'}"})
    wheels = None
    if not has_salt:
        wheels = minions.wheelhouse_dir(env.opts)
        problem = minions.wheelhouse_state(wheels)
        if problem:
            return out.fail(f"saltify {name}: the target has no Salt and {problem}: "
                            "run mc_cloud_controller.wheelhouse")
    minion = minions.seed(env.opts, name, t)
    env.registry.record("key_seeded", name, name, "minion key", "", f"accepted on the {minion['mode']} master")
    out.add("key", {"result": True, "comment": f"key of {name} generated and accepted on the {minion['mode']} master",
                    "changes": {"accepted": minion["mode"]}})
    remote, preamble = remote_command(t, str(minion["script_args"]))
    env.progress(f"{name}: bootstrapping over ssh ({'configuring' if has_salt else 'installing Salt from the wheelhouse'})")
    p = subprocess.run([*ssh, remote], input=preamble + payload(minion, wheels), capture_output=True, timeout=3600, env=ssh_env)
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


class SaltifyDriver(NoHooks):
    """The saltify driver (see :class:`mccloud.drivers.contract.Driver`):
    its targets are no VMs, so it implements no hook; :meth:`saltify`
    makes a target a minion."""

    vt = "saltify"

    def __init__(self, env: Env) -> None:
        self.env = env

    def saltify(self, name: str) -> Step:
        """See :func:`saltify` (module function)."""
        return run("saltify", saltify, self.env, name)


if TYPE_CHECKING:  # mypy holds the class to the contract
    _CONTRACT: type[Driver] = SaltifyDriver
