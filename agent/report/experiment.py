"""One experiment of a report: a run of the goal with its card, its result and the decisions it led to."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.planner import change_words
from core.evidence import Evidence
from core.evidence_parts import RankGroup, Spread
from core.summary import Summary
from core.trial import TrialResult
from state.snapshots import Decision, Run


@dataclass(frozen=True)
class Experiment:
    """One run of the goal with its card, its result and the decisions it led to."""

    index: int
    run: Run
    card: dict[str, Any]
    station: str | None  # the run's frozen station (executor content hash)
    parent: str | None  # the parent's station hash where a run of the parent froze one
    result: TrialResult | None
    outcome: Decision | None  # the decision judged from this run
    decisions: tuple[Decision, ...]  # every decision naming this run (quality gate included)
    ruled_out: str
    card_hours: float
    run_dir: Path | None = None  # the result's run directory, resolved against the report's base folder

    @property
    def summary(self) -> Summary | None:
        return self.result.summary if self.result else None

    @property
    def verdict(self) -> str:
        return self.result.verdict.kind if self.result else "no result"

    @property
    def change(self) -> str:
        return change_words(self.card, "→") or "none (measure the parent)"

    @property
    def slo_violations(self) -> list[str]:
        return list(((self.outcome.data or {}).get("figures") or {}).get("slo_violations") or []) if self.outcome else []

    @property
    def evidence(self) -> str | None:
        """The engine evidence of the run in words, per role (what the planner read), or None without any."""
        return evidence_words(self.result.evidence) if self.result else None


def _num(v: Any, digits: int = 1) -> str | None:
    return None if v is None else f"{v:.{digits}f}"


def _count(v: float | None) -> str:
    return "?" if not v else f"{v:g}"


def evidence_words(ev: Evidence) -> str | None:
    """Prefill: its queue and batches; decode: its batch against the limit, its capacity queue and its wait for
    remote KV; the KV hand-off: how many prompt tokens arrived as KV, in how many transfers, how fast, failures;
    the rank that gates an instance of several ranks."""
    parts = []
    prefill = [f"{k} {v}" for k, v in (("waiting mean", _num(ev.prefill_waiting_mean)),
                                       ("batch tokens mean", _num(ev.prefill_batch_tokens_mean, 0)))
               if v is not None]
    if prefill:
        parts.append(f"prefill ({_count(ev.prefill_instances)} instance(s)): " + ", ".join(prefill))
    limit = ev.decode_batch_limit
    decode = [f"{k} {v}" for k, v in (("running max", _num(ev.decode_running_max, 0)),
                                      ("batch limit", None if limit is None else f"{limit:g}"),
                                      ("waiting mean", _num(ev.decode_waiting_mean)),
                                      ("waiting for remote KV mean", _num(ev.decode_deferred_mean)))
              if v is not None]
    if decode:
        parts.append(f"decode ({_count(ev.decode_instances)} instance(s)): " + ", ".join(decode))
    kv = ev.kv_transfer
    if kv is not None:
        share = kv.remote_share
        words = [f"{kv.kv_tokens_remote:.0f} prompt tokens arrived as KV" if kv.kv_tokens_remote is not None else None,
                 f"{share:.0%} of decode's prompt tokens" if share is not None else None,
                 f"{kv.kv_bytes / 2**20:.1f} MiB in {kv.kv_transfers:.0f} transfers"
                 if kv.kv_bytes is not None and kv.kv_transfers is not None else None,
                 f"{kv.transfer_s_mean * 1000:.1f} ms each" if kv.transfer_s_mean is not None else None,
                 f"{kv.failed:.0f} failed" if kv.failed is not None else None]
        parts.append("KV hand-off: " + ", ".join(w for w in words if w))
    parts += spread_words(ev.instance_spread)
    parts += rank_words(ev.ranks)
    return "; ".join(parts) or None


FIGURE_WORDS = {"requests": "requests served", "running_mean": "running mean", "waiting_mean": "waiting mean",
                "batch_fill": "batch fill", "kv_usage_max": "KV use max", "kv_tokens_remote": "KV tokens received",
                "kv_transfers": "KV transfers"}


def spread_words(spread: dict[str, dict[str, Spread]] | None) -> list[str]:
    """Per role with several instances: the router's balance (requests served) and the figure spread most unevenly,
    naming the instance that carries the most and the one that carries the least."""
    out = []
    for role, figs in sorted((spread or {}).items()):
        shown = [f for f in ("requests",) if f in figs]
        rest = sorted((f for f in figs if f != "requests"), key=lambda f: -figs[f].max_over_mean)
        shown += rest[:1]
        words = [f"{FIGURE_WORDS.get(f, f)} {figs[f].max} {figs[f].max_over_mean:.2f}x the mean "
                 f"(least {figs[f].min})" for f in shown]
        if words:
            out.append(f"{role} instances: " + ", ".join(words))
    return out


def rank_words(ranks: dict[str, RankGroup] | None) -> list[str]:
    """Per instance of several DP / EP ranks: the slowest rank's step time against the median, else the rank with
    the longest queue (the rank that gates its group's steps)."""
    out = []
    for inst, g in sorted((ranks or {}).items()):
        step, queue = g.combined.get("step_s"), g.combined.get("waiting_mean")
        if step is not None:
            out.append(f"{inst} ({step.ranks} ranks): slowest {step.worst} at {step.max * 1000:.1f} ms a step "
                       f"(median {step.median * 1000:.1f} ms)")
        elif queue is not None:
            out.append(f"{inst} ({queue.ranks} ranks): longest queue {queue.worst} at {queue.max:.1f} waiting "
                       f"(median {queue.median:.1f}, {queue.sum:.1f} over all)")
    return out
