"""mccloud.saltcompat: the one place mccloud touches Salt's library, on
whichever supported Salt is installed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cryptography.hazmat.primitives import serialization

import mccloud
from mccloud import saltcompat

PACKAGE = Path(mccloud.__file__).parent
ROOT = Path(__file__).resolve().parents[2]


def salt_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [f"{path.name}:{node.lineno} {n}" for n in names if n == "salt" or n.startswith("salt.")]
    return found


def test_only_saltcompat_imports_salt() -> None:
    files = [p for p in PACKAGE.rglob("*.py") if p.name != "saltcompat.py"]
    assert len(files) > 20, files
    assert [i for p in files for i in salt_imports(p)] == []
    assert salt_imports(PACKAGE / "saltcompat.py"), "saltcompat is where Salt is imported"


def test_the_installed_salt_is_a_supported_line_and_the_metadata_says_the_same() -> None:
    assert saltcompat.supported(), saltcompat.version()
    assert saltcompat.release_line("3008.4") == 3008 and saltcompat.release_line("3007.15") == 3007
    assert not saltcompat.supported("3006.9") and not saltcompat.supported("3009.0")
    assert not saltcompat.supported("nonsense")
    assert saltcompat.REFERENCE == saltcompat.SUPPORTED[-1]
    pyproject = (ROOT / "pyproject.toml").read_text()
    wanted = f'"salt>={saltcompat.SUPPORTED[0]},<{saltcompat.SUPPORTED[-1] + 1}"'
    assert re.search(r"^dependencies = \[.*" + re.escape(wanted), pyproject, re.M), wanted


def test_write_keys_writes_a_pair_salt_can_use(tmp_path: Path) -> None:
    priv = saltcompat.write_keys(str(tmp_path), "minion", 2048)
    assert priv == str(tmp_path / "minion.pem")
    key = serialization.load_pem_private_key((tmp_path / "minion.pem").read_bytes(), None)
    pub = serialization.load_pem_public_key((tmp_path / "minion.pub").read_bytes())
    assert key.public_key().public_numbers() == pub.public_numbers()  # type: ignore[union-attr]
    assert key.key_size == 2048  # type: ignore[union-attr]


def test_plain_gives_plain_containers_with_the_real_values() -> None:
    value = {"a": {"password": "s3cret", "list": [{"x": 1}, "y"]}, "n": 2}
    secret = saltcompat._secret_module()
    given = secret.hide(value) if secret is not None else value
    got = saltcompat.plain(given)
    assert got == value
    assert type(got) is dict and type(got["a"]) is dict and type(got["a"]["list"]) is list
    assert "s3cret" in repr(got)
