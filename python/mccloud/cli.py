"""mccloud: the cloud-controller registry for Salt, from the command line.

The commands read the registry of the controller without Salt's daemons:
the store and the pillar are found as mastersalt-call finds them (the Salt
configuration in --config, default $MASTERSALT_CONFIG_DIR or
/etc/mastersalt; $MCCLOUD_STORE or $MCCLOUD_STORE_DIR name a store), and
--store and --pillar override them. Tables by default; --output json or
yaml gives the whole answer. The Salt side is mastersalt-call and
mastersalt-run (salt-call and salt-run on $MASTERSALT_CONFIG_DIR), also
installed by this package.
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
from mccloud import reports, saltcompat, saltsupport

DEFAULT_MASTERSALT_DIR = "/etc/mastersalt"


def _mastersalt(script: str) -> None:
    conf = os.environ.get(saltsupport.MASTERSALT_ENV) or DEFAULT_MASTERSALT_DIR
    problem = _unreachable(script, conf, sys.argv[1:])
    if problem:
        prog = {"salt_call": "mastersalt-call", "salt_run": "mastersalt-run"}.get(script, "mastersalt")
        sys.stderr.write(f"{prog}: {problem}\n")
        raise SystemExit(2)
    os.environ[saltsupport.MASTERSALT_ENV] = conf
    sys.argv = [sys.argv[0], "-c", conf, *sys.argv[1:]]
    saltcompat.run_script(script)


def _unreachable(script: str, conf: str, argv: Sequence[str]) -> str | None:
    """Why the Salt call ``argv`` on configuration directory ``conf`` would
    hang or fail at once, if it would: no configuration there (Salt would
    then wait for a master named ``salt``), or a master that does not answer
    (``salt-call`` retries it for minutes, saying nothing). None when the
    call can go ahead."""
    if any(a in ("-h", "--help", "--version", "--versions-report", "-V") for a in argv):
        return None
    if any(a in ("-c", "--config-dir") or a.startswith("--config-dir=") for a in argv):
        return None  # the caller names the configuration itself
    name = "minion" if script == "salt_call" else "master"
    path = os.path.join(conf, name)
    if not os.path.isfile(path):
        return (f"no mastersalt configuration: {path} does not exist. Set {saltsupport.MASTERSALT_ENV} to the "
                f"configuration directory (on a controller, {DEFAULT_MASTERSALT_DIR}; ./run demo writes a masterless "
                f"one and prints the line to use it)")
    if script != "salt_call" or "--local" in argv:
        return None
    try:
        opts = saltcompat.minion_config(path)
    except Exception:  # noqa: BLE001 - Salt itself reports a configuration it cannot read
        return None
    master, port = opts.get("master"), opts.get("master_port")
    if opts.get("file_client") == "local" or opts.get("master_type") in ("disable", "failover") \
            or not isinstance(master, str) or not master:
        return None
    import socket

    try:
        socket.create_connection((master, int(port or 4506)), timeout=5).close()
    except (OSError, ValueError) as exc:
        return (f"the master {master}:{port} named in {path} does not answer ({exc}): start it, fix master "
                f"and master_port there, or add --local to run without a master")
    return None


def mastersalt_call() -> None:
    """``salt-call -c $MASTERSALT_CONFIG_DIR …``"""
    _mastersalt("salt_call")


def mastersalt_run() -> None:
    """``salt-run -c $MASTERSALT_CONFIG_DIR …``"""
    _mastersalt("salt_run")


def mastersalt() -> None:
    """``salt -c $MASTERSALT_CONFIG_DIR …`` (publishes to the mastersalt minions)."""
    _mastersalt("salt_main")


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


#: The file that marks a directory as a demo's (so the next demo may replace it).
DEMO_MARK = ".mccloud-demo"


def _fresh_demo_dir(base: str) -> None:
    """Empties ``base`` when a previous demo made it; refuses a directory
    holding anything else."""
    if os.path.isdir(base) and os.listdir(base):
        if not os.path.exists(os.path.join(base, DEMO_MARK)):
            raise mccloud.InvalidInputError(f"{base} exists and is not a previous demo's directory: give a new or "
                                            "empty one with --dir")
        import shutil

        shutil.rmtree(base)
    os.makedirs(base, exist_ok=True)
    with open(os.path.join(base, DEMO_MARK), "w") as f:
        f.write("made by mccloud demo: the next demo replaces this directory\n")


def demo(args: argparse.Namespace) -> int:
    """Runs the registry on the sample pillar through the real
    ``mastersalt-call``, then says how to go on with what it made."""
    base = os.path.abspath(args.dir or os.path.join(tempfile.gettempdir(), "mccloud-demo"))
    _fresh_demo_dir(base)
    conf = write_masterless_config(base, sample_pillar())
    print(f"==> a masterless mastersalt configuration with the sample pillar: {conf}", flush=True)
    cn, vm = "devhost10.local", "mysupertest3.foo.com"
    first = _run(conf, "mc_cloud_lxc.get_settings_for_vm", cn, vm)
    print(json.dumps(first, indent=2, sort_keys=True))
    again = _run(conf, "mc_cloud_lxc.get_settings_for_vm", cn, vm)
    keys = ("ip", "mac", "password", "ssh_reverse_proxy_port", "snmp_reverse_proxy_port")
    same = all(first[k] == again[k] for k in keys)
    print(f"second call returns the same {', '.join(keys)}: {same}")
    target = _run(conf, "mc_cloud_compute_node.get_settings_for_target", cn)
    shown = ("target", "domains", "vms")
    print(json.dumps({k: target[k] for k in shown}, indent=2, sort_keys=True))
    print(f"(shortened: {', '.join(shown)} of the {len(target)} keys it returns; the command below prints them all)")
    store = os.path.join(root_store(base), "registry.sqlite")
    bindir = os.path.dirname(sys.executable)
    print(f"""
