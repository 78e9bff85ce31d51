"""The built wheel installed the way a Salt onedir installs an extension.

A Salt onedir is a Python of its own with Salt in it; ``salt-pip install``
runs that Python's pip with ``--target`` set to the onedir's
``extras-<python>`` directory, which a ``.pth`` file of the onedir puts on
``sys.path``. The stand-in here is a fresh virtualenv holding the same Salt
as the suite (and nothing of mccloud), with such an extras directory and
``.pth``. The wheel goes in the way ``salt-pip`` puts it (with
``saltpip_no_deps``, as the stand-in's pip, unlike the onedir's patched one,
would not count the Salt already installed), then ``pip check`` proves its
dependencies are met by the onedir's own packages. Everything then runs from
a directory outside the source tree, with no source path in the
environment: Salt finds the execution modules and runners through the
``salt.loader`` entry point, the SLS tree is found from the installed
package, and the console scripts work.

``./run test`` builds the wheel into ``target/wheels`` first.
"""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import pytest

from mccloud import saltcompat
from mccloud.cli import sample_pillar, write_masterless_config

ROOT = Path(__file__).resolve().parents[2]
CN, VM = "devhost10.local", "mysupertest3.foo.com"

pytestmark = pytest.mark.slow


def built_wheel() -> Path:
    found = sorted((ROOT / "target" / "wheels").glob("mccloud-*-abi3-*.whl"))
    if not found:
        pytest.fail("no built wheel in target/wheels: ./run test builds it (maturin build --release -o target/wheels)")
    return found[-1]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything pointing into the source tree."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MASTERSALT_CONFIG_DIR", "MCCLOUD_STORE_DIR")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not p.startswith(str(ROOT)))
    env.update(extra)
    return env


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def onedir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A stand-in onedir with the wheel installed as salt-pip installs it."""
    base = tmp_path_factory.mktemp("onedir")
    env = clean_env()
    # The interpreter behind this suite (not its virtualenv), as a onedir's own.
    python = getattr(sys, "_base_executable", None) or sys.executable
    run([python, "-m", "venv", str(base / "salt")], base, env)
    py = base / "salt" / "bin" / "python"
    run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"salt=={saltcompat.version()}"],
        base, env)
    purelib = run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], base, env).stdout.strip()
    extras = base / "salt" / f"extras-{sys.version_info.major}.{sys.version_info.minor}"
    extras.mkdir()
    Path(purelib, "mccloud-onedir-extras.pth").write_text(f"{extras}\n")
    wheel = built_wheel()
    pip_env = clean_env(PYTHONPATH=str(extras))
    run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
         f"--target={extras}", str(wheel)], base, pip_env)
    # What salt-pip then installs beside it: the dependency Salt does not bring.
    run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"--target={extras}",
         "dnspython>=2.3"], base, pip_env)
    return {"base": base, "py": py, "extras": extras, "bin": extras / "bin", "env": env, "wheel": wheel}


def test_the_wheel_is_an_abi3_salt_extension_naming_the_supported_salt(onedir: dict[str, Any]) -> None:
    wheel: Path = onedir["wheel"]
    assert "-cp310-abi3-" in wheel.name, wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(meta).decode()
        entry_points = zf.read(meta.replace("METADATA", "entry_points.txt")).decode()
    lo, hi = saltcompat.SUPPORTED[0], saltcompat.SUPPORTED[-1] + 1
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: salt")]
    assert requires and f">={lo}" in requires[0] and f"<{hi}" in requires[0], requires
    assert "Requires-Python: >=3.10" in metadata
    assert "Keywords: salt-extension" in metadata.replace(",", "\nKeywords: ")
    groups = configparser.ConfigParser(delimiters=("=",))
    groups.optionxform = str  # type: ignore[assignment,method-assign]
    groups.read_string(entry_points)
    assert dict(groups["salt.loader"]) == {"mccloud": "mccloud"}, entry_points
    assert {k: v.split(":")[0] for k, v in groups["console_scripts"].items()} == {
        "mccloud": "mccloud.cli", "mastersalt-call": "mccloud.cli", "mastersalt-run": "mccloud.cli",
        "mastersalt": "mccloud.cli"}
    # The Salt modules, the SLS tree and the sample pillar are in the wheel.
    for path in ("mccloud/modules/mc_cloud_lxc.py", "mccloud/runners/mc_cloud_lxc.py",
                 "mccloud/states/mccloud_rootfs.py", "mccloud/data/sample_pillar.sls",
                 "mccloud/sls/makina-states/cloud/lxc/init.sls"):
        assert path in names, path
    assert not [n for n in names if n.startswith(("tests/", "src/"))]


def test_its_dependencies_are_met_by_the_onedir_and_it_imports_from_extras(onedir: dict[str, Any]) -> None:
    env, py = onedir["env"], str(onedir["py"])
    run([py, "-m", "pip", "check"], onedir["base"], env)
    where = run([py, "-c", "import mccloud, mccloud._native, mccloud.saltcompat as c; "
                           "print(mccloud.__file__); print(c.version())"],
                onedir["base"], env).stdout.split()
    assert where[0].startswith(str(onedir["extras"])), where
    assert where[1] == saltcompat.version()


def test_salt_finds_the_modules_runners_and_sls_from_the_installed_package(onedir: dict[str, Any]) -> None:
    base, env = onedir["base"], onedir["env"]
    bindir: Path = onedir["bin"]
    sls_root = run([str(bindir / "mccloud"), "sls-root"], base, env).stdout.strip()
    assert sls_root.startswith(str(onedir["extras"])), sls_root
    assert (Path(sls_root) / "makina-states" / "cloud" / "lxc" / "init.sls").is_file()

    # A configuration naming no module directory: only the entry point can
    # bring mc_cloud_*; the file_roots are the installed package's SLS tree.
    conf = Path(write_masterless_config(str(base / "cfg"), sample_pillar()))
    for name in ("minion", "master"):
        opts = json.loads((conf / name).read_text())
        opts["file_roots"] = {"base": [sls_root]}
        (conf / name).write_text(json.dumps(opts))
    call_env = {**env, "MASTERSALT_CONFIG_DIR": str(conf)}

    out = run([str(bindir / "mastersalt-call"), "--local", "--out=json",
               "mc_cloud_lxc.get_settings_for_vm", CN, VM], base, call_env).stdout
    settings = json.loads(out)["local"]
    assert settings["ip"].count(".") == 3 and settings["mac"].count(":") == 5, settings

    # An SLS of the tree renders from the installed package (with the
    # jinja it imports from the same tree).
    sync = {"cron_sync": True, "cron_minute": "17", "cron_hour": "3", "mastersalt": True}
    out = run([str(bindir / "mastersalt-call"), "--local", "--out=json", "state.show_sls",
               "makina-states.cloud.lxc.controller.crons", f"pillar={json.dumps({'mccloud': {'image_sync': sync}})}"],
              base, call_env).stdout
    shown = json.loads(out)["local"]
    assert isinstance(shown, dict) and "mccloud-lxc-image-sync-schedule" in shown, shown

    # Runners too (salt-run's documentation lists what it loaded).
    docs = run([str(bindir / "mastersalt-run"), "-d", "mc_cloud_lxc", "--out=json"], base, call_env).stdout
    assert "mc_cloud_lxc.install_vt" in docs, docs[:500]


def test_the_native_module_is_one_abi3_library(onedir: dict[str, Any]) -> None:
    libs = list((onedir["extras"] / "mccloud").glob("_native*.so"))
    assert [p.name for p in libs] == ["_native.abi3.so"], libs
    assert sysconfig.get_config_var("EXT_SUFFIX") not in libs[0].name
