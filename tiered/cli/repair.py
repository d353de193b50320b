"""``tiered repair``: rebuild lost manifests from the segment objects in the bucket."""

from __future__ import annotations

from typing import Annotated

import typer

from tiered.cli.app import app, fail
from tiered.cli.output import print_json
from tiered.cli.common import BrokerOpt, ClusterOpt, ColdOpt, ConfigOpt, settings_from
from tiered.cli.wiring import cold_tier, lease, object_store, setup_logging
from tiered.errors import TieredError


@app.command()
def repair(
    config: ConfigOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None, broker: BrokerOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report what would be rebuilt; write nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Rebuild every missing manifest from its queue's segment objects; report what cannot be adopted (exit 1)."""
    settings = settings_from(config, cold_url=cold, cluster=cluster, broker=broker)
    setup_logging(settings.log.format, settings.log.level)
    objects = object_store(settings)
    ct = cold_tier(settings, objects, writer=False)
    lease_manager = None if dry_run else lease(settings, objects)
    try:
        if lease_manager is not None:
            lease_manager.acquire()  # a rebuilt manifest is a write: never next to another writer
        report = ct.repair(dry_run=dry_run)
    except TieredError as exc:
        fail(f"repair stopped: {exc}", 1)
    finally:
        if lease_manager is not None and lease_manager.lease is not None:
            try:
                lease_manager.release()
            except TieredError:
                pass
    if as_json:
        print_json({
            "ok": report.ok, "dry_run": dry_run, "intact": report.intact,
            "adopted": {q: {"segments": len(p.adopted), "gaps": len(p.manifest.gaps) if p.manifest else 0,
                            "first_offset": p.manifest.first_offset if p.manifest else None,
                            "next_offset": p.manifest.next_offset if p.manifest else None,
                            "superseded": list(p.superseded)} for q, p in report.adopted.items()},
            "problems": {q: list(v) for q, v in report.problems.items()}})
    else:
        would = "would rebuild" if dry_run else "rebuilt"
        for q, p in report.adopted.items():
            m = p.manifest
            assert m is not None
            print(f"{would} {q}: {len(p.adopted)} segments, offsets [{m.first_offset},{m.next_offset})"
                  + (f", {len(m.gaps)} recorded gaps" if m.gaps else "")
                  + (f", {len(p.superseded)} superseded objects left to the cleaner" if p.superseded else ""))
        for q, problems in report.problems.items():
            for problem in problems:
                print(f"cannot adopt {q}: {problem}")
        print(f"{len(report.adopted)} manifests {would}, {report.intact} intact, "
              f"{len(report.problems)} queues need an operator")
    if not report.ok:
        raise typer.Exit(1)
