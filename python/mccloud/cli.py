"""Command-line entry points.

- ``mastersalt-call`` / ``mastersalt-run``: ``salt-call`` / ``salt-run`` on the
  mastersalt configuration directory (``$MASTERSALT_CONFIG_DIR``, default
  ``/etc/mastersalt``).
- ``mccloud demo``: the quick start — a throw-away masterless mastersalt
  configuration with the sample pillar, queried through the real
  ``mastersalt-call``.
- ``mccloud inventory``: compute nodes, VMs and free capacity, without Salt.
- ``mccloud sls-root``: the directory holding the SLS tree (``makina-states/``),
  to add to the master's ``file_roots``.
- ``mccloud store backup DEST`` / ``mccloud store check``: a consistent copy
  of the store (SQLite's online backup, while others keep allocating; a
  PostgreSQL store's one snapshot, written as a SQLite store file), and
  its integrity check, schema version and identity.
- ``mccloud store migrate --to postgresql://…``: copies a SQLite store (and
  what the historical store beside it holds) into an empty PostgreSQL
  database, compared row by row before it is committed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from importlib import resources
from typing import Any, Sequence

import mccloud
from mccloud import saltcompat, saltsupport

DEFAULT_MASTERSALT_DIR = "/etc/mastersalt"


def _mastersalt(script: str) -> None:
    conf = os.environ.get(saltsupport.MASTERSALT_ENV) or DEFAULT_MASTERSALT_DIR
    os.environ[saltsupport.MASTERSALT_ENV] = conf
    sys.argv = [sys.argv[0], "-c", conf, *sys.argv[1:]]
    saltcompat.run_script(script)


def mastersalt_call() -> None:
    """``salt-call -c $MASTERSALT_CONFIG_DIR …``"""
    _mastersalt("salt_call")


def mastersalt_run() -> None:
    """``salt-run -c $MASTERSALT_CONFIG_DIR …``"""
    _mastersalt("salt_run")


def sample_pillar() -> str:
    """The sample pillar shipped with mccloud (YAML text)."""
    return resources.files("mccloud").joinpath("data/sample_pillar.sls").read_text()


def write_masterless_config(base: str, pillar_text: str, minion_id: str = "controller") -> str:
    """Writes a throw-away masterless Salt configuration under ``base`` with
    ``pillar_text`` as its only pillar; returns the configuration directory."""
    conf, root, pillar = (os.path.join(base, d) for d in ("mastersalt", "root", "pillar"))
    # salt-run (Salt 3008) notes each job in the master's proc directory,
    # which only a running master creates: this configuration has none.
    proc = os.path.join(root, "var", "cache", "salt", "master", "proc")
    for d in (conf, root, pillar, os.path.join(base, "states"), proc):
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(pillar, "top.sls"), "w") as f:
        f.write("base:\n  '*':\n    - cloud\n")
    with open(os.path.join(pillar, "cloud.sls"), "w") as f:
        f.write(pillar_text)
    settings = {
        "id": minion_id,
        "file_client": "local",
        "root_dir": root,
        "pillar_roots": {"base": [pillar]},
        "file_roots": {"base": [os.path.join(base, "states")]},
        "master_port": 4606,
        "log_level_logfile": "warning",
    }
    with open(os.path.join(conf, "minion"), "w") as f:
        json.dump(settings, f, indent=2)
    with open(os.path.join(conf, "master"), "w") as f:
        json.dump({**settings, "interface": "127.0.0.1", "ret_port": 4606, "publish_port": 4605}, f, indent=2)
    return conf


def _run(conf: str, *args: str) -> Any:
    env = {**os.environ, saltsupport.MASTERSALT_ENV: conf}
    cmd = [sys.executable, "-c", "from mccloud.cli import mastersalt_call; mastersalt_call()",
           "--local", "--out=json", *args]
    print(f"$ mastersalt-call --local {' '.join(args)}", flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"mastersalt-call failed with exit code {proc.returncode}")
    return json.loads(proc.stdout)["local"]


def demo(args: argparse.Namespace) -> int:
    """Runs the registry on the sample pillar through the real ``mastersalt-call``."""
    base = args.dir or tempfile.mkdtemp(prefix="mccloud-demo-")
    conf = write_masterless_config(base, sample_pillar())
    print(f"throw-away mastersalt configuration: {conf}")
    cn, vm = "devhost10.local", "mysupertest3.foo.com"
    first = _run(conf, "mc_cloud_lxc.get_settings_for_vm", cn, vm)
    print(json.dumps(first, indent=2, sort_keys=True))
    again = _run(conf, "mc_cloud_lxc.get_settings_for_vm", cn, vm)
    keys = ("ip", "mac", "password", "ssh_reverse_proxy_port", "snmp_reverse_proxy_port")
    same = all(first[k] == again[k] for k in keys)
    print(f"second call returns the same {', '.join(keys)}: {same}")
    target = _run(conf, "mc_cloud_compute_node.get_settings_for_target", cn)
    print(json.dumps({k: target[k] for k in ("target", "domains", "vms")}, indent=2, sort_keys=True))
    print(f"store: {os.path.join(root_store(base), 'registry.sqlite')}")
    return 0 if same else 1


def root_store(base: str) -> str:
    """Store directory of a configuration written by :func:`write_masterless_config`."""
    return os.path.join(base, "pillar", "cloud-controller")


def inventory(args: argparse.Namespace) -> int:
    """Prints the inventory of a store, with VM settings from a pillar file."""
    import yaml

    pillar: dict[str, Any] = {}
    for path in args.pillar or []:
        with open(path) as f:
            pillar.update(yaml.safe_load(f) or {})
    cfg = mccloud.Config({"minion_id": args.id, "mastersalt": True}, saltsupport.cloud_pillar(pillar))
    reg = mccloud.Registry(cfg, args.store)
    print(json.dumps(reg.inventory(), indent=2, sort_keys=True))
    return 0


def _salt_opts(args: argparse.Namespace) -> dict[str, Any]:
    """The minion options of the Salt configuration in ``--config`` (default
    ``$MASTERSALT_CONFIG_DIR`` or /etc/mastersalt)."""
    conf = args.config or os.environ.get(saltsupport.MASTERSALT_ENV) or DEFAULT_MASTERSALT_DIR
    minion = os.path.join(conf, "minion")
    if not os.path.isfile(minion):
        raise mccloud.NotFoundError(
            f"no Salt configuration at {minion}: give the store directory with --store, "
            f"or the configuration directory with --config"
        )
    return saltcompat.minion_config(minion)


def store_dir_of(args: argparse.Namespace) -> str:
    """The store: ``--store`` (a directory or a PostgreSQL database), else
    ``$MCCLOUD_STORE`` (PostgreSQL), else ``$MCCLOUD_STORE_DIR``, else the
    one the Salt configuration in ``--config`` (default
    ``$MASTERSALT_CONFIG_DIR`` or /etc/mastersalt) resolves to, as
    ``mastersalt-call`` would."""
    if args.store:
        return str(args.store)
    for env in (saltsupport.DB_ENV, saltsupport.STORE_ENV):
        if os.environ.get(env):
            return os.environ[env]
    opts = _salt_opts(args)
    return saltsupport.store_location(opts, saltsupport.config(opts, {}))


def store_backup(args: argparse.Namespace) -> int:
    """Copies the store consistently to ``args.dest`` (must not exist)."""
    reg = mccloud.Registry(mccloud.Config({}, {}), store_dir_of(args))
    reg.backup(args.dest)
    print(f"backed up {reg.store_path} to {args.dest}")
    return 0


def store_check(args: argparse.Namespace) -> int:
    """Prints the store's integrity check, schema version and identity;
    non-zero when the integrity check finds a problem."""
    report = mccloud.Registry(mccloud.Config({}, {}), store_dir_of(args)).check()
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0 if report["integrity"] == "ok" else 1


def store_migrate(args: argparse.Namespace) -> int:
    """Copies the SQLite store (``--store``, else ``$MCCLOUD_STORE_DIR``, else
    the store directory of the Salt configuration, a PostgreSQL
    ``mccloud_store`` set there notwithstanding) into the empty PostgreSQL
    database ``--to``. VMs that only the historical store beside it holds
    are imported first, for the nodes the pillar (``--pillar``) declares."""
    import yaml

    pillar: dict[str, Any] = {}
    for path in args.pillar or []:
        pillar.update(_yaml_file(path, yaml))
    source = args.store or os.environ.get(saltsupport.STORE_ENV)
    if not source:
        opts = _salt_opts(args)
        source = saltsupport.store_dir(opts, saltsupport.config(opts, {}))
    cfg = mccloud.Config({"minion_id": args.id, "mastersalt": True}, saltsupport.cloud_pillar(pillar))
    reg = mccloud.Registry(cfg, source)
    print(f"copying {reg.store_path} to {mccloud.Registry(cfg, args.to).store_path} …", file=sys.stderr)
    counts = reg.migrate_to(args.to)
    total = sum(counts.values())
    print(f"copied {total} rows, compared row by row: " + ", ".join(f"{t} {n}" for t, n in sorted(counts.items())))
    return 0


def _pillar_of(args: argparse.Namespace) -> dict[str, Any]:
    """The pillar: the YAML files of ``--pillar`` merged in order, else the
    controller's own, compiled by Salt from the configuration in
    ``--config`` (default ``$MASTERSALT_CONFIG_DIR`` or /etc/mastersalt) as
    ``mastersalt-call`` would."""
    import yaml

    if args.pillar:
        pillar: dict[str, Any] = {}
        for path in args.pillar:
            pillar.update(_yaml_file(path, yaml))
        return pillar
    opts = _salt_opts(args)
    opts["grains"] = saltcompat.grains(opts)
    compiled = saltcompat.compile_pillar(opts, opts["grains"], opts["id"], saltenv=opts.get("saltenv"))
    errors = compiled.get("_errors") if isinstance(compiled, dict) else None
    if errors:
        raise mccloud.InvalidInputError("the pillar does not compile: " + "; ".join(map(str, errors)))
    return dict(compiled)


def _registry_arguments(p: argparse.ArgumentParser, pillar: bool = True) -> None:
    """The options naming the registry a command reads: its store and, when
    ``pillar``, the pillar declaring the nodes (see :func:`_registry_of`)."""
    p.add_argument("--store", help="the store directory, or a PostgreSQL database (postgresql://…); "
                   "default: as mastersalt-call resolves it")
    p.add_argument("--config", help="Salt configuration directory (default: $MASTERSALT_CONFIG_DIR "
                   "or /etc/mastersalt)")
    if not pillar:
        return
    p.add_argument("--pillar", action="append", help="YAML pillar file(s) declaring the compute nodes and VMs "
                   "(default: the controller's pillar, compiled by Salt from --config)")
    p.add_argument("--id", default="controller", help="controller minion id")


def _registry_of(args: argparse.Namespace) -> mccloud.Registry:
    """The registry of the options of :func:`_registry_arguments`."""
    cfg = mccloud.Config({"minion_id": args.id, "mastersalt": True}, saltsupport.cloud_pillar(_pillar_of(args)))
    return mccloud.Registry(cfg, store_dir_of(args), saltsupport.caller({}, f"mccloud {args.command}"))


def _table(rows: list[list[str]], header: list[str]) -> str:
    """``rows`` under ``header``, in aligned columns."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows])


