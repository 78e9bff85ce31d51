"""The subordinate id files of a compute node: parsing, the check against
other owners and useradd's range, and root's line, on real files."""

from __future__ import annotations

import os

import pytest

from mccloud import subids

START = 1_000_000_000
BLOCK = 65536


def test_parse_reads_names_numeric_uids_and_skips_comments(tmp_path):
    text = "# comment\n\nalice:100000:65536\n1001:165536:65536\n  root:1000000000:131072  \n"
    lines = subids.parse(text, "/etc/subuid")
    assert [(x.owner, x.start, x.count, x.lineno) for x in lines] == [
        ("alice", 100000, 65536, 3), ("1001", 165536, 65536, 4), ("root", 1000000000, 131072, 5)]
    assert lines[0].end == 165535


@pytest.mark.parametrize("bad", ["alice:100000", "alice:x:65536", ":1:2", "alice:1:2:3", "alice:-1:5"])
def test_parse_refuses_a_line_it_cannot_read(bad):
    with pytest.raises(subids.SubidError, match="line 2"):
        subids.parse(f"ok:1:1\n{bad}\n", "/etc/subuid")


def test_login_defs_range():
    assert subids.login_defs_range(None, "uid") == (100000, 600100000)
    text = "# SUB_UID_MIN 1\nSUB_UID_MIN\t\t 200000\nSUB_UID_MAX 300000\nSUB_GID_MAX 400000\n"
    assert subids.login_defs_range(text, "uid") == (200000, 300000)
    assert subids.login_defs_range(text, "gid") == (100000, 400000)


def _files(tmp_path, subuid, login_defs=None):
    path = tmp_path / "subuid"
    path.write_text(subuid)
    defs = tmp_path / "login.defs"
    if login_defs is not None:
        defs.write_text(login_defs)
    return str(path), str(defs)


def test_another_owner_overlapping_fails_naming_owner_and_range(tmp_path):
    before = "bob:1000065536:65536\n"
    path, defs = _files(tmp_path, before)
    with pytest.raises(subids.SubidError) as err:
        subids.ensure(path, START, 2 * BLOCK, defs, False)
    assert "'bob'" in str(err.value) and "1000065536-1000131071" in str(err.value)
    assert "idmap_range_start" in str(err.value)
    assert open(path).read() == before


def test_a_numeric_owner_overlapping_fails_too(tmp_path):
    path, defs = _files(tmp_path, "1001:999999999:2\n")
    with pytest.raises(subids.SubidError, match="'1001'.*999999999-1000000000"):
        subids.ensure(path, START, BLOCK, defs, False)


def test_non_overlapping_passes_and_keeps_other_lines(tmp_path):
    before = "# users\nalice:100000:65536\nbob:1000131072:65536\n"
    path, defs = _files(tmp_path, before)
    os.chmod(path, 0o640)
    assert subids.ensure(path, START, 2 * BLOCK, defs, False)[0] is True
    assert open(path).read() == before + f"root:{START}:{2 * BLOCK}\n"
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert subids.ensure(path, START, 2 * BLOCK, defs, False)[0] is False


def test_growing_replaces_roots_line_only(tmp_path):
    before = f"root:1000000:4293918720\nalice:100000:65536\nroot:{START}:{BLOCK}\n"
    path, defs = _files(tmp_path, before)
    assert subids.ensure(path, START, 3 * BLOCK, defs, False)[0] is True
    assert open(path).read() == f"root:1000000:4293918720\nalice:100000:65536\nroot:{START}:{3 * BLOCK}\n"


def test_a_dry_run_writes_nothing(tmp_path):
    path, defs = _files(tmp_path, "")
    assert subids.ensure(path, START, BLOCK, defs, False, dry_run=True)[0] is True
    assert open(path).read() == ""


def test_a_missing_file_is_created(tmp_path):
    path = str(tmp_path / "subgid")
    assert subids.ensure(path, START, BLOCK, str(tmp_path / "none"), False)[0] is True
    assert open(path).read() == f"root:{START}:{BLOCK}\n"
    assert os.stat(path).st_mode & 0o777 == 0o644


def test_nothing_needed_writes_nothing(tmp_path):
    path, defs = _files(tmp_path, "bob:1000000000:65536\n")
    assert subids.ensure(path, START, 0, defs, False)[0] is False


def test_a_start_inside_useradds_range_is_refused_unless_allowed(tmp_path):
    path, defs = _files(tmp_path, "")
    with pytest.raises(subids.SubidError) as err:
        subids.ensure(path, 1_000_000, BLOCK, defs, False)
    assert subids.ALLOW_KEY in str(err.value) and "100000-600100000" in str(err.value)
    assert open(path).read() == ""
    assert subids.ensure(path, 1_000_000, BLOCK, defs, True)[0] is True


def test_login_defs_on_the_node_decides(tmp_path):
    path, defs = _files(tmp_path, "", "SUB_UID_MIN 100000\nSUB_UID_MAX 2000000000\n")
    with pytest.raises(subids.SubidError, match="100000-2000000000"):
        subids.ensure(path, START, BLOCK, defs, False)
    path, defs = _files(tmp_path, "", "SUB_UID_MIN 100000\nSUB_UID_MAX 900000\n")
    assert subids.ensure(path, 1_000_000, BLOCK, defs, False)[0] is True
