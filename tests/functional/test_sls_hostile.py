"""Every SLS of the tree, rendered through the real ``salt-call --local
state.show_sls`` with hostile data: every string and number of the data the
runners pass (and the keys of the mappings whose keys are names: VMs,
images, backends, lxc_conf entries) is replaced by a unique marker holding
shell and YAML metacharacters and line breaks.

Values are data, never code: the render must succeed, hold exactly the
states and arguments of the benign render (no injected state or argument),
and the markers may only reach places where they are inert (a command's
environment, file contents and paths, fun-based requisite arguments, test
states' comments, sysctl and grain values). A self-test proves the checker
catches a deliberately bad SLS.
"""

from __future__ import annotations

import copy
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from itertools import count
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from mccloud.cli import write_masterless_config
from mccloud.orchestration import sls_root
from tests.support.sls import ALL_SLS, data_for, show_sls

TOKEN = "HOSTILE"
#: Keys whose mapping values are keyed by names that come from pillar.
NAME_KEYED = {"vms", "images", "backends"}
#: Keys holding lists of mappings keyed by names that come from pillar.
NAME_KEYED_ITEMS = {"lxc_conf"}
#: SLS that render no data (no marker can show in them): those that use
#: none, and the registry ones, whose data Salt reads from pillar when it
#: applies them (dataset_pillar).
DATA_FREE = {
    "makina-states.cloud.generic",
    "makina-states.cloud.generic.compute_node.grains",
    "makina-states.cloud.generic.compute_node.registry",
    "makina-states.cloud.generic.compute_node.sshkeys",
    "makina-states.cloud.lxc",
    "makina-states.cloud.lxc.compute_node.grains",
    "makina-states.cloud.kvm",
    "makina-states.cloud.kvm.compute_node.grains",
    "makina-states.cloud.lxc.vm.hostsfile",
    "makina-states.cloud.saltify",
}


def inline(n: int) -> str:
    """A marker breaking out of shell quoting, heredocs and YAML flow."""
    return (f"/{TOKEN}{n}\n$(touch /tmp/{TOKEN}{n});'\"`x`: {{y: z}}\nMCCLOUD_EOF\n"
            f"echo {TOKEN}{n} # \u2028\x85- [a, b]")


def structural(n: int) -> str:
    """A marker that adds a state when pasted raw into a block of YAML."""
    return f"/{TOKEN}{n}\nmccloud-injected-{n}:\n  cmd.run:\n    - name: touch /tmp/{TOKEN}{n}\n"


VARIANTS: dict[str, Callable[[int], str]] = {"inline": inline, "structural": structural}


def hostile(value: Any, make: Callable[[int], str], numbers: Iterator[int] | None = None,
            parent: str = "") -> Any:
    """``value`` with every string and number (not booleans) replaced by a
    unique marker, recursively; keys too for name-keyed mappings."""
    numbers = numbers if numbers is not None else count(1)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (str, int, float)):
        return make(next(numbers))
    if isinstance(value, list):
        return [hostile(v, make, numbers, parent + "[]") for v in value]
    if isinstance(value, dict):
        rename = parent in NAME_KEYED or parent == "lxc_conf[]"
        return {(make(next(numbers)) if rename else k): hostile(v, make, numbers, k) for k, v in value.items()}
    return value


# --- the checker --------------------------------------------------------------

#: Arguments that may carry data, per state module (besides fun-based
#: requisite arguments, checked separately).
ALLOWED_ARGS = {
    "cmd": {"env", "creates"},
    "file": {"name", "names", "contents", "text", "content", "dataset", "repl", "marker_start", "marker_end"},
    "test": {"name", "comment"},
    "sysctl": {"value", "config"},
    "grains": {"value"},
    "mccloud_certs": {"name", "pillar", "keep"},
    "mccloud_rootfs": {"name", "root", "contents", "text", "dataset", "password_hash", "lower"},
    "mccloud_kvm": {"name", "dir"},
}
REQUISITE_FUN_ARGS = {"unless", "onlyif"}
EXECUTABLE_MODES = {"755", "0755", "700", "0700", "775", "0775"}