==> the demo's configuration, pillar and store are in {base}
    (the next demo replaces them; rm -rf {base} removes them)
Go on with them (./run shell opens a shell with these two set):
  export {saltsupport.MASTERSALT_ENV}={conf}
  export PATH={bindir}:$PATH
  mastersalt-call mc_cloud.inventory
  mastersalt-call mc_cloud_compute_node.get_settings_for_target {cn}
  mccloud inventory
  mccloud store check
store: {store}""")
    return 0 if same else 1


def root_store(base: str) -> str:
    """Store directory of a configuration written by :func:`write_masterless_config`."""
    return os.path.join(base, "pillar", "cloud-controller")


def _no_store_warning(reg: mccloud.Registry) -> None:
    """Warns (on stderr) when the store ``reg`` reads does not exist: every
    VM would show no allocation, which a mistyped ``--store`` also gives."""
    path = str(reg.store_path)
    if not mccloud.is_postgres(path) and not os.path.exists(path):
        print(f"mccloud: warning: no store at {path}: nothing is allocated there yet (a mistyped --store? "
              f"mastersalt-call mc_cloud_compute_node.get_settings_for_target <cn> registers a node)",
              file=sys.stderr)


def _emit(data: Any, output: str, table: Any) -> None:
    """``data`` as JSON or YAML, or the table ``table()`` makes."""
    if output == "json":
        print(json.dumps(data, indent=2, sort_keys=True))
    elif output == "yaml":
        import yaml

        print(yaml.safe_dump(data, default_flow_style=False, sort_keys=True), end="")
    else:
        text = table()
        if text:
            print(text)


def inventory(args: argparse.Namespace) -> int:
    """Prints the compute nodes and their VMs: access (ssh through the
    node's reverse proxy), addresses, free IPs and ports, capacity. Exits 1
    when a node's declaration is broken (its ``error`` says why)."""
    reg = _registry_of(args)
    _no_store_warning(reg)
    inv = reg.inventory()
    if args.node:
        missing = [n for n in args.node if n not in inv]
        if missing:
            raise mccloud.NotFoundError(f"no compute node {', '.join(missing)} in the inventory (nodes: "
                                        f"{', '.join(sorted(inv)) or 'none'})")
        inv = {n: v for n, v in inv.items() if n in args.node}
    if args.vm:
        for node in inv.values():
            node["vms"] = {vm: v for vm, v in (node.get("vms") or {}).items() if vm in args.vm}
        found = {vm for node in inv.values() for vm in node["vms"]}
        missing = [vm for vm in args.vm if vm not in found]
        if missing:
            raise mccloud.NotFoundError(f"no VM {', '.join(missing)} in the inventory"
                                        + (f" of {', '.join(args.node)}" if args.node else ""))
        inv = {n: v for n, v in inv.items() if v["vms"]}

    _emit(inv, args.output, lambda: reports.inventory_text(inv))
    if not inv:
        print("no compute node declared or in the store", file=sys.stderr)
    broken = sorted(cn for cn, n in inv.items() if n.get("error"))
    for cn in broken:
        print(f"mccloud: compute node {cn}: {inv[cn]['error']}", file=sys.stderr)
    return 1 if broken else 0


def sls_root(args: argparse.Namespace) -> int:
    """Prints the directory of mccloud's SLS tree, to add to the master's
    ``file_roots``. When the configuration directory (``--config``, default
    ``$MASTERSALT_CONFIG_DIR`` or /etc/mastersalt) has a master
    configuration, its ``file_roots`` are checked too: a warning (exit 0)
    says when they do not list the tree, or list a makina-states checkout
    before it, which would serve the original SLS of the same names."""
    from mccloud import orchestration

    print(orchestration.sls_root())
    conf = args.config or os.environ.get(saltsupport.MASTERSALT_ENV) or DEFAULT_MASTERSALT_DIR
    master = os.path.join(conf, "master")
    if os.path.isfile(master):
        for warning in orchestration.sls_served(saltcompat.master_config(master).get("file_roots")):
            print(f"mccloud sls-root: warning: {master}: {warning}", file=sys.stderr)
    return 0


def api_config(args: argparse.Namespace) -> int:
    """Prints the master configuration that serves mccloud's API and web
    page with salt-api (the runner client only, ``rest_mccloud`` on
    loopback with TLS, the page's installed path as ``app:``, LDAP eauth
    with groups, ``mccloud_api``): paste it into the master's configuration
    (e.g. ``master.d/mccloud-api.conf``), adapt the LDAP lines, then start
    ``salt-api``."""
    from mccloud import web

    print(web.api_config(port=args.port, host=args.host, tls_dir=args.tls_dir, eauth=args.eauth), end="")
    return 0


def _salt_opts(args: argparse.Namespace) -> dict[str, Any]:
    """The minion options of the Salt configuration in ``--config`` (default
    ``$MASTERSALT_CONFIG_DIR`` or /etc/mastersalt)."""
    conf = args.config or os.environ.get(saltsupport.MASTERSALT_ENV) or DEFAULT_MASTERSALT_DIR
    minion = os.path.join(conf, "minion")
    if not os.path.isfile(minion):
        raise mccloud.NotFoundError(
            f"no Salt configuration at {minion}: give the configuration directory with --config (or set "
            f"{saltsupport.MASTERSALT_ENV}), or name the store with --store (and the pillar with --pillar)"
        )
    return saltcompat.minion_config(minion)


def store_dir_of(args: argparse.Namespace, postgres: bool = True) -> str:
    """The store: ``--store`` (a directory or a PostgreSQL database), else
    ``$MCCLOUD_STORE`` (PostgreSQL), else ``$MCCLOUD_STORE_DIR``, else the
    one the Salt configuration in ``--config`` (default
    ``$MASTERSALT_CONFIG_DIR`` or /etc/mastersalt) resolves to, as
    ``mastersalt-call`` would (see :func:`mccloud.saltsupport.store_location`;
    without ``postgres``, the SQLite store directory)."""
    named = (saltsupport.DB_ENV, saltsupport.STORE_ENV) if postgres else (saltsupport.STORE_ENV,)
    opts = {} if args.store or any(os.environ.get(env) for env in named) else _salt_opts(args)
    return saltsupport.store_location(opts, args.store, postgres)


def _read_store_of(args: argparse.Namespace) -> str:
    """:func:`store_dir_of` for a command that reads the store: a
    ``--store`` directory that does not exist is an error (a mistyped
    name would otherwise read as an empty registry)."""
    store = store_dir_of(args)
    if args.store and not mccloud.is_postgres(store) and not os.path.isdir(store):
        why = "Not a directory" if os.path.exists(store) else "No such file or directory"
        raise mccloud.NotFoundError(f"cannot open store '{store}': {why}")
    return store


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The options :func:`mccloud.saltsupport.open_registry` takes for this
    command: the controller (``--id``) on mastersalt, seen as its master's
    runners see it (it reads and makes placements)."""
    return {"__role": "master", "mccloud_controller_id": getattr(args, "id", ""), "mccloud_mastersalt": True}


def _key_of(args: argparse.Namespace, pillar: dict[str, Any]) -> str | None:
    """The key file of the store's secrets, as ``mastersalt-call`` finds it:
    ``--key`` (where the command has it), else ``$MCCLOUD_STORE_KEY``, else
    what the Salt configuration in ``--config`` says
    (:func:`mccloud.saltsupport.store_key`), else ``mccloud-store.key`` in
    the ``ssl_pillar_dir`` its ``pillar_roots`` and ``pillar`` make; None
    without a Salt configuration (the core's default)."""
    if getattr(args, "key", None):
        return str(args.key)
    if os.environ.get(saltsupport.KEY_ENV):
        return os.environ[saltsupport.KEY_ENV]
    try:
        opts = _salt_opts(args)
    except mccloud.NotFoundError:
        return None
    ctx = saltsupport.context(opts, pillar)
    if ctx.get("store_key"):
        return str(ctx["store_key"])
    ssl_dir = mccloud.Config(ctx, saltsupport.cloud_pillar(pillar)).cloud_settings()["ssl_pillar_dir"]
    return os.path.join(str(ssl_dir), "mccloud-store.key")


def _store_registry(args: argparse.Namespace, via: str | None = None, reads: bool = True) -> mccloud.Registry:
    """The registry of the store alone (no pillar: the store commands and
    the audit journal), its changes journaled as made by ``via`` (default:
    the command, as in ``mccloud repair (alice)``). ``reads``: the command
    reads the store (see :func:`_read_store_of`); the store commands say
    themselves that there is none."""
    store = _read_store_of(args) if reads else store_dir_of(args)
    return saltsupport.open_registry(_options(args), {}, via or f"mccloud {args.command}", store=store,
                                     store_key=_key_of(args, {}))


def store_backup(args: argparse.Namespace) -> int:
    """Copies the store consistently to ``args.dest`` (must not exist)."""
    reg = _store_registry(args, reads=False)
    reg.backup(args.dest)
    print(f"backed up {reg.store_path} to {args.dest}")
    return 0


def store_check(args: argparse.Namespace) -> int:
    """Prints the store's integrity check, schema version and identity (and
    a PostgreSQL store's ownership: whose its schema is, what it grants);
    non-zero when a check finds a problem."""
    report = _store_registry(args, reads=False).check()
    _emit(report, args.output, lambda: "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v)}"
                                                  for k, v in sorted(report.items())))
    ownership = str(report.get("ownership", "ok"))
    return 0 if report["integrity"] == "ok" and ownership.startswith("ok") else 1


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
    via = f"mccloud {args.command}"
    reg = saltsupport.open_registry(_options(args), pillar, via, place="declared",
                                    store=store_dir_of(args, postgres=False), store_key=_key_of(args, pillar))
    # Named only (the target is not opened before the copy: a refused
    # migration leaves the database untouched).
    target = saltsupport.open_registry(_options(args), {}, via, place="declared", store=args.to)
    print(f"copying {reg.store_path} to {target.store_path} …", file=sys.stderr)
    counts = reg.migrate_to(args.to)
    total = sum(counts.values())
    print(f"copied {total} rows, compared row by row: " + ", ".join(f"{t} {n}" for t, n in sorted(counts.items())))
    return 0


def store_rekey(args: argparse.Namespace) -> int:
    """Makes a new key for the store's secrets (root passwords, crypt salts,
    the CA shared through a PostgreSQL store) and seals every secret again
    under it, in one transaction; the new key then replaces the key file.
    The key file is ``--key``, else ``$MCCLOUD_STORE_KEY``, else the
    ``mccloud_store_key`` option of the Salt configuration, else
    ``mccloud-store.key`` in the ``ssl_pillar_dir`` directory (of its
    ``pillar_roots``, or of ``--pillar`` when it sets one). Copy the new key to every other
    controller of a PostgreSQL store, and keep it with the backups made
    from now on (those made before need the old key)."""
    import yaml

    pillar: dict[str, Any] = {}
    for path in args.pillar or []:
        pillar.update(_yaml_file(path, yaml))
    reg = saltsupport.open_registry(_options(args), pillar, f"mccloud {args.command}", place="declared",
                                    store=_read_store_of(args), store_key=_key_of(args, pillar))
    print(f"sealing the secrets of {reg.store_path} under a new key (key file {reg.key_file}) …", file=sys.stderr)
    done = reg.rekey()
    _emit(done, args.output, lambda: (
        f"rekeyed {reg.store_path}: key {done['old_key']} replaced by {done['new_key']}; {done['values']} "
        f"passwords and salts and {done['files']} shared files sealed again in {done['seconds']:.2f} s.\n"
        f"The new key is in {done['key_file']}: copy it to every other controller of the store, and keep it "
        f"with the backups made from now on."))
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
    """The registry of the options of :func:`_registry_arguments`. VMs
    declared without a node are on the node the store placed them on, as
    mastersalt-call sees them (placing those left, as the controller
    does); a store that does not exist yet is not created for that."""
    pillar = _pillar_of(args)
    return saltsupport.open_registry(_options(args), pillar, f"mccloud {args.command}",
                                     place="existing", store=_read_store_of(args), store_key=_key_of(args, pillar))


def _print_report(table: str, notes: Sequence[str]) -> None:
    """A report's table (if any) on standard output, its notes on standard error."""
    if table:
        print(table)
    for line in notes:
        print(line, file=sys.stderr)


def drift(args: argparse.Namespace) -> int:
    """Prints where the registry drifted from the pillar (see
    ``mastersalt-run mc_cloud.drift``): 0 when clean, 2 on drift, 1 when a
    node could not be checked."""
    out = _registry_of(args).drift(args.target)
    if args.output != "table":
        _emit(out, args.output, str)
        return int(out["retcode"])
    _print_report(reports.DRIFT.text(out["findings"]), reports.drift_notes(out))
    return int(out["retcode"])


def repair(args: argparse.Namespace) -> int:
    """Plans (with ``--apply``, carries out) the repair of the drift between
    the registry and the pillar (see ``mastersalt-run mc_cloud.repair``).
    The command line cannot ask the nodes for their guests nor the masters
    for their minions, so it registers what is declared and never
    destroys: leaked allocations and orphan keys are freed by the runner.
    0 when nothing is left to do, 2 when steps wait or were only planned,
    1 on an error."""
    window = None if args.window is None else _window(args.window)
    out = _registry_of(args).repair(args.target, args.apply, False, window, None, None)
    if args.output != "table":
        _emit(out, args.output, str)
        return int(out["retcode"])
    _print_report(reports.REPAIR.text(out["steps"]), reports.repair_notes(out))
    return int(out["retcode"])


def _window(text: str) -> int:
    """``--window`` as seconds."""
    try:
        return int(mccloud.duration_secs(text))
    except mccloud.MccloudError as exc:
        raise mccloud.ArgumentError(f"--window {text}: {exc}") from None


def audit(args: argparse.Namespace) -> int:
    """Prints the audit journal's entries (see ``mastersalt-run
    mc_cloud.audit``), oldest first: every allocation, free, move, secret
    created or forgotten (never its value), key seeded or deleted, repair."""
    if args.audit_command == "prune":
        return audit_prune(args)
    reg = _store_registry(args)
    entries = reg.audit(vm=args.vm, node=args.node, kind=args.kind, since=args.since, limit=args.limit)
    if args.output != "table":
        _emit(entries, args.output, str)
        return 0
    _print_report(reports.AUDIT.text(entries), reports.audit_notes(entries))
    return 0


def audit_prune(args: argparse.Namespace) -> int:
    """Deletes the audit journal's entries written before ``--before`` (a
    UTC date or time) and says how many went; the prune itself is noted in
    the journal (``journal_pruned``). The change counters of ``mccloud
    metrics`` keep the entries pruned (Prometheus counters never go down)."""
    reg = _store_registry(args, "mccloud audit prune")
    removed = reg.prune_journal(args.before)
    out = {"removed": removed, "before": args.before}
    _emit(out, args.output, lambda: f"removed {removed} entr{'y' if removed == 1 else 'ies'} written before "
                                    f"{args.before} from the audit journal of {reg.store_path}")
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


def dns(args: argparse.Namespace) -> int:
    """The names of the compute nodes and VMs in DNS (pillar
    makina-states.cloud.dns), as mastersalt-run mc_cloud.dns tells and
    pushes them: plan (what a push would publish and remove; no nameserver
    asked), show (the records the store says mccloud published), push
    (publish them, remove those no longer planned, wait until every
    nameserver serves the changes). Exit codes: 0 done, 1 an error."""
    from mccloud import dnscmd

    return dnscmd.dns(args, _registry_of)


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


def version() -> str:
    """``mccloud <version> (Salt <version>, Python <version>)``."""
    from importlib import metadata
    import platform

    def of(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"mccloud {of('mccloud')} (Salt {of('salt')}, Python {platform.python_version()})"


def _output(p: argparse.ArgumentParser, default: str = "table") -> None:
    """``--output``/``-o``: a table, JSON or YAML."""
    p.add_argument("--output", "-o", choices=("table", "json", "yaml"), default=default,
                   help="a table (the default), or the whole answer as JSON or YAML")


def _audit_parser(p: argparse.ArgumentParser) -> None:
    """The options of ``mccloud audit`` and its ``prune`` subcommand."""
    fmt = argparse.RawDescriptionHelpFormatter
    p.add_argument("--vm", help="entries of this VM")
    p.add_argument("--node", help="entries on this compute node")
    p.add_argument("--kind", help="entries of this kind (allocated, freed, moved, secret_created, key_seeded, …)")
    p.add_argument("--since", help="entries at or after this UTC date or time (2026-11-26, 2026-11-26T10:00Z)")
    p.add_argument("--limit", type=int, help="only the newest N entries")
    _registry_arguments(p, pillar=False)
    _output(p)
    audits = p.add_subparsers(dest="audit_command", metavar="prune", required=False)
    # Options left out keep the values given before "prune" (or their defaults).
    p = audits.add_parser("prune", help="delete the entries written before a date", formatter_class=fmt,
                          description=" ".join((audit_prune.__doc__ or "").split()),
                          epilog="examples:\n  mccloud audit prune --before 2026-01-01\n"
                                 "  mccloud audit prune --before 2026-11-26T10:00Z -o json",
                          argument_default=argparse.SUPPRESS)
    p.add_argument("--before", required=True, help="delete the entries written before this UTC date or time "
                   "(2026-01-01, 2026-01-01T10:00Z)")
    _registry_arguments(p, pillar=False)
    _output(p, default=argparse.SUPPRESS)


def _store_parser(store: argparse.ArgumentParser) -> None:
    """The subcommands of ``mccloud store``: backup, check, rekey and migrate."""
    fmt = argparse.RawDescriptionHelpFormatter
    output = _output
    stores = store.add_subparsers(dest="store_command", required=True, metavar="STORE_COMMAND")
    for name, func, text, example in (
        ("backup", store_backup, "a consistent copy of the store (safe while others allocate)",
         "  mccloud store backup /root/registry-$(date +%F).sqlite"),
        ("check", store_check, "integrity check, schema version and identity of the store",
         "  mccloud store check\n  mccloud store check --store postgresql://mccloud@db/mccloud -o json"),
    ):
        p = stores.add_parser(name, help=text, description=" ".join((func.__doc__ or text).split()),
                              formatter_class=fmt, epilog=f"examples:\n{example}")
        p.set_defaults(func=func)
        if name == "backup":
            p.add_argument("dest", help="the backup file to write (must not exist)")
        else:
            output(p)
        _registry_arguments(p, pillar=False)
    p = stores.add_parser("rekey", help="a new key for the store's secrets, every secret sealed again under it",
                          description=" ".join((store_rekey.__doc__ or "").split()), formatter_class=fmt,
                          epilog="examples:\n  mccloud store rekey\n"
                          "  mccloud store rekey --store postgresql://mccloud@db/mccloud --key /srv/mastersalt-pillar/"
                          "cloud-controller/ssl/mccloud-store.key")
    p.set_defaults(func=store_rekey)
    p.add_argument("--key", help="the key file (default: $MCCLOUD_STORE_KEY, else mccloud_store_key, else "
                   "mccloud-store.key beside the CA, in ssl_pillar_dir)")
    p.add_argument("--pillar", action="append", help="YAML pillar file(s) (read for ssl_pillar_dir only)")
    p.add_argument("--id", default="controller", help="controller minion id")
    output(p)
    _registry_arguments(p, pillar=False)
    p = stores.add_parser("migrate", help="copy a SQLite store into an empty PostgreSQL database, exactly",
                          description=" ".join((store_migrate.__doc__ or "").split()), formatter_class=fmt,
                          epilog="examples:\n  mccloud store migrate --to postgresql://mccloud@db.example.net/mccloud")
    p.set_defaults(func=store_migrate)
    p.add_argument("--to", required=True, help="the PostgreSQL database (postgresql://user@host/db, or libpq "
                   "keywords); it must hold no registry yet")
    p.add_argument("--store", help="the SQLite store directory to copy; default: $MCCLOUD_STORE_DIR, else "
                   "the store directory of the Salt configuration")
    p.add_argument("--config", help="Salt configuration directory (default: $MASTERSALT_CONFIG_DIR "
                   "or /etc/mastersalt)")
    p.add_argument("--pillar", action="append", help="YAML pillar file(s) declaring the compute nodes and "
                   "VMs (needed when a historical store lies beside the SQLite one)")
    p.add_argument("--id", default="controller", help="controller minion id")


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="mccloud", description=__doc__, formatter_class=fmt)
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    output = _output

    def command(name: str, func: Any, summary: str, examples: str = "", **kw: Any) -> argparse.ArgumentParser:
        doc = " ".join((func.__doc__ or summary).split())
        p = sub.add_parser(name, help=summary, description=doc, formatter_class=fmt,
                           epilog=f"examples:\n{examples}" if examples else None, **kw)
        p.set_defaults(func=func)
        return p

    p = command("demo", demo, "run the registry on the sample pillar (masterless, no LXC)",
                "  mccloud demo --dir ./demo")
    p.add_argument("--dir", help="where to write the configuration, pillar and store (default: "
                   "<tmp>/mccloud-demo; a previous demo there is replaced)")
    p = command("sls-root", sls_root, "print the directory to add to the master's file_roots",
                "  mccloud sls-root\n  mccloud sls-root --config /etc/salt")
    p.add_argument("--config", help="Salt configuration directory whose master's file_roots are checked "
                   "(default: $MASTERSALT_CONFIG_DIR or /etc/mastersalt)")
    p = command("api-config", api_config, "print the master configuration serving the API and its web page",
                "  mccloud api-config > /etc/salt/master.d/mccloud-api.conf\n"
                "  mccloud api-config --port 8443 --eauth pam")
    p.add_argument("--host", default="127.0.0.1", help="address salt-api listens on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="its port (default: 8000)")
    p.add_argument("--tls-dir", default="/etc/salt/pki/api", help="directory of api.crt and api.key "
                   "(default: /etc/salt/pki/api)")
    p.add_argument("--eauth", default="ldap", choices=("ldap", "pam", "file"),
                   help="the external_auth backend users log in with (default: ldap)")
    p = command("inventory", inventory, "compute nodes, their VMs, access and free capacity",
                "  mccloud inventory\n  mccloud inventory --node devhost10.local -o yaml\n"
                "  mccloud inventory --store /srv/pillar/cloud-controller --pillar cloud.sls --vm web1.example.com")
    p.add_argument("--node", action="append", help="only this compute node (repeatable)")
    p.add_argument("--vm", action="append", help="only this VM (repeatable)")
    _registry_arguments(p)
    output(p)
    p = command("drift", drift, "where the registry drifted from the pillar (exit 0 clean, 2 drift, 1 error)",
                "  mccloud drift\n  mccloud drift devhost10.local -o json")
    p.add_argument("target", nargs="?", help="one compute node (default: every node declared or in the store)")
    _registry_arguments(p)
    output(p)
    p = command("repair", repair, "plan (--apply: carry out) the repair of the drift",
                "  mccloud repair\n  mccloud repair devhost10.local --apply")
    p.add_argument("target", nargs="?", help="one compute node (default: every node declared or in the store)")
    p.add_argument("--apply", action="store_true", help="carry the plan out (default: show it)")
    p.add_argument("--window", help="how long applying checks must see a leak before the runner frees it "
                   "(seconds, or 30m, 24h, 7d; default: pillar makina-states.cloud.repair.window, else 24h)")
    _registry_arguments(p)
    output(p)
    _audit_parser(command("audit", audit, "the audit journal: who changed what in the registry, and when",
                          "  mccloud audit --vm web1.example.com\n  mccloud audit --kind freed --since 2026-11-01 -o json\n"
                          "  mccloud audit prune --before 2026-01-01"))
    p = command("metrics", metrics, "the registry's figures in the Prometheus text format",
                "  mccloud metrics\n  mccloud metrics --textfile /var/lib/node_exporter/mccloud.prom")
    p.add_argument("--textfile", help="write them to this *.prom file (node_exporter's textfile collector) "
                   "instead of printing them")
    _registry_arguments(p)
    from mccloud import dnscmd

    p = command("dns", dns, "the names in DNS: plan, show or push them (makina-states.cloud.dns)",
                "  mccloud dns plan\n  mccloud dns show --target devhost10.local -o json\n  mccloud dns push")
    def dns_options(sp: argparse.ArgumentParser) -> None:
        _registry_arguments(sp)
        output(sp)

    dnscmd.add_parser(p, dns_options)
    _store_parser(command("store", lambda args: 0, "back up, check, rekey or migrate the registry's store"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``mccloud``: parses ``argv`` and runs the command. Exit codes: 0 done,
    1 an error (what, where, what to do, on stderr; no traceback), 2 a
    command line argparse refuses; drift and repair also use 2 for drift
    found or steps left."""
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except mccloud.MccloudError as exc:
        print(f"mccloud {args.command}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"mccloud {args.command}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - Salt's own errors (a pillar that does not render…)
        if type(exc).__module__.startswith("salt."):
            print(f"mccloud {args.command}: Salt: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    raise SystemExit(main())
