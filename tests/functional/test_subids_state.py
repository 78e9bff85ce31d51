"""Root's subordinate ids on a compute node, through the real ``salt-call``:
the state the compute-node deploy applies (``mccloud_subids.root_range``)
on temporary ``subuid`` and ``login.defs`` files, never the host's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.saltenv import SaltEnv

START, BLOCK = 1_000_000_000, 65536


def _apply(salt_env: SaltEnv, subuid: Path, login_defs: Path, count: int, *extra: str) -> tuple[int, dict[str, Any]]:
    r = salt_env.call("state.single", "mccloud_subids.root_range", f"name={subuid}", f"start={START}",
                      f"count={count}", f"login_defs={login_defs}", *extra)
    (ret,) = r.data.values()
    return r.returncode, ret


def test_the_deploy_state_refuses_another_owners_range_and_grows_roots_line(salt_env: SaltEnv,
                                                                            tmp_path: Path) -> None:
    subuid, defs = tmp_path / "subuid", tmp_path / "login.defs"
    defs.write_text("SUB_UID_MIN 100000\nSUB_UID_MAX 600100000\n")
    before = "# host users\nalice:100000:65536\nbob:1000131072:65536\n"
    subuid.write_text(before)
    rc, ret = _apply(salt_env, subuid, defs, 3 * BLOCK)
    assert rc != 0 and ret["result"] is False, ret
    assert "'bob'" in ret["comment"] and "1000131072-1000196607" in ret["comment"], ret["comment"]
    assert subuid.read_text() == before
    # Two blocks: clear of bob's range; root's line appended, others kept.
    rc, ret = _apply(salt_env, subuid, defs, 2 * BLOCK)
    assert rc == 0 and ret["result"] is True and ret["changes"], ret
    assert subuid.read_text() == before + f"root:{START}:{2 * BLOCK}\n"
    rc, ret = _apply(salt_env, subuid, defs, 2 * BLOCK)
    assert rc == 0 and ret["result"] is True and not ret["changes"], ret
    # Once bob's range moves, the node grows: root's line is replaced.
    subuid.write_text(subuid.read_text().replace("bob:1000131072", "bob:2000000000"))
    rc, ret = _apply(salt_env, subuid, defs, 4 * BLOCK)
    assert rc == 0 and ret["result"] is True, ret
    assert subuid.read_text().splitlines()[-1] == f"root:{START}:{4 * BLOCK}"
    assert subuid.read_text().count("root:") == 1


def test_the_deploy_state_refuses_useradds_range_unless_allowed(salt_env: SaltEnv, tmp_path: Path) -> None:
    subuid, defs = tmp_path / "subuid", tmp_path / "login.defs"
    defs.write_text("SUB_UID_MIN 100000\nSUB_UID_MAX 2000000000\n")
    rc, ret = _apply(salt_env, subuid, defs, BLOCK)
    assert rc != 0 and ret["result"] is False, ret
    assert "idmap_allow_login_defs_range" in ret["comment"] and "100000-2000000000" in ret["comment"]
    assert not subuid.exists()
    rc, ret = _apply(salt_env, subuid, defs, BLOCK, "allow_login_defs_range=True")
    assert rc == 0 and ret["result"] is True, ret
    assert subuid.read_text() == f"root:{START}:{BLOCK}\n"
