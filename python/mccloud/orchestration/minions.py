"""VMs and bare-metal targets as minions of the controller: which master a
mode answers to, pre-seeded keys (Salt's own ``key.gen_accept``, as
salt-cloud seeds minions: the master never needs ``auto_accept``), the
minion configuration the bootstrap finds in place, waiting for a new
minion, calls on it, forgetting its key, and the Salt wheelhouse the
controller prepares for targets.

Master options (in the controller's master configuration):

``mccloud_masters``
    ``{mode: master configuration file}``. Default: this master's own file
    for the mode it serves (``mastersalt`` under mastersalt-run, else
    ``salt``), ``/etc/salt/master`` and ``/etc/mastersalt/master`` for the
    other.
``mccloud_wheelhouse``
    Directory of the wheelhouse (default ``/var/cache/mccloud/wheelhouse``).
``mccloud_wheelhouse_target``
    ``{python_version: "3.11", platforms: [...]}`` when targets run another
    Python or platform than the controller (default: the controller's own).
``mccloud_minion_timeout``
    Seconds a new minion has to answer ``test.ping`` (default 120).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import mccloud
from mccloud import saltcompat, saltsupport

MODES = ("salt", "mastersalt")
#: Where the bootstrap installs Salt on a target (a virtualenv).
SALT_PREFIX = "/opt/mccloud/salt"
#: Where a target finds the wheelhouse.
GUEST_WHEELHOUSE = "/var/cache/mccloud/wheelhouse"
DEFAULT_WHEELHOUSE = "/var/cache/mccloud/wheelhouse"
DEFAULT_TIMEOUT = 120


bootstrap_script = saltsupport.bootstrap_script


def conf_dir(mode: str) -> str:
    """The minion's configuration directory on the target."""
    return "/etc/mastersalt" if mode == "mastersalt" else "/etc/salt"


def check_mode(mode: Any) -> str:
    """``mode`` when it is a target's mode (``salt`` or ``mastersalt``); an error otherwise."""
    if mode not in MODES:
        raise mccloud.InvalidInputError(f"mode {mode!r}: a target's mode is salt or mastersalt")
    return str(mode)


def master_conf(opts: Mapping[str, Any], mode: str) -> str:
    """The configuration file of the master that minions of ``mode`` answer to."""
    mode = check_mode(mode)
    own = "mastersalt" if saltsupport.is_mastersalt(opts) else "salt"
    configured = (opts.get("mccloud_masters") or {}).get(mode)
    if configured:
        return str(configured)
    if mode == own:
        return str(opts["conf_file"])
    return "/etc/mastersalt/master" if mode == "mastersalt" else "/etc/salt/master"