def drift(args: argparse.Namespace) -> int:
    """Prints where the registry drifted from the pillar (see
    ``mastersalt-run mc_cloud.drift``): 0 when clean, 2 on drift, 1 when a
    node could not be checked."""
    out = _registry_of(args).drift(args.target)
    if args.output == "json":
        print(json.dumps(out, indent=2, sort_keys=True))
        return int(out["retcode"])

    def shown(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    findings = out["findings"]
    if findings:
        print(_table([[f["node"], f["vm"], f["kind"], shown(f["expected"]), shown(f["found"])] for f in findings],
                     ["NODE", "VM", "KIND", "EXPECTED", "FOUND"]))
    for cn, why in sorted(out["errors"].items()):
        print(f"compute node {cn} not checked: {why}", file=sys.stderr)
    checked = len(out["nodes"]) - len(out["errors"])
    print(f"{len(findings)} finding(s) on {checked} compute node(s) checked" if findings
          else f"no drift on {checked} compute node(s) checked", file=sys.stderr)
    return int(out["retcode"])


def repair(args: argparse.Namespace) -> int:
    """Plans (with ``--apply``, carries out) the repair of the drift between
    the registry and the pillar (see ``mastersalt-run mc_cloud.repair``;
    minion keys need the master: use the runner for them): 0 when nothing is
    left to do, 2 when steps wait or were only planned, 1 on an error."""
    out = _registry_of(args).repair(args.target, args.apply, args.force, args.after)
    if args.output == "json":
        print(json.dumps(out, indent=2, sort_keys=True))
        return int(out["retcode"])
    steps = out["steps"]
    if steps:
        def done(s: dict[str, Any]) -> str:
            d = s.get("done")
            return "" if d is None else d if isinstance(d, str) else json.dumps(d, sort_keys=True)

        print(_table([[s["node"], s["vm"], s["kind"], s["action"], f"{s['seen']}/{out['after']}",
                       "yes" if s["ready"] else "no", done(s)] for s in steps],
                     ["NODE", "VM", "KIND", "ACTION", "SEEN", "READY", "DONE"]))
    for cn, why in sorted(out["errors"].items()):
        print(f"compute node {cn} not checked: {why}", file=sys.stderr)
    what = "applied" if out["applied"] else "planned (--apply carries it out)"
    print(f"{len(steps)} step(s) {what}" if steps else "nothing to repair", file=sys.stderr)
    return int(out["retcode"])


def audit(args: argparse.Namespace) -> int:
    """Prints the audit journal's entries (see ``mastersalt-run
    mc_cloud.audit``), oldest first: every allocation, free, move, secret
    created or forgotten (never its value), key seeded or deleted, repair."""
    reg = mccloud.Registry(mccloud.Config({}, {}), store_dir_of(args))
    entries = reg.audit(vm=args.vm, node=args.node, kind=args.kind, since=args.since, limit=args.limit)
    if args.output == "json":
        print(json.dumps(entries, indent=2, sort_keys=True))
        return 0
    if entries:
        def shown(values: dict[str, Any] | None) -> str:
            return " ".join(f"{k}={v}" for k, v in (values or {}).items())

        print(_table([[e["at"], e["caller"], e["kind"], e["node"], e["vm"], ",".join(e["what"]),
                       shown(e["before"]), shown(e["after"])] for e in entries],
                     ["AT", "CALLER", "KIND", "NODE", "VM", "WHAT", "BEFORE", "AFTER"]))
    print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}", file=sys.stderr)
    return 0


