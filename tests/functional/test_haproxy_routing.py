"""haproxy as the registry renders it, with real requests on loopback: a
wildcard domain and a domain that spells its star never share a backend,
and a wildcard matches its subdomains only (never evilfoo.com for
*.foo.com)."""

from __future__ import annotations

import http.client
import http.server
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from mccloud.pki import file_stem

#: No Salt code runs here: the previous Salt line's suite leaves it out.
pytestmark = pytest.mark.salt_free
from tests.support.runners import Offline

CN = "cn1.example.net"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def backend(name: str) -> tuple[http.server.HTTPServer, int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = name.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, int(server.server_address[1])


def get(port: int, host: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/", headers={"Host": host})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[int]:
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is installed by ./run setup")
    http_port, https_port = free_port(), free_port()
    pillar = {
        f"makina-states.cloud.lxc.vms.{CN}": {
            "a.example.net": {"domains": ["*.foo.com"]},
            "b.example.net": {"domains": ["star.foo.com"]},
        },
        f"makina-states.cloud.compute_node.conf.{CN}": {
            "bind_address": "127.0.0.1", "http_port": http_port, "https_port": https_port,
            "ssl_certs_dir": str(tmp_path / "certs"),
        },
    }
    # What a node deploy sends: the registry's node data and its certificates.
    t = Offline(tmp_path / "controller", pillar).env.node_data(CN)
    (tmp_path / "certs").mkdir()
    for domain, pem in t["ssl_certs"]:
        (tmp_path / "certs" / f"{file_stem(domain)}.crt").write_text(pem)
    cfg = t["reverse_proxies"]["haproxy_cfg"]
    servers = []
    for vm, data in t["vms"].items():
        server, port = backend(vm)
        servers.append(server)
        # The VMs stand on loopback: only the servers' addresses change.
        cfg = cfg.replace(f" {data['ip']}:80", f" 127.0.0.1:{port}")
    # No ssh listeners here (their ports are the registry's, maybe in use).
    cfg = "\n\n".join(b for b in cfg.strip().split("\n\n") if not b.lstrip().startswith("listen ")) + "\n"
    path = tmp_path / "haproxy.cfg"
    path.write_text(cfg)
    check = subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr + cfg
    proc = subprocess.Popen(["haproxy", "-db", "-f", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", http_port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "haproxy did not start"
                time.sleep(0.1)
        yield http_port
    finally:
        proc.terminate()
        proc.wait(10)
        for s in servers:
            s.shutdown()


def test_a_wildcard_and_a_star_domain_reach_their_own_vm(proxy: int) -> None:
    assert get(proxy, "star.foo.com") == (200, "b.example.net")
    assert get(proxy, "www.foo.com") == (200, "a.example.net")
    assert get(proxy, "www.foo.com:80") == (200, "a.example.net"), "a port in Host changes nothing"
    assert get(proxy, "deep.www.foo.com") == (200, "a.example.net")


def test_a_wildcard_matches_its_subdomains_only(proxy: int) -> None:
    for host in ("evilfoo.com", "foo.com", "foo.com.evil.org"):
        status, body = get(proxy, host)
        assert status == 503 and "a.example.net" not in body, host
