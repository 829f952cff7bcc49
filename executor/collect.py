"""Collect: summarise a run directory's raw files into summary.json + verdict.json, re-runnably.

The raw files are the record of truth; this step can run any number of times. A statistics failure
is a collection_fault, fixed by running this again, never by re-running the load. The simulator's
`stats_failure` fault is a marker file here: the first call fails and removes it.
"""
from __future__ import annotations

import json
from pathlib import Path

from core import records as rec
from core import scenarios
from core.metrics import summarize
from core.summary import Contract, Summary, Verdict
from executor.evidence import digest_run
from executor.verdict import judge

STATS_FAULT = "fault_stats_failure"
VERDICT = "verdict.json"
EVIDENCE = "evidence.json"


class CollectionError(RuntimeError):
    """Statistics could not be produced from a run directory (the load itself may have been fine)."""


def contract_for(info: rec.RunInfo) -> Contract:
    """The scenario contract: from run.json's `contract` when present, else from the scenario file."""
    extra = info.model_extra or {}
    if extra.get("contract"):
        return Contract.model_validate(extra["contract"])
    zero_cache, min_hit = False, None
    try:

        sc = scenarios.load(info.scenario)
        zero_cache, min_hit = sc.zero_cache, sc.min_request_hit
    except (FileNotFoundError, ValueError):
        pass
    return Contract(output_len=info.output_len, zero_cache=zero_cache, min_request_hit=min_hit,
                    cards_required=extra.get("cards_required"))


def load_run(run_dir: Path) -> tuple[rec.RunInfo, list[rec.RequestRecord]]:
    p = run_dir / rec.RUN_INFO
    if not p.exists():
        raise CollectionError(f"{p}: missing run.json")
    try:
        info = rec.RunInfo.model_validate_json(p.read_text())
        records = list(rec.read_jsonl(run_dir / rec.REQUESTS, rec.RequestRecord))
    except ValueError as e:  # pydantic ValidationError is a ValueError
        raise CollectionError(f"{run_dir}: unreadable raw file: {e}") from e
    return info, records


def summarize_run(run_dir: Path | str, slos: dict[str, float] | None = None, contract: Contract | None = None,
                  cards_in_use: int | None = None) -> tuple[Summary, Verdict]:
    """Summary and verdict of one run directory; writes summary.json, verdict.json, evidence.json.

    The executor passes the goal's contract and the cards its transport launched; standalone (`tuneloop load
    summarize`) the contract comes from run.json or the scenario, and the cards from run.json."""
    run_dir = Path(run_dir)
    marker = run_dir / STATS_FAULT
    if marker.exists():
        marker.unlink()
        raise CollectionError(f"{run_dir}: statistics step failed (injected stats_failure); re-summarise")
    info, records = load_run(run_dir)
    extra = info.model_extra or {}
    summary = summarize(records, info, slos=slos if slos is not None else extra.get("slos"),
                        **{k: extra[k] for k in ("native_min_requests", "native_min_seconds") if k in extra})
    verdict = judge(records, info, contract or contract_for(info), n_cards=cards_in_use)
    rec.write_atomic(run_dir / rec.SUMMARY, summary.model_dump_json(indent=1))
    rec.write_atomic(run_dir / VERDICT, verdict.model_dump_json(indent=1))
    try:

        rec.write_atomic(run_dir / EVIDENCE, digest_run(run_dir, info).model_dump_json(indent=1))
    except (OSError, ValueError) as e:  # evidence is advisory: its absence never fails collection
        rec.write_atomic(run_dir / EVIDENCE, json.dumps({"error": str(e)}))
    return summary, verdict


def collect(run_dir: Path | str) -> tuple[Summary | None, Verdict]:
    """summarize_run that never raises: a failure becomes a collection_fault verdict."""
    try:
        return summarize_run(run_dir)
    except CollectionError as e:
        run_dir = Path(run_dir)
        try:
            info, records = load_run(run_dir)
        except CollectionError:
            return None, Verdict(kind="collection_fault", reasons=[{"code": "statistics_failed", "message": str(e)}])
        return None, judge(records, info, contract_for(info), summary_error=str(e))
