"""``mccloud dns``: the names of the compute nodes and VMs in DNS, from
the command line (see ``mastersalt-run mc_cloud.dns``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

import mccloud
from mccloud import reports


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def dns(args: argparse.Namespace, registry_of: Callable[[argparse.Namespace], mccloud.Registry]) -> int:
    """``plan``: what a push would publish and remove (the pillar and the
    store, no nameserver asked); ``show``: the records the store says
    mccloud published; ``push``: publishes them, removes those no longer
    planned and waits until every nameserver serves the changes. Exit
    codes: 0 done, 1 an error (a nameserver not serving the changes in
    time, a key refused: named on stderr)."""
    from mccloud.orchestration import dnspub

    reg = registry_of(args)
    target = args.target
    if args.dns_command == "push":
        out = dnspub.push(reg, target, _say)
        if args.output != "table":
            print(_dump(out, args.output))
        else:
            for w in out.get("warnings") or []:
                _say(f"warning: {w}")
            print(out.get("summary") or out["comment"], file=sys.stdout if out["result"] else sys.stderr)
        return int(out["retcode"])
    out = dnspub.plan(reg, target) if args.dns_command == "plan" else dnspub.show(reg, target)
    if args.output != "table":
        print(_dump(out, args.output))
        return 0
    table = reports.DNS.text(reports.dns_rows(out))
    if table:
        print(table)
    for line in reports.dns_notes(out):
        print(line, file=sys.stderr)
    return 0


def _dump(data: Any, output: str) -> str:
    if output == "json":
        return json.dumps(data, indent=2, sort_keys=True)
    import yaml

    return str(yaml.safe_dump(data, default_flow_style=False, sort_keys=True)).rstrip("\n")


def add_parser(p: argparse.ArgumentParser, options: Callable[[argparse.ArgumentParser], None]) -> None:
    """The subcommands of ``mccloud dns`` under ``p``; ``options`` adds
    the registry's and the output's options to each."""
    fmt = argparse.RawDescriptionHelpFormatter
    subs = p.add_subparsers(dest="dns_command", required=True, metavar="DNS_COMMAND")
    for name, text, example in (
        ("plan", "what a push would publish and remove (no nameserver asked)",
         "  mccloud dns plan\n  mccloud dns plan --target devhost10.local -o json"),
        ("show", "the records the store says mccloud published",
         "  mccloud dns show\n  mccloud dns show --target devhost10.local"),
        ("push", "publish every name (or a node's), remove those no longer planned, verify every nameserver",
         "  mccloud dns push\n  mccloud dns push --target devhost10.local"),
    ):
        sp = subs.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".", formatter_class=fmt,
                             epilog=f"examples:\n{example}")
        sp.add_argument("--target", help="one compute node (default: every declared node)")
        options(sp)