def states_of(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    states = json.loads(p.stdout)["local"]
    assert isinstance(states, dict), states
    return states


def calls(states: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(state id, ``module.function``, arguments) of every state."""
    for sid, body in states.items():
        for mod, chunks in body.items():
            if mod.startswith("__"):
                continue
            fun, args = "?", {}
            for c in chunks:
                if isinstance(c, str):
                    fun = c
                elif isinstance(c, dict):
                    args.update(c)
            args.pop("order", None)
            yield sid, f"{mod}.{fun}", args


def shape(states: dict[str, Any]) -> set[tuple[str, str, frozenset[str]]]:
    return {(sid, fun, frozenset(args)) for sid, fun, args in calls(states)}


def has_marker(value: Any) -> bool:
    return TOKEN in json.dumps(value, ensure_ascii=False)


def leaks(states: dict[str, Any]) -> list[str]:
    """Where markers reached a place where data must not go."""
    bad = []
    for sid, fun, args in calls(states):
        mod = fun.split(".")[0]
        if has_marker(sid):
            bad.append(f"{sid!r}: a state id holds data")
        if has_marker(fun):
            bad.append(f"{sid}: the state function holds data")
        for key, value in args.items():
            if not has_marker(value):
                continue
            if key in REQUISITE_FUN_ARGS:
                items = value if isinstance(value, list) else [value]
                for item in items:
                    fun_based = isinstance(item, dict) and "fun" in item
                    if has_marker(item["fun"] if fun_based else item):
                        bad.append(f"{sid} ({fun}): {key} holds data in a command: {item!r}")
                continue
            if key == "env" and mod == "cmd":
                env = value if isinstance(value, dict) else {k: v for d in value for k, v in d.items()}
                bad += [f"{sid}: environment variable name {k!r} holds data" for k in env if has_marker(k)]
                continue
            if key not in ALLOWED_ARGS.get(mod, set()):
                bad.append(f"{sid} ({fun}): argument {key} holds data: {value!r}")
            elif key == "contents" and str(args.get("mode", "")) in EXECUTABLE_MODES:
                bad.append(f"{sid} ({fun}): an executable file's contents hold data")
    return bad


def render(tmp: Path, sls: str, pillar: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    tmp.mkdir(parents=True, exist_ok=True)
    return show_sls(tmp, sls, pillar)


def audit(tmp: Path, sls: str, benign: dict[str, Any]) -> list[str]:
    """Renders ``sls`` with the benign data and with each hostile variant;
    returns what is wrong (empty when nothing is)."""
    pillars = {"benign": benign, **{name: hostile(benign, make) for name, make in VARIANTS.items()}}
    with ThreadPoolExecutor(len(pillars)) as pool:
        done = dict(zip(pillars, pool.map(lambda kv: render(tmp / kv[0], sls, kv[1]), pillars.items())))
    p = done.pop("benign")
    assert p.returncode == 0, p.stdout + p.stderr
    want = shape(states_of(p))
    problems = []
    for name, p in done.items():
        if p.returncode != 0 or "Traceback" in p.stderr:
            problems.append(f"{name}: the render fails: {(p.stdout + p.stderr)[-2000:]}")
            continue
        states = states_of(p)
        got = shape(states)
        problems += [f"{name}: injected or changed state {s}" for s in sorted(got - want, key=str)]
        problems += [f"{name}: missing state {s}" for s in sorted(want - got, key=str)]
        problems += [f"{name}: {leak}" for leak in leaks(states)]
        if sls not in DATA_FREE and not has_marker(states):
            problems.append(f"{name}: no marker reached the render: the data was not used")
    return problems


# --- the tree -----------------------------------------------------------------


@pytest.mark.parametrize("sls", ALL_SLS)
def test_hostile_data_stays_data(data: dict[str, Any], sls: str) -> None:
    benign = copy.deepcopy(data_for(sls, data))
    assert audit(data["tmp"] / "hostile" / sls, sls, benign) == []


def standalone_haproxy(data: dict[str, Any]) -> dict[str, Any]:
    node = copy.deepcopy(data["node"])
    node["conf"].update(haproxy_service=False, haproxy_pidfile="/run/mccloud-haproxy.pid")
    return node


def other_template(data: dict[str, Any]) -> dict[str, Any]:
    node = copy.deepcopy(data["node"])
    node["images"]["busybox-img"] = {"template": "busybox", "template_args": "--busyboxpath /bin/busybox"}
    return node


def lvm_scratch(data: dict[str, Any]) -> dict[str, Any]:
    scratch = copy.deepcopy(data["scratch"])
    scratch["vm"].update(backing="lvm", vgname="data", lvname="b", size="10G")
    return scratch


#: The branches the benign data of test_sls does not take.
BRANCHES: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "scratch": ("makina-states.cloud.lxc.vm.spawn", lambda data: data["scratch"]),
    "lvm-scratch": ("makina-states.cloud.lxc.vm.spawn", lvm_scratch),
    "standalone-haproxy": ("makina-states.cloud.generic.compute_node.reverse_proxy", standalone_haproxy),
    "other-template": ("makina-states.cloud.lxc.compute_node.images", other_template),
    "upgrade": ("makina-states.cloud.lxc.compute_node.install_lxc", lambda data: {**data["node"], "upgrade": True}),
}


@pytest.mark.parametrize("branch", sorted(BRANCHES))
def test_hostile_data_stays_data_in_other_branches(data: dict[str, Any], branch: str) -> None:
    sls, make = BRANCHES[branch]
    benign = copy.deepcopy(make(data))
    assert audit(data["tmp"] / "hostile-branch" / branch, sls, benign) == []


def test_the_bridge_boot_stanza_is_written_only_for_plain_values(data: dict[str, Any]) -> None:
    """ifupdown hands the stanza's values to a shell: a hostile value makes
    the guard state fail, and the stanza requires it."""
    sls = "makina-states.cloud.lxc.compute_node.install_lxc"
    for name, pillar in (("benign", data["node"]), ("hostile", hostile(data["node"], inline))):
        p = render(data["tmp"] / "boot" / name, sls, pillar)
        states = {sid: args for sid, _, args in calls(states_of(p))}
        assert states["mccloud-lxc-bridge-boot-values"]["result"] is (name == "benign")
        assert {"test": "mccloud-lxc-bridge-boot-values"} in states["mccloud-lxc-bridge-boot"]["require"]
        post_up = [ln for ln in states["mccloud-lxc-bridge-boot"]["contents"].splitlines() if "post-up" in ln]
        assert post_up == ["    post-up /etc/mccloud/lxc-nat.sh"]


# --- the checker catches a bad SLS ----------------------------------------------

#: Bad SLS, each with what the checker must say about it.
BAD = {
    "cmd_name": ("mccloud-bad:\n  cmd.run:\n    - name: {{ ('echo ' ~ pillar.mccloud.x) | tojson }}\n",
                 "argument name holds data"),
    "cmd_unless": ("mccloud-bad:\n  cmd.run:\n    - name: 'true'\n"
                   "    - unless: {{ ('test -e ' ~ pillar.mccloud.x) | tojson }}\n", "unless holds data"),
    "raw_yaml": ("mccloud-bad:\n  test.nop:\n    - name: {{ pillar.mccloud.x }}\n", "injected or changed state"),
    "state_id": ("{{ ('mccloud-bad-' ~ pillar.mccloud.x) | tojson }}:\n  test.nop: []\n", "a state id holds data"),
    "env_name": ("mccloud-bad:\n  cmd.run:\n    - name: 'true'\n    - env:\n        {{ pillar.mccloud.x | tojson }}: '1'\n",
                 "environment variable name"),
    "script": ("mccloud-bad:\n  file.managed:\n    - name: /tmp/x.sh\n    - mode: '0755'\n"
               "    - contents: {{ ('#!/bin/sh\\necho ' ~ pillar.mccloud.x) | tojson }}\n", "an executable file's contents"),
    "pkg_arg": ("mccloud-bad:\n  pkg.installed:\n    - name: {{ pillar.mccloud.x | tojson }}\n",
                "argument name holds data"),
}
GOOD = (
    "mccloud-good:\n  cmd.run:\n    - name: echo \"$X\"\n    - env:\n        X: {{ pillar.mccloud.x | tojson }}\n"
    "    - onlyif:\n      - fun: file.file_exists\n        path: {{ pillar.mccloud.x | tojson }}\n"
    "    - creates: {{ pillar.mccloud.x | tojson }}\n"
)


@pytest.fixture(scope="module")
def bad_roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A configuration whose file_roots hold the bad and good SLS below
    (show_sls keeps a configuration it finds in place)."""
    tmp = tmp_path_factory.mktemp("bad")
    roots = tmp / "roots"
    roots.mkdir()
    for name, (text, _) in BAD.items():
        (roots / f"{name}.sls").write_text(text)
    (roots / "good.sls").write_text(GOOD)
    for variant in ("benign", *VARIANTS):
        write_masterless_config(str(tmp / variant / "conf"), "{}")
        minion_file = tmp / variant / "conf" / "mastersalt" / "minion"
        minion = json.loads(minion_file.read_text())
        minion["file_roots"] = {"base": [str(roots), sls_root()]}
        minion_file.write_text(json.dumps(minion))
    return tmp


@pytest.mark.parametrize("sls", sorted(BAD))
def test_the_checker_catches_a_bad_sls(bad_roots: Path, sls: str) -> None:
    problems = audit(bad_roots, sls, {"x": "/srv/data"})
    said = BAD[sls][1]
    assert problems and all(any(said in p for p in problems if p.startswith(f"{v}: ")) for v in VARIANTS
                            if sls != "raw_yaml" or v == "structural"), problems


def test_the_checker_passes_a_good_sls(bad_roots: Path) -> None:
    assert audit(bad_roots, "good", {"x": "/srv/data"}) == []


def test_markers_are_unique_and_hostile() -> None:
    h = hostile({"vms": {"a": {"p": 1, "l": ["x", True]}}, "s": "y"}, inline)
    (vm, conf), = h["vms"].items()
    assert TOKEN in vm and conf["l"][1] is True
    values = [vm, conf["p"], conf["l"][0], h["s"]]
    assert len(set(values)) == 4 and all("\n" in v and "$(" in v and "{y: z}" in v for v in values)
