"""The commands of the README and of the documentation, as written.

The quick start's ``./run demo`` runs for real; every other command of the
``sh`` blocks of the README and of every page under ``docs/`` then either
runs against the demo's configuration, in a shell that took the ``export``
lines met so far (the README's first, then the pages' in name order; exit
code and a key of its output checked), or — where it needs a real cloud
(masters, compute nodes, LXC, PostgreSQL, a Salt onedir) — is matched to
the test that runs it on one (the test must still call it). A documented
command that neither runs here nor names its test fails this test: a new
command needs one or the other.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DEMO = ROOT / ".demo" / "mastersalt"

pytestmark = pytest.mark.slow

#: Commands that run against the demo's configuration: (pattern, exit code,
#: text the output must hold).
RUN: list[tuple[str, int, str]] = [
    (r"export MASTERSALT_CONFIG_DIR=", 0, ""),
    (r"mastersalt-call mc_cloud_lxc\.get_settings_for_vm devhost10\.local mysupertest3\.foo\.com$", 0,
     "ssh_reverse_proxy_port"),
    (r"mastersalt-call mc_cloud_compute_node\.get_settings_for_target devhost10\.local$", 0, "mysupertest3.foo.com"),
    (r"mastersalt-call mc_cloud\.inventory$", 0, "ssh_port"),
    (r"mccloud inventory ", 0, "root@devhost10.local:"),
    (r"mccloud --help$", 0, "inventory"),
    (r"mccloud sls-root$", 0, "/mccloud/sls"),
    (r"mccloud store backup /root/", 0, "backed up"),
    (r"mccloud store check ", 0, "integrity: ok"),
    (r"mastersalt-run mc_cloud\.audit vm=web1\.example\.com$", 0, "no entry"),
    (r"mastersalt-run mc_cloud\.audit kind=freed node=devhost10\.local since=2026-11-01 --out json$", 0, "[]"),
    (r"mccloud audit --vm web1\.example\.com ", 0, "0 entries"),
    (r"mccloud audit --kind moved --since 2026-11-26T10:00Z --limit 20$", 0, "0 entries"),
    (r"mccloud audit prune --before 2026-01-01$", 0, "removed 0 entries"),
    (r"mastersalt-run mc_cloud\.audit_prune before=2026-01-01$", 0, "removed"),
    (r"mccloud store rekey$", 0, "rekeyed"),
    (r"mastersalt-run mc_cloud\.store_rekey$", 0, "new_key"),
    (r"mccloud api-config --port 8443 --eauth ldap$", 0, "rest_mccloud:"),
]

#: Commands a real cloud runs: (pattern, the test files, what they must call).
COVERED: list[tuple[str, str, str]] = [
    (r"\./run demo ", "tests/docs/test_readme.py", '["./run", "demo"]'),
    (r"\./run test ", ".ci/run", "exec ./run test"),
    # ./run test builds the documentation (checks calls docs_build) and
    # runs every step of ./run check; the performance page's tables are
    # checked to be the rendering of what ./run bench records.
    (r"\./run docs ", "run", "    docs_build\n"),
    (r"\./run check ", "run", "check) shift; quick"),
    (r"\./run bench ", "tests/unit/test_bench_results.py", "results.update_page(results.PAGE"),
    (r"pip install \. ", "tests/packaging/test_onedir.py", '"pip", "install"'),
    (r"salt-pip install mccloud-", "tests/packaging/test_onedir.py", "--target="),
    (r"mccloud store migrate --to postgresql://", "tests/functional/test_postgres_migrate.py", '"migrate", "--to"'),
    (r"mccloud store rekey --store postgresql://", "tests/functional/test_postgres_secrets.py",
     '"store", "rekey", "--store", info'),
    (r"mastersalt '\*' test\.ping ", "tests/integration/test_e2e.py", '"test.ping"'),
    (r"ssh -p \"\$\(mastersalt-call --out=txt mc_cloud_compute_node\.get_ssh_port ",
     "tests/integration/test_e2e.py", "ssh_banner("),
    # The DNS servers' own tools, as the tests' servers are set up and asked with them.
    (r"tsig-keygen -a hmac-sha256 ", "tests/support/dnsservers.py", '[program("tsig-keygen"), "-a", ALGORITHM'),
    (r"keymgr -t ", "tests/support/dnsservers.py", '[program("keymgr"), "-t"'),
    *((rf"pdnsutil {sub} ", "tests/support/dnsservers.py", f'"{sub}"') for sub in (
        "generate-tsig-key", "set-meta", "activate-tsig-key")),
    (r"dig @", "tests/support/dnsservers.py", '[program("dig"), f"@{self.host}"'),
    # mccloud dns and mc_cloud.dns, against the tests' servers.
    *((rf"mccloud dns {sub} ", "tests/functional/test_dns_commands.py", f'"dns", "{sub}"')
      for sub in ("plan", "show", "push")),
    (r"mastersalt-run mc_cloud\.dns ", "tests/functional/test_dns_commands.py", '"mc_cloud.dns"'),
    # The API over salt-api: the certificate, the requests and the listeners, as its tests make and check them.
    (r"openssl req -x509 ", "tests/support/api.py", '["openssl", "req", "-x509"'),
    (r"curl -sS --cacert \S+ https://\S+/login ", "tests/support/api.py", 'self.post("/login"'),
    (r"curl -sS --cacert \S+ https://\S+/ -H ", "tests/support/api.py", '"fun": f"mc_cloud_api.{verb}"'),
    (r"ss -ltnp ", "tests/integration/test_api_http.py", '["ss", "-Hltnp"]'),
    # The runners of the operating block, each called by name in its test.
    *((rf"mastersalt-run {re.escape(fun)} ", f"tests/integration/{where}", f'"{fun}"') for fun, where in (
        ("mc_cloud_controller.deploy", "test_e2e.py"), ("mc_cloud_compute_node.deploy", "test_e2e.py"),
        ("mc_cloud_vm.provision", "test_e2e.py"), ("mc_cloud_saltify.saltify", "test_e2e.py"),
        ("mc_cloud_vm.destroy", "test_e2e.py"), ("mc_cloud_vm.orchestrate", "test_e2e.py"),
        ("mc_cloud_controller.orchestrate", "test_runners.py"), ("mc_cloud.drift", "test_e2e.py"))),
    # The API's verbs, called by name as root and as eauth users.
    (r"mastersalt-run mc_cloud_api\.", "tests/integration/test_api_runner.py", 'f"mc_cloud_api.{verb}"'),
]


def pages() -> list[Path]:
    """The README, then every page of the documentation, in name order."""
    return [README, *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts)]


def commands(page: Path = README) -> list[tuple[int, str]]:
    """Every command of ``page``'s ``sh`` blocks (continuation lines
    joined, comment-only lines left out), with its line number. Blocks may
    be indented (inside a list item)."""
    out: list[tuple[int, str]] = []
    block: str | None = None
    pending, start = "", 0
    for no, line in enumerate(page.read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            block = None if block is not None else line.strip()[3:].strip()
            continue
        if block != "sh" or not line.strip() or line.lstrip().startswith("#"):
            continue
        if not pending:
            start = no
        if line.rstrip().endswith("\\"):
            pending += line.strip()[:-1].rstrip() + " "
            continue
        out.append((start, (pending + line.strip()).strip()))
        pending = ""
    return out


def documented() -> list[tuple[str, str]]:
    """``(where, command)`` of every page's commands, ``where`` as
    ``docs/howto/audit.md:32``."""
    return [(f"{page.relative_to(ROOT)}:{no}", command) for page in pages() for no, command in commands(page)]


def without_comment(command: str) -> str:
    return re.sub(r"\s+#.*$", "", command)


def rule_for(command: str) -> tuple[str, Any] | None:
    text = without_comment(command) + " "
    for pattern, rc, needle in RUN:
        if re.match(pattern, text) or re.match(pattern, text.rstrip()):
            return "run", (rc, needle)
    for pattern, where, needle in COVERED:
        if re.match(pattern, text):
            return "covered", (where, needle)
    return None


@pytest.fixture(scope="module")
def demo() -> str:
    """``./run demo``, as the quick start runs it."""
    proc = subprocess.run(["./run", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env={k: v for k, v in os.environ.items() if k not in ("MASTERSALT_CONFIG_DIR",
                                                                               "MCCLOUD_STORE_DIR")})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def shell(script: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTERSALT_CONFIG_DIR", "MCCLOUD_STORE_DIR",
                                                          "MCCLOUD_STORE")}
    env["HOME"] = str(tmp)
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


def test_the_demo_shows_its_steps_shortens_openly_and_says_how_to_go_on(demo: str, tmp_path: Path) -> None:
    for step in ("installing it into", "building the mccloud wheel", "running the demo",
                 "a masterless mastersalt configuration with the sample pillar"):
        assert step in demo, step
    assert "second call returns the same ip, mac, password, ssh_reverse_proxy_port, snmp_reverse_proxy_port: " \
           "True" in demo
    assert re.search(r"\(shortened: target, domains, vms of the \d+ keys it returns", demo)
    assert f"configuration, pillar and store are in {ROOT / '.demo'}" in demo
    # The lines it prints, pasted into a shell, work.
    exports = [line.strip() for line in demo.splitlines() if line.strip().startswith("export ")]
    assert [e.split("=")[0] for e in exports] == ["export MASTERSALT_CONFIG_DIR", "export PATH"], exports
    proc = shell("\n".join([*exports, "mastersalt-call mc_cloud.inventory", "mccloud inventory -o json"]), tmp_path)
    assert proc.returncode == 0 and "mysupertest3.foo.com" in proc.stdout, proc.stdout + proc.stderr
    # ./run shell sets the same two (its shell runs the command given).
    proc = shell('SHELL=/bin/bash ./run shell -c \'echo "$MASTERSALT_CONFIG_DIR"; command -v mccloud\'', tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(DEMO), str(ROOT / ".venv" / "bin" / "mccloud")], proc.stdout


def test_every_documented_command_runs_here_or_names_the_test_that_runs_it(demo: str, tmp_path: Path) -> None:
    found = documented()
    assert len(found) > 40 and sum(w.startswith("README.md:") for w, _ in found) >= 5, found
    assert {w.split(":")[0] for w, _ in found} >= {"README.md", "docs/tutorials/first-vm.md",
                                                  "docs/howto/upgrading.md", "docs/howto/audit.md"}
    unmatched = [(w, c) for w, c in found if rule_for(c) is None]
    assert not unmatched, f"documented commands neither run here nor covered (add them to RUN or COVERED): {unmatched}"
    exports: list[str] = []
    failures = []
    ran = 0
    for where, command in found:
        how, what = rule_for(command)  # type: ignore[misc]
        if how == "covered":
            test, needle = what
            assert needle in (ROOT / test).read_text(), f"{where} {command}: {test} no longer calls it"
            continue
        rc, needle = what
        if command.startswith("export "):
            exports.append(without_comment(command))
            continue
        # Written to /root on a controller; here, to a directory of this
        # command's own (two pages may show the same backup).
        home = tmp_path / f"root{ran}"
        home.mkdir()
        script = command.replace("/root/", f"{home}/")
        proc = shell("\n".join([*exports, script]), tmp_path)
        ran += 1
        out = proc.stdout + proc.stderr
        if proc.returncode != rc or needle not in out or "Traceback" in out:
            failures.append(f"{where} `{command}` exited {proc.returncode} (expected {rc}, "
                            f"output with {needle!r}):\n{out[-1500:]}")
    assert not failures, "\n\n".join(failures)
    assert ran >= 15 and exports, (ran, exports)


def test_a_salt_call_without_a_reachable_configuration_fails_at_once(tmp_path: Path) -> None:
    venv = ROOT / ".venv" / "bin"
    proc = shell(f"MASTERSALT_CONFIG_DIR={tmp_path}/nowhere {venv}/mastersalt-call mc_cloud.inventory", tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{tmp_path}/nowhere/minion does not exist" in proc.stderr and "MASTERSALT_CONFIG_DIR" in proc.stderr
    proc = shell(f"MASTERSALT_CONFIG_DIR={tmp_path}/nowhere {venv}/mastersalt-run mc_cloud.drift", tmp_path)
    assert proc.returncode == 2 and "master does not exist" in proc.stderr, proc.stderr
    # A configuration whose master does not answer (a closed loopback port).
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "minion").write_text(f"master: 127.0.0.1\nmaster_port: 9\nroot_dir: {tmp_path}/root\n")
    proc = shell(f"MASTERSALT_CONFIG_DIR={conf} {venv}/mastersalt-call test.true", tmp_path)
    assert proc.returncode == 2 and "127.0.0.1:9" in proc.stderr and "does not answer" in proc.stderr, proc.stderr
