"""Publishing and verifying the names of a large compute node in DNS:
prints figures, asserts nothing.

A bind primary (``named``) and its knot secondary (``knotd``), started as
the tests start theirs (``tests/support/dnsservers.py``: loopback, a
temporary directory, a TSIG key made by ``tsig-keygen``, the secondary
NOTIFYed and transferring by signed IXFR/AXFR), serve ``cloud.test.``,
``vms.cloud.test.`` and ``199.10.in-addr.arpa.``. A node of N VMs (default
1,000) has four records per VM: two domains to the node's public address,
the VM's internal name and its PTR. Each run:

1. publishes them all (``mccloud.dns.publish``, nothing owned yet): the
   RFC 2136 updates sent, the seconds until the primary acknowledged the
   last, each nameserver's propagation (from that acknowledgement until it
   answered every name: the verification asks every published RRset of
   both servers), and the whole publication's, start to every name
   answering everywhere;
2. publishes them again, owned: nothing to send (the no-op);
3. removes them all, verified gone on both servers.

The figures (median of the runs) go to ``bench/results.json`` (section
``dns``) and the performance page's DNS table (``bench/results.py``).

Usage: python3 bench/dns.py [--vms N] [--runs N] [--results FILE] [--page FILE] [--no-results]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Python puts this script's directory first on the path, where the
# script's own name would hide dnspython's ``dns``: it goes last.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE), str(HERE.parent)]
from mccloud.dns import publish  # noqa: E402
import results  # noqa: E402  (bench/results.py, beside this script)
from tests.support import dnsservers  # noqa: E402

ZONES = ("cloud.test.", "vms.cloud.test.", "199.10.in-addr.arpa.")
PUBLIC = "203.0.113.5"


def node_records(vms: int) -> list[dict[str, Any]]:
    """Four records per VM of one node: two domains, the internal name, its PTR."""
    out = []
    for n in range(vms):
        vm, ip = f"vm{n:05d}", (n // 250 + 1, n % 250 + 1)
        base = {"ttl": 300, "cn": "node1.cloud.test", "vm": f"{vm}.cloud.test"}
        out += [{**base, "zone": "cloud.test.", "name": f"www.{vm}.cloud.test.", "type": "A", "data": PUBLIC},
                {**base, "zone": "cloud.test.", "name": f"shop.{vm}.cloud.test.", "type": "A", "data": PUBLIC},
                {**base, "zone": "vms.cloud.test.", "name": f"{vm}.vms.cloud.test.", "type": "A",
                 "data": f"10.199.{ip[0]}.{ip[1]}"},
                {**base, "zone": "199.10.in-addr.arpa.", "name": f"{ip[1]}.{ip[0]}.199.10.in-addr.arpa.",
                 "type": "PTR", "data": f"{vm}.vms.cloud.test."}]
    return out


def timed_publish(settings: dict[str, Any], desired: list[dict[str, Any]],
                  owned: list[dict[str, Any]]) -> dict[str, Any]:
    """One publication: its result, the updates sent and the seconds until
    the last was acknowledged."""
    updates: list[float] = []
    start = time.monotonic()

    def progress(event: dict[str, Any]) -> None:
        if event["step"] == "update":
            updates.append(time.monotonic() - start)

    out = publish(settings, desired, owned, progress=progress)
    return {**out, "updates": len(updates), "acknowledged_s": updates[-1] if updates else 0.0}


def one_run(primary: dnsservers.Bind, records: list[dict[str, Any]]) -> dict[str, Any]:
    assert primary.secondary is not None
    settings = primary.settings(nameservers=[primary, primary.secondary], timeout=60.0, zones=ZONES)
    first = timed_publish(settings, records, [])
    assert len(first["published"]) == len(records) and not first["foreign"], "the publication was not whole"
    again = timed_publish(settings, records, first["published"])
    assert not again["published"] and again["kept"] == len(records), "the second publication was not a no-op"
    gone = timed_publish(settings, [], first["published"])
    assert len(gone["removed"]) == len(records), "the removal was not whole"
    names = [primary.address, primary.secondary.address]
    return {"updates": first["updates"], "acknowledged_s": first["acknowledged_s"], "answered_s": first["seconds"],
            "verified": [first["verified"][n] for n in names], "noop_s": again["seconds"],
            "noop_updates": again["updates"], "remove_updates": gone["updates"], "remove_s": gone["seconds"]}


def median(runs: list[dict[str, Any]], key: str, index: int | None = None) -> float:
    return round(statistics.median(r[key] if index is None else r[key][index] for r in runs), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vms", type=int, default=1000, help="VMs of the node (default: %(default)s)")
    ap.add_argument("--runs", type=int, default=3, help="runs, the median shown (default: %(default)s)")
    ap.add_argument("--results", default=str(results.RESULTS),
                    help="the results file the performance page's figures come from (default: %(default)s)")
    ap.add_argument("--page", default=str(results.PAGE), help="the page rendered (default: %(default)s)")
    ap.add_argument("--no-results", action="store_true", help="print only: leave the results file and the page")
    args = ap.parse_args()
    records = node_records(args.vms)
    print(f"DNS publication on {os.cpu_count()} cores, Python {sys.version.split()[0]}: a node of {args.vms:,} VMs, "
          f"{len(records):,} records, bind primary and knot secondary")
    runs = []
    with dnsservers.bind_pair(ZONES) as primary:
        for i in range(args.runs):
            runs.append(one_run(primary, records))
            r = runs[-1]
            print(f"run {i + 1}: {r['updates']} updates acknowledged in {r['acknowledged_s']:.2f} s; every name "
                  f"answering on the primary {r['verified'][0]:.2f} s later, on the secondary "
                  f"{r['verified'][1]:.2f} s later: {r['answered_s']:.2f} s in all; no-op {r['noop_s']:.2f} s "
                  f"({r['noop_updates']} updates); removal {r['remove_s']:.2f} s ({r['remove_updates']} updates)")
    section = {"vms": args.vms, "records": len(records), "rrsets": len(records), "runs": args.runs,
               "updates": runs[0]["updates"], "acknowledged_s": median(runs, "acknowledged_s"),
               "primary_s": median(runs, "verified", 0), "secondary_s": median(runs, "verified", 1),
               "answered_s": median(runs, "answered_s"),
               "noop_s": median(runs, "noop_s"), "noop_updates": runs[0]["noop_updates"],
               "remove_s": median(runs, "remove_s"), "remove_updates": runs[0]["remove_updates"]}
    print(f"median of {args.runs}: every name answering on every nameserver {section['answered_s']:.2f} s after "
          f"the publication started; no-op {section['noop_s']:.2f} s")
    if not args.no_results:
        path = results.record(args.results, {"dns": section}, page=args.page)
        print(f"\nfigures recorded in {path} (commit {results.commit()}); the performance page's DNS table "
              f"rendered from it")


if __name__ == "__main__":
    main()
