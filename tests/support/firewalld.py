"""A firewalld of the test's own, in a :mod:`tests.support.netns` topology's
``node`` namespace, on a D-Bus system bus of its own.

- The bus: ``dbus-daemon`` with a configuration file of its own (a unix
  socket in a temporary directory; every name may be owned and every
  message sent, the test runs as root). ``DBUS_SYSTEM_BUS_ADDRESS`` points
  firewalld and ``firewall-cmd`` at it; the host's bus is never used.
- Polkit: firewalld asks ``org.freedesktop.PolicyKit1`` to authorise each
  call when that name is on the bus, and otherwise lets root (uid 0) do
  everything (``firewall/server/decorators.py``, ``dbus_polkit_require_auth``).
  The bus lists no service directory, so nothing activates polkitd and
  root's ``firewall-cmd`` is authorised without it.
- firewalld: ``firewalld --nofork --nopid`` with ``--system-config`` (the
  ``/etc/firewalld`` it reads and writes: an empty directory with a
  ``firewalld.conf`` of its own) and ``--default-config`` (Debian's
  ``/usr/lib/firewalld``, read only), logging to a file of its own. The
  host's ``/etc/firewalld`` is never read or written.

:func:`firewalld_in` starts both and stops both when left;
:meth:`Firewalld.restart` stops firewalld and starts it again on the same
configuration (as ``systemctl restart firewalld`` would).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.support.netns import Topology

DEFAULT_CONFIG = Path("/usr/lib/firewalld")

_BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"""

# Debian's firewalld.conf, without its comments.
_FIREWALLD_CONF = """DefaultZone=public
CleanupOnExit=yes
CleanupModulesOnExit=no
Lockdown=no
IPv6_rpfilter=yes
IndividualCalls=no
LogDenied=off
FirewallBackend=nftables
FlushAllOnReload=yes
RFC3964_IPv4=yes
"""


def available() -> str | None:
    """Why firewalld cannot run here (None when it can)."""
    for tool in ("firewalld", "firewall-cmd", "dbus-daemon", "nft"):
        if not shutil.which(tool):
            return f"{tool} is not installed (./run setup installs firewalld)"
    if not DEFAULT_CONFIG.is_dir():
        return f"{DEFAULT_CONFIG} is missing (firewalld's package installs it)"
    return None


class Firewalld:
    """firewalld and its bus in namespace ``ns``; ``config`` is its
    ``/etc/firewalld`` (zones/, policies/, services/ …)."""

    def __init__(self, ns: str, workdir: Path) -> None:
        self.ns = ns
        self.workdir = workdir
        self.config = workdir / "etc"
        self.log = workdir / "firewalld.log"
        self.socket = workdir / "bus.sock"
        self.env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={self.socket}"}
        self.bus: subprocess.Popen[bytes] | None = None
        self.daemon: subprocess.Popen[bytes] | None = None

    def _exec(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    def start_bus(self) -> None:
        """Starts the bus; returns once it accepts connections."""
        conf = self.workdir / "bus.conf"
        conf.write_text(_BUS_CONFIG.format(socket=self.socket))
        self.bus = subprocess.Popen(
            ["dbus-daemon", f"--config-file={conf}", "--nofork", "--nopidfile", "--nosyslog"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._until(lambda: self.socket.exists(), 10, "the D-Bus socket")

    def start(self) -> None:
        """Starts firewalld; returns once ``firewall-cmd --state`` says
        running."""
        for sub in ("zones", "policies", "services", "icmptypes", "ipsets", "helpers"):
            (self.config / sub).mkdir(parents=True, exist_ok=True)
        if not (self.config / "firewalld.conf").exists():
            (self.config / "firewalld.conf").write_text(_FIREWALLD_CONF)
        argv = ["firewalld", "--nofork", "--nopid", "--system-config", str(self.config),
                "--default-config", str(DEFAULT_CONFIG), "--log-target", "file", "--log-file", str(self.log)]
        with open(self.log, "ab") as log:
            self.daemon = subprocess.Popen(self._exec(argv), env=self.env, stdout=log, stderr=log)
        self._until(self.running, 60, "firewalld")

    def running(self) -> bool:
        """Whether ``firewall-cmd --state`` says running."""
        if self.daemon is not None and self.daemon.poll() is not None:
            raise AssertionError(f"firewalld exited {self.daemon.returncode}; its log:\n{self.log_text()}")
        return self.cmd("--state", check=False).stdout.strip() == "running"

    def cmd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs ``firewall-cmd`` with ``args`` against this firewalld; with
        ``check``, a failure raises with its output and firewalld's log."""
        proc = subprocess.run(self._exec(["firewall-cmd", *args]), env=self.env, capture_output=True, text=True,
                              timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"firewall-cmd {' '.join(args)} exited {proc.returncode}: {proc.stdout}{proc.stderr}\n"
                f"firewalld's log:\n{self.log_text()}"
            )
        return proc

    def reload(self) -> None:
        """``firewall-cmd --reload``: the permanent configuration replaces
        the runtime one."""
        self.cmd("--reload")

    def restart(self) -> None:
        """Stops firewalld and starts it again."""
        self.stop_daemon()
        self.start()

    def stop_daemon(self) -> None:
        """Stops firewalld (SIGTERM: it cleans its rules up, like systemd's
        stop)."""
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(30)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait(10)
        self.daemon = None

    def stop(self) -> None:
        """Stops firewalld and the bus."""
        self.stop_daemon()
        if self.bus is not None and self.bus.poll() is None:
            self.bus.terminate()
            self.bus.wait(10)
        self.bus = None

    def log_text(self) -> str:
        """firewalld's log (its last 4,000 characters)."""
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else "(no log)"

    def _until(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        end = time.monotonic() + deadline
        while not ready():
            if time.monotonic() > end:
                raise AssertionError(f"{what} not ready within {deadline:.0f} s; firewalld's log:\n{self.log_text()}")
            time.sleep(0.1)


@contextlib.contextmanager
def firewalld_in(topology: Topology) -> Iterator[Firewalld]:
    """A firewalld in ``topology.node``, running when entered, stopped (and
    its temporary directory removed) when left."""
    with tempfile.TemporaryDirectory(prefix="mcfw-firewalld-") as tmp:
        fw = Firewalld(topology.node, Path(tmp))
        try:
            fw.start_bus()
            fw.start()
            yield fw
        finally:
            fw.stop()


@pytest.fixture(scope="module")
def firewalld(netns_topology: Topology) -> Iterator[Firewalld]:
    """A firewalld in the module's topology's ``node`` (module scoped, like
    the topology it lives in); skipped when firewalld is not installed."""
    why = available()
    if why:
        if os.environ.get("MCCLOUD_TEST_FIREWALLD") == "required":  # ./run test sets it
            pytest.fail(why)
        pytest.skip(why)
    with firewalld_in(netns_topology) as fw:
        yield fw