def master_opts(opts: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """The options of the master of ``mode`` (this master's own when it is)."""
    path = master_conf(opts, mode)
    if path == opts.get("conf_file"):
        return dict(opts)
    if not os.path.exists(path):
        raise mccloud.NotFoundError(f"the {mode} master's configuration {path} does not exist on the controller: "
                                    f"set the master option mccloud_masters: {{{mode}: <its master file>}}")
    return saltcompat.master_config(path)


def seed(opts: Mapping[str, Any], minion: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """Generates ``minion``'s key pair and accepts its public key on the
    master of its mode (replacing an older one); returns what the target
    needs before its minion first starts: the configuration directory, the
    minion configuration, the key pair and the master's public key."""
    mode = check_mode(settings.get("mode") or "salt")
    mopts = master_opts(opts, mode)
    if not ours(mopts, minion):
        raise mccloud.InvalidInputError(
            f"the {mode} master holds a key for {minion} that mccloud did not make: it belongs to another "
            f"minion, which a VM or target of that name would take over. Rename the VM or target; if the key is "
            f"a leftover of this one, delete it first (salt-key -c {os.path.dirname(master_conf(opts, mode))} "
            f"-d {minion})")
    keys = wheel(mopts, "key.gen_accept")(minion, force=True)
    if not isinstance(keys, dict) or "priv" not in keys:
        raise mccloud.MccloudError(f"the {mode} master could not generate and accept a key for {minion}: {keys!r}")
    _remember(mopts, minion)
    master_pub = Path(mopts["pki_dir"]) / "master.pub"
    try:
        master_key = master_pub.read_text()
    except OSError as exc:
        raise mccloud.NotFoundError(f"the {mode} master's public key {master_pub} is unreadable ({exc}): "
                                    "start that master once so it makes its key pair") from exc
    return {
        "mode": mode,
        "mastersalt": mode == "mastersalt",
        "conf_dir": conf_dir(mode),
        "config": minion_config(minion, mode, settings),
        "pem": keys["priv"],
        "pub": keys["pub"],
        "master_pub": master_key,
        "script": script_text(settings),
        "script_args": str(settings.get("script_args") or ""),
        "prefix": SALT_PREFIX,
        "wheelhouse": GUEST_WHEELHOUSE,
    }


def minion_config(minion: str, mode: str, settings: Mapping[str, Any]) -> str:
    """``minion.d/mccloud.conf`` for the target (YAML; the values are the
    registry's validated settings, serialised, never pasted)."""
    import yaml

    conf: dict[str, Any] = {
        "id": minion,
        "master": str(settings["master"]),
        "master_port": int(settings["master_port"]),
    }
    if mode == "mastersalt":
        conf.update({
            "pki_dir": "/etc/mastersalt/pki/minion",
            "cachedir": "/var/cache/mastersalt/minion",
            "sock_dir": "/var/run/mastersalt/minion",
            "pidfile": "/var/run/mastersalt-minion.pid",
            "log_file": "/var/log/mastersalt/minion",
        })
    return "# Managed by mccloud\n" + yaml.safe_dump(conf, default_flow_style=False)


def script_text(settings: Mapping[str, Any]) -> str:
    """The bootstrap script named by the ``script`` setting (a file on the
    controller), which the target receives as a file."""
    path = str(settings.get("script") or bootstrap_script())
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise mccloud.NotFoundError(f"bootstrap script {path} is missing on the controller "
                                    f"(setting script; mccloud's own is {bootstrap_script()}): {exc}") from exc


#: Salt's loaders are not safe to use from parallel threads (orchestrate
#: provisions VMs in threads): key operations go one at a time.
_KEYS = threading.Lock()


def wheel(mopts: Mapping[str, Any], fun: str) -> Callable[..., Any]:
    """Salt's wheel function ``fun`` over a master's options, called in
    process (the key functions work on the master's pki directory). Going
    through the wheel loader matters inside a runner: Salt's key library
    called directly there resolves ``__opts__`` to the runner's own master,
    not to the master of another mode."""
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _KEYS:
            # A loader per call: its dunders belong to the context (the
            # thread) that built it, and orchestrate calls from several.
            return saltcompat.wheel(mopts, fun)(*args, **kwargs)

    return locked


_KEY_DIRS = ("minions", "minions_pre", "minions_rejected", "minions_denied")


def _key_name(minion: str) -> str:
    if not minion or "/" in minion or minion in (".", ".."):
        raise mccloud.ArgumentError(f"minion id {minion!r} cannot name a key")
    return minion


def _record(mopts: Mapping[str, Any], minion: str) -> Path:
    """Where a master's options say mccloud keeps the public key it made
    for ``minion`` (under the master's cache directory)."""
    digest = hashlib.sha256(minion.encode()).hexdigest()
    return Path(str(mopts.get("cachedir") or "/var/cache/salt/master")) / "mccloud" / "keys" / digest


def _held(mopts: Mapping[str, Any], minion: str) -> str | None:
    """The public key the master holds for ``minion`` (any state), if any."""
    for sub in _KEY_DIRS:
        path = Path(str(mopts["pki_dir"])) / sub / _key_name(minion)
        if path.is_file():
            return path.read_text()
    return None


def ours(mopts: Mapping[str, Any], minion: str) -> bool:
    """Whether the master holds no key for ``minion``, or the one mccloud
    made: a key mccloud did not make belongs to another minion."""
    held = _held(mopts, minion)
    if held is None:
        return True
    try:
        return _record(mopts, minion).read_text() == held
    except OSError:
        return False


def _remember(mopts: Mapping[str, Any], minion: str) -> None:
    held = _held(mopts, minion)
    if held is None:
        return
    path = _record(mopts, minion)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(held)


def forget(opts: Mapping[str, Any], minion: str) -> list[str]:
    """Deletes the key mccloud made for ``minion`` from every master of a
    mode that holds it, like ``salt-cloud -d``; returns the modes it was
    removed from. A key mccloud did not make is another minion's: kept."""
    gone = []
    for mode in MODES:
        try:
            mopts = master_opts(opts, mode)
        except mccloud.NotFoundError:
            continue
        if _held(mopts, minion) is None or not ours(mopts, minion):
            continue
        wheel(mopts, "key.delete")(minion)
        _record(mopts, minion).unlink(missing_ok=True)
        gone.append(mode)
    return gone


def key_findings(opts: Mapping[str, Any], expected: set[str]) -> list[dict[str, Any]]:
    """Drift between the keys mccloud made on the masters and the minions
    that should exist (``expected``: the declared VMs and saltify
    targets): ``orphan_minion_key``, a key mccloud made for a minion no
    longer declared (still accepted); ``missing_minion_key``, a declared
    minion mccloud made a key for whose key the master no longer holds
    (deleted by hand). Keys mccloud did not make are never reported."""
    found = []
    for mode in MODES:
        try:
            mopts = master_opts(opts, mode)
        except mccloud.NotFoundError:
            continue
        where = f"accepted on the {mode} master"
        if not (Path(str(mopts["pki_dir"])) / "minions").is_dir():
            continue  # a master never started holds no key
        for minion in sorted(wheel(mopts, "key.list")("accepted").get("minions", [])):
            if minion not in expected and _record(mopts, minion).is_file() and ours(mopts, minion):
                found.append({"kind": "orphan_minion_key", "node": mode, "vm": minion, "what": "minion key",
                              "expected": None, "found": where})
        for minion in sorted(expected):
            if _record(mopts, minion).is_file() and _held(mopts, minion) is None:
                found.append({"kind": "missing_minion_key", "node": mode, "vm": minion, "what": "minion key",
                              "expected": where, "found": None})
    return found


def keys_made(opts: Mapping[str, Any]) -> int:
    """How many keys mccloud made are accepted on the masters (what the
    share of keys a repair may delete is counted against)."""
    n = 0
    for mode in MODES:
        try:
            mopts = master_opts(opts, mode)
        except mccloud.NotFoundError:
            continue
        if not (Path(str(mopts["pki_dir"])) / "minions").is_dir():
            continue
        n += sum(1 for m in wheel(mopts, "key.list")("accepted").get("minions", [])
                 if _record(mopts, m).is_file() and ours(mopts, m))
    return n


def accepted(opts: Mapping[str, Any], minion: str, mode: str) -> bool:
    """Whether the master of ``mode`` accepted ``minion``'s key."""
    return minion in wheel(master_opts(opts, mode), "key.list")("accepted").get("minions", [])


def call(opts: Mapping[str, Any], minion: str, mode: str, fun: str, timeout: float = 300,
         **client: Any) -> tuple[bool, Any]:
    """Calls ``fun`` on ``minion`` through the master of ``mode``; returns
    (answered, return value). ``client``: LocalClient options of the call
    (``gather_job_timeout``)."""
    from mccloud.orchestration import transport

    with transport.local_client(master_conf(opts, mode)) as client_:
        value = transport.one_return(client_, minion, fun, timeout, **client)
    if value is None:
        return False, None
    return True, value.get("ret")


def wait_answering(opts: Mapping[str, Any], minion: str, mode: str, progress: Callable[[str], None],
                   timeout: int | None = None, events: StartEvents | None = None) -> str | None:
    """Waits until ``minion`` answers ``test.ping``; returns None, or why
    not. A ping published before the minion connected is lost (and costs
    its timeout): pings wait for the minion's start event on the master's
    event bus (sent once it connected), which ``events``, a listener opened
    before the minion could start, may have received already."""
    client_error = saltcompat.exceptions().SaltClientError
    wait = int(timeout or opts.get("mccloud_minion_timeout") or DEFAULT_TIMEOUT)
    if not accepted(opts, minion, mode):
        return f"{minion} has no accepted key on the {mode} master ({master_conf(opts, mode)})"
    if events is None:
        with start_events(opts, mode) as own:
            return wait_answering(opts, minion, mode, progress, timeout, own)
    deadline = time.monotonic() + wait
    progress(f"waiting for minion {minion} to answer the {mode} master (up to {wait} s)")
    # A minion that has just started connects within seconds: its start
    # event comes first. One that ran already (provisioned again) sends
    # none: after FIRST_WAIT a ping asks it.
    seen = events.wait(minion, min(wait, FIRST_WAIT))
    while True:
        # Not seen starting: it may run already (a quick ping tells), or come up.
        secs = PING_TIMEOUT if seen else QUICK_PING
        try:
            answered, value = call(opts, minion, mode, "test.ping", timeout=secs, gather_job_timeout=secs)
        except client_error:  # the master did not take the publication in time: a busy master
            answered, value = False, None
        if answered and value is True:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            return (f"minion {minion} did not answer test.ping on the {mode} master within {wait} s: "
                    f"is its service running, and can it reach the master at the address and port of its "
                    f"settings (master, master_port)?")
        if seen:  # connected, not answering yet: ping again soon
            time.sleep(min(left, 0.2))
        else:
            seen = events.wait(minion, min(left, START_WAIT))


#: Seconds a ping of a minion that started waits for its answer.
PING_TIMEOUT = 2
#: Seconds a ping of a minion not seen starting waits (it may run already).
QUICK_PING = 1
#: Longest wait for a minion's start event before pinging again.
START_WAIT = 5
#: Wait for the start event before the first ping.
FIRST_WAIT = 3


class StartEvents:
    """The start events of minions on a master's event bus (see
    :func:`start_events`)."""

    def __init__(self, bus: Any) -> None:
        self.bus = bus
        self.started: set[str] = set()

    def wait(self, minion: str, secs: float) -> bool:
        """Whether ``minion`` sent its start event since the listener
        opened, waiting up to ``secs`` for it (at most a second's sleep
        when the bus cannot be read)."""
        if minion in self.started:
            return True
        if self.bus is None:
            time.sleep(min(secs, 1))
            return False
        end = time.monotonic() + secs
        while True:
            left = end - time.monotonic()
            # (Salt's get_event waits forever for wait=0: no_block reads what came)
            try:
                event = (self.bus.get_event(no_block=True, tag="salt/minion/", full=True) if left <= 0
                         else self.bus.get_event(wait=left, tag="salt/minion/", full=True))
            except Exception:  # noqa: BLE001 - the bus went away: pings alone decide
                self.bus = None
                return False
            if event is not None:
                parts = str(event.get("tag", "")).split("/")
                if len(parts) == 4 and parts[3] == "start":
                    self.started.add(parts[2])
                if minion in self.started:
                    return True
                continue
            if left <= 0 or time.monotonic() >= end:
                return False
            time.sleep(0.05)  # the bus gave up early (reconnecting)


@contextlib.contextmanager
def start_events(opts: Mapping[str, Any], mode: str) -> Iterator[StartEvents]:
    """A listener of minion start events on the master of ``mode``, opened
    now (polling still works when its bus cannot be read)."""
    try:
        bus = saltcompat.master_event_bus(master_opts(opts, mode))
        bus.subscribe("salt/minion/")
        if not bus.connect_pub(timeout=5):
            if bus.subscriber is not None:  # Salt's destroy leaves a failed connection open
                bus.subscriber.close()
                bus.subscriber = None
            bus.destroy()
            bus = None
    except Exception:  # noqa: BLE001 - polling still works without the bus
        bus = None
    events = StartEvents(bus)
    try:
        yield events
    finally:
        if events.bus is not None:
            events.bus.destroy()


# -- the wheelhouse ------------------------------------------------------------


def wheelhouse_dir(opts: Mapping[str, Any]) -> Path:
    """Where the controller keeps the Salt wheelhouse (master option ``mccloud_wheelhouse``)."""
    return Path(str(opts.get("mccloud_wheelhouse") or DEFAULT_WHEELHOUSE))


def salt_version() -> str:
    """The controller's Salt version: the one the wheelhouse and targets get."""
    return saltcompat.version()


def wheelhouse_state(path: Path) -> str | None:
    """None when the wheelhouse at ``path`` is complete and matches its
    checksums and the controller's Salt version; else what is wrong."""
    try:
        version = (path / "SALT_VERSION").read_text().strip()
        sums = (path / "SHA256SUMS").read_text().splitlines()
    except OSError:
        return f"no wheelhouse at {path}"
    if version != salt_version():
        return f"the wheelhouse at {path} holds Salt {version}, the controller runs {salt_version()}"
    for line in sums:
        digest, _, name = line.partition("  ")
        try:
            if hashlib.sha256((path / name).read_bytes()).hexdigest() != digest:
                return f"{path / name} does not match SHA256SUMS"
        except OSError:
            return f"{path / name} is missing"
    return None


def build_wheelhouse(opts: Mapping[str, Any], progress: Callable[[str], None], force: bool = False) -> dict[str, Any]:
    """Builds the wheelhouse (Salt at the controller's version and its
    dependencies, as wheels) with pip, once: an intact one of the right
    version is kept. Built aside and renamed into place, so a failed build
    leaves the previous one whole. One build at a time: a second one
    waits for the first, then finds its result."""
    dest = wheelhouse_dir(opts)
    if wheelhouse_state(dest) is None and not force:
        return {"result": True, "comment": f"wheelhouse {dest} is up to date (Salt {salt_version()})", "changes": {}}
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(dest):
        problem = wheelhouse_state(dest)
        if problem is None and not force:
            return {"result": True, "comment": f"wheelhouse {dest} is up to date (Salt {salt_version()})",
                    "changes": {}}
        return _build(opts, dest, problem, progress)


@contextlib.contextmanager
def _build_lock(dest: Path) -> Iterator[None]:
    """An exclusive lock beside the wheelhouse, across processes."""
    import fcntl

    fd = os.open(dest.with_name(f".{dest.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _build(opts: Mapping[str, Any], dest: Path, problem: str | None,
           progress: Callable[[str], None]) -> dict[str, Any]:
    version = salt_version()
    work = Path(tempfile.mkdtemp(prefix=".wheelhouse-", dir=dest.parent))
    started = time.monotonic()
    try:
        progress(f"building the Salt {version} wheelhouse with pip ({problem or 'rebuild asked'})")
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
        built = work / "build"
        run(pip + ["wheel", "--quiet", "--wheel-dir", str(built), f"salt=={version}"])
        target = opts.get("mccloud_wheelhouse_target") or {}
        out = work / "wheels"
        if target:
            # Wheels for another Python or platform: binary ones downloaded
            # for it, pure-Python ones (built above) found locally.
            args = ["download", "--quiet", "--only-binary=:all:", "--find-links", str(built), "--dest", str(out),
                    "--implementation", "cp", "--python-version", str(target["python_version"])]
            for platform in target.get("platforms") or []:
                args += ["--platform", str(platform)]
            run(pip + args + [f"salt=={version}"])
        else:
            built.rename(out)
        names = sorted(p.name for p in out.iterdir() if p.suffix == ".whl")
        (out / "SHA256SUMS").write_text("".join(
            f"{hashlib.sha256((out / n).read_bytes()).hexdigest()}  {n}\n" for n in names))
        (out / "SALT_VERSION").write_text(version + "\n")
        old = dest.with_name(dest.name + ".old")
        if dest.exists():
            shutil.rmtree(old, ignore_errors=True)
            dest.rename(old)
        out.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = sum(p.stat().st_size for p in dest.iterdir())
    took = time.monotonic() - started
    return {"result": True, "comment": f"wheelhouse {dest}: Salt {version}, {len(names)} wheels, "
            f"{size / 1e6:.1f} MB, built in {took:.0f} s",
            "changes": {"wheelhouse": str(dest), "wheels": len(names), "bytes": size, "seconds": round(took, 1)}}


def run(cmd: list[str]) -> None:
    """Runs ``cmd`` (no shell); an error with the last lines of its output when it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-5:])
        raise mccloud.MccloudError(f"{' '.join(cmd[2:5])} … failed (exit {p.returncode}): {tail}")
