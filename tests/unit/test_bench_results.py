"""The performance page's figures are the rendering of bench/results.json."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_results", ROOT / "bench" / "results.py")
assert spec and spec.loader
results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(results)


def test_the_performance_pages_figures_are_those_of_the_results_file() -> None:
    data = results.load(results.RESULTS)
    assert {"node", "allocations", "binding"} <= set(data), "run ./run bench to record every section"
    assert results.update_page(results.PAGE, data, check=True), (
        "docs/explanation/performance.md's benchmark tables are not bench/results.json's: run python3 bench/results.py")
    for section in data.values():
        assert section["commit"] and section["machine"]["cores"]


def sample(first: float, repeat: float, rates: list[int]) -> dict[str, Any]:
    stamp = {"commit": "abc1234", "date": "2026-11-24", "machine": {"cores": 2, "memory_gib": 24,
                                                                    "python": "3.11.7", "salt": "3007.15"}}
    return {
        "node": {**stamp, "vms": 10000, "runs": 2, "ping_s": 1.0, "target_first_s": 1.0 + first,
                 "target_repeat_s": 1.0 + repeat, "vm_one_s": 1.2},
        "allocations": {**stamp, "prefix": 16, "exhausted_after": 65022, "crypt_ms": 2.5,
                        "levels": [{"filled": i * 8192, "per_s": r, "p50_ms": 0.8, "p99_ms": 1.2}
                                   for i, r in enumerate(rates)]},
        "binding": {**stamp, "vm_settings_us": 2600, "vm_settings_fresh_us": 3100, "peak_rss_mib": 101},
    }


@pytest.mark.parametrize("first,repeat,rates,verdicts", [
    (1.2, 0.4, [1100, 1200], ["≤ +1.5 s (met)", "≤ +0.5 s (met)", "(met)"]),
    (9.4, 3.7, [700, 1300, 1074], ["≤ +1.5 s (missed)", "≤ +0.5 s (missed)", "(met past the first thousand)"]),
    (1.5, 0.6, [700, 900], ["≤ +1.5 s (met)", "≤ +0.5 s (missed)", "per second (missed)"]),
])
def test_the_table_says_which_goals_are_met(first: float, repeat: float, rates: list[int],
                                            verdicts: list[str]) -> None:
    table = results.render(sample(first, repeat, rates))
    for verdict in verdicts:
        assert verdict in table
    assert "commit abc1234, 2026-11-24, 2 cores, 24 GiB, Python 3.11.7, salt 3007.15" in table


def test_recording_a_section_keeps_the_others_and_renders_the_readme(tmp_path: Path) -> None:
    path, readme = tmp_path / "results.json", tmp_path / "README.md"
    path.write_text(json.dumps(sample(9.4, 3.7, [700, 1300])))
    readme.write_text(f"# x\n\n{results.START}\nstale figures\n{results.END}\n\nafter\n")
    assert not results.update_page(readme, results.load(path), check=True)
    results.record(path, {"binding": {"vm_settings_us": 1000, "vm_settings_fresh_us": 1500, "peak_rss_mib": 90}},
                   page=readme)
    data = results.load(path)
    assert data["node"]["commit"] == "abc1234" and data["binding"]["commit"] == results.commit()
    assert data["binding"]["machine"]["cores"]
    text = readme.read_text()
    assert "stale figures" not in text and "| 1.0 ms (1.5 ms" in text and text.endswith("\n\nafter\n")
    assert results.update_page(readme, data, check=True)
    readme.write_text(text.replace("1.0 ms", "0.5 ms"))  # a figure edited by hand
    assert not results.update_page(readme, data, check=True)


def test_the_provisioning_table_comes_from_its_section(tmp_path: Path) -> None:
    data = sample(1.2, 0.4, [1100])
    stamp = {k: data["node"][k] for k in ("commit", "date", "machine")}
    data["provisioning"] = {**stamp, "runs": 3, "unavailable": {"zfs": "no zfs module"}, "notes": ["a note"],
                            "figures": {"floor dir": {"median": 6.0, "min": 5.5, "max": 7.0},
                                        "provision dir": {"median": 12.0, "min": 11.0, "max": 13.0},
                                        "destroy floor": {"median": 1.0, "min": 1.0, "max": 1.1},
                                        "destroy": {"median": 1.4, "min": 1.3, "max": 1.5}},
                            "ratios": [{"of": "provision dir", "to": "of floor dir", "goal": 1.5, "ratio": 2.0},
                                       {"of": "destroy", "to": "of destroy floor", "goal": 1.5, "ratio": 1.4}]}
    table = results.render_provisioning(data)
    assert "| provision dir | 12.00 s (11.00–13.00) | 2.00× of floor dir | ≤ 1.5× (missed) |" in table
    assert "| destroy | 1.40 s (1.30–1.50) | 1.40× of destroy floor | ≤ 1.5× (met) |" in table
    assert "| zfs | unavailable: no zfs module |" in table and "- a note" in table
    assert "3 run(s)): commit abc1234" in table
    readme = tmp_path / "README.md"
    readme.write_text(f"{results.START}\nx\n{results.END}\n\n{results.PSTART}\nold\n{results.PEND}\n")
    assert results.update_page(readme, data)
    assert table in readme.read_text() and "old" not in readme.read_text()
    # A README without the provisioning block keeps only the registry's.
    bare = tmp_path / "BARE.md"
    bare.write_text(f"{results.START}\nx\n{results.END}\n")
    results.update_page(bare, data)
    assert results.PSTART not in bare.read_text()


def test_the_minion_table_follows_the_containers_one(tmp_path: Path) -> None:
    data = sample(1.2, 0.4, [1100])
    stamp = {k: data["node"][k] for k in ("commit", "date", "machine")}
    assert "No provisioning figures" in results.render_provisioning(data)
    data["minion"] = {**stamp, "commit": "def5678", "runs": 2, "notes": [],
                      "figures": {"minion floor + one runner call": {"median": 4.0, "min": 3.9, "max": 4.2},
                                  "provision overlayfs minion (every step)": {"median": 5.0, "min": 4.8, "max": 5.5}},
                      "ratios": [{"of": "provision overlayfs minion (every step)",
                                  "to": "of minion floor + one runner call", "goal": 1.5, "ratio": 1.25}]}
    table = results.render_provisioning(data)
    assert table.startswith("| VMs that become minions: measure |")
    assert ("| provision overlayfs minion (every step) | 5.00 s (4.80–5.50) | 1.25× of minion floor + one "
            "runner call | ≤ 1.5× (met) |") in table
    assert "2 run(s)): commit def5678" in table
    data["provisioning"] = {**stamp, "runs": 1, "figures": {"floor dir": {"median": 6.0, "min": 6.0, "max": 6.0}},
                            "ratios": []}
    both = results.render_provisioning(data)
    assert both.index("| containers: measure |") < both.index("| VMs that become minions: measure |")
    assert "1 run(s)): commit abc1234" in both and "2 run(s)): commit def5678" in both


def test_the_stores_table_comes_from_its_section(tmp_path: Path) -> None:
    data = sample(1.2, 0.4, [1100])
    stamp = {k: data["node"][k] for k in ("commit", "date", "machine")}
    assert "No store figures" in results.render_store(data)

    def at_once(per_s: int, each: list[int], duplicates: int = 0, agrees: bool = True) -> dict[str, Any]:
        return {"per_s": per_s, "per_process_per_s": each, "duplicates": duplicates, "store_agrees": agrees,
                "errors": 0}

    data["store"] = {**stamp, "server_version": "15.18", "settings": {"fsync": "on", "synchronous_commit": "on"},
                     "single": {"allocs": 1000, "sqlite": {"per_s": 1400, "p50_ms": 0.7, "p99_ms": 1.3},
                                "postgresql": {"per_s": 600, "p50_ms": 1.6, "p99_ms": 3.1}},
                     "register": {"vms": 10000, "declaration_s": 0.3, "sqlite": {"first_s": 0.9, "repeat_s": 0.3},
                                  "postgresql": {"first_s": 4.2, "repeat_s": 0.5}},
                     "concurrent": {"allocs": 200, "runs": [
                         {"shape": "own", "processes": 1, "sqlite": at_once(1300, [1300, 1300]),
                          "postgresql": at_once(550, [550, 550])},
                         {"shape": "shared", "processes": 4, "sqlite": at_once(1200, [250, 350]),
                          "postgresql": at_once(900, [220, 230], duplicates=2, agrees=False)}]}}
    table = results.render_store(data)
    assert table.startswith("| measure | SQLite | PostgreSQL |")
    assert ("| durable single allocations, one process (1,000 timed) | 1,400 per second (p50 0.70 ms, p99 1.30 ms) "
            "| 600 per second (p50 1.60 ms, p99 3.10 ms) |") in table
    assert "| first registration of a node declaring 10,000 VMs, in-process | 0.90 s | 4.20 s |" in table
    assert "| 1 process allocating alone | 1,300 per second (1,300 per process; every value once) |" in table
    assert ("| 4 processes allocating at once, all on one node | 1,200 per second (250–350 per process; every "
            "value once) | 900 per second (220–230 per process; 2 handed out twice, the store disagrees) |") in table
    assert "fsync=on, synchronous_commit=on" in table and "Measured (`./run bench store`" in table
    readme = tmp_path / "README.md"
    readme.write_text(f"{results.START}\nx\n{results.END}\n\n{results.SSTART}\nold\n{results.SEND}\n")
    assert results.update_page(readme, data)
    assert table in readme.read_text() and "old" not in readme.read_text()


def test_the_dns_table_comes_from_its_section(tmp_path: Path) -> None:
    data: dict[str, Any] = {}
    assert "No DNS figures" in results.render_dns(data)
    stamp = sample(1.0, 0.4, [1100])["node"]
    figures = {"vms": 1000, "records": 4000, "rrsets": 4000, "runs": 3, "updates": 16, "acknowledged_s": 0.7,
               "primary_s": 0.8, "secondary_s": 1.1, "noop_s": 0.3, "noop_updates": 0, "remove_s": 1.0,
               "remove_updates": 16}
    met = results.render_dns({"dns": {**stamp, **figures, "answered_s": 1.1}})
    assert "| publication, start to every name answering on every nameserver | 1.10 s | ≤ 2 s (met) |" in met
    assert "a node of 1,000 VMs" in met and "| 16 |" in met
    missed = results.render_dns({"dns": {**stamp, **figures, "answered_s": 2.4}})
    assert "≤ 2 s (missed)" in missed