def metrics(args: argparse.Namespace) -> int:
    """Prints the registry's figures in the Prometheus text format, or
    writes them to ``--textfile`` for node_exporter's textfile collector
    (replaced at once: a scrape never reads half a file)."""
    if args.textfile and not args.textfile.endswith(".prom"):
        raise mccloud.InvalidInputError(f"--textfile {args.textfile}: node_exporter's textfile collector reads "
                                        "only files named *.prom")
    text = _registry_of(args).metrics()
    if not args.textfile:
        sys.stdout.write(text)
        return 0
    target = os.path.abspath(args.textfile)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".mccloud-", suffix=".tmp", dir=os.path.dirname(target))
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as exc:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise mccloud.MccloudError(f"cannot write {target}: {exc.strerror}") from None
    print(f"wrote {target}", file=sys.stderr)
    return 0


def _yaml_file(path: str, yaml: Any) -> dict[str, Any]:
    """A YAML pillar file's mapping; a clear error for a missing or bad file."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise mccloud.NotFoundError(f"cannot read the pillar file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise mccloud.InvalidInputError(f"the pillar file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise mccloud.InvalidInputError(f"the pillar file {path} must hold a mapping, not {type(data).__name__}")
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mccloud", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="run the registry on the sample pillar (masterless, throw-away)")
    p.add_argument("--dir", help="where to write the throw-away configuration (default: a new temp dir)")
    p.set_defaults(func=demo)
    p = sub.add_parser("sls-root", help="print the directory to add to the master's file_roots")
    p.set_defaults(func=lambda args: print(__import__("mccloud.orchestration").orchestration.sls_root()) or 0)
    p = sub.add_parser("inventory", help="compute nodes, VMs, access info and free capacity")
    p.add_argument("--store", required=True, help="the store directory (…/cloud-controller), or a PostgreSQL "
                   "database (postgresql://user@host/db, or libpq keywords)")
    p.add_argument("--pillar", action="append", help="YAML pillar file(s) declaring the VMs")
    p.add_argument("--id", default="controller", help="controller minion id")
    p.set_defaults(func=inventory)
    p = sub.add_parser("drift", help="where the registry drifted from the pillar (exit 0 clean, 2 drift, 1 error)")
    p.add_argument("target", nargs="?", help="one compute node (default: every node declared or in the store)")
    _registry_arguments(p)
    p.add_argument("--output", "-o", choices=("table", "json"), default="table", help="a table (default) or JSON")
    p.set_defaults(func=drift)
    p = sub.add_parser("repair", help="plan (--apply: carry out) the repair of the drift between the registry "
                       "and the pillar")
    p.add_argument("target", nargs="?", help="one compute node (default: every node declared or in the store)")
    p.add_argument("--apply", action="store_true", help="carry the plan out (default: show it)")
    p.add_argument("--force", action="store_true", help="free leaked allocations now, without waiting for "
                   "consecutive checks")
    p.add_argument("--after", type=int, default=3, help="consecutive checks that must find a leaked allocation "
                   "before it is freed (default: %(default)s)")
    _registry_arguments(p)
    p.add_argument("--output", "-o", choices=("table", "json"), default="table", help="a table (default) or JSON")
    p.set_defaults(func=repair)
    p = sub.add_parser("audit", help="the audit journal: who changed what in the registry, and when")
    p.add_argument("--vm", help="entries of this VM")
    p.add_argument("--node", help="entries on this compute node")
    p.add_argument("--kind", help="entries of this kind (allocated, freed, moved, secret_created, key_seeded, …)")
    p.add_argument("--since", help="entries at or after this UTC date or time (2026-11-26, 2026-11-26T10:00Z)")
    p.add_argument("--limit", type=int, help="only the newest N entries")
    _registry_arguments(p, pillar=False)
    p.add_argument("--output", "-o", choices=("table", "json"), default="table", help="a table (default) or JSON")
    p.set_defaults(func=audit)
    p = sub.add_parser("metrics", help="the registry's figures in the Prometheus text format")
    p.add_argument("--textfile", help="write them to this *.prom file (node_exporter's textfile collector) "
                   "instead of printing them")
    _registry_arguments(p)
    p.set_defaults(func=metrics)
    store = sub.add_parser("store", help="back up or check the registry store").add_subparsers(
        dest="store_command", required=True)
    for name, func, text in (
        ("backup", store_backup, "a consistent copy of the store (safe while others allocate)"),
        ("check", store_check, "integrity check, schema version and identity of the store"),
    ):
        p = store.add_parser(name, help=text)
        if name == "backup":
            p.add_argument("dest", help="the backup file to write (must not exist)")
        _registry_arguments(p, pillar=False)
        p.set_defaults(func=func)
    p = store.add_parser("migrate", help="copy a SQLite store into an empty PostgreSQL database, exactly")
    p.add_argument("--to", required=True, help="the PostgreSQL database (postgresql://user@host/db, or libpq "
                   "keywords); it must hold no registry yet")
    p.add_argument("--store", help="the SQLite store directory to copy; default: $MCCLOUD_STORE_DIR, else "
                   "the store directory of the Salt configuration")
    p.add_argument("--config", help="Salt configuration directory (default: $MASTERSALT_CONFIG_DIR "
                   "or /etc/mastersalt)")
    p.add_argument("--pillar", action="append", help="YAML pillar file(s) declaring the compute nodes and "
                   "VMs (needed when a historical store lies beside the SQLite one)")
    p.add_argument("--id", default="controller", help="controller minion id")
    p.set_defaults(func=store_migrate)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except mccloud.MccloudError as exc:
        print(f"mccloud: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
