"""Validity verdict: a pure function of the raw records, the run info and the scenario contract.

Only a `valid` result may become a positive or a negative. Precedence: formal requests never sent
(orchestration_fault) > statistics failed (collection_fault: re-summarise, never re-run) > broken
contract (contract_violation, every broken rule listed with counts and request ids).
"""
from __future__ import annotations

from typing import Sequence

from core.evidence import Evidence
from core.records import RequestRecord, RunInfo
from core.summary import Contract, Reason, Verdict

MAX_IDS = 50  # request ids listed per reason; the count is always complete


def _reason(code: str, message: str, ids: list[int]) -> Reason:
    return Reason(code=code, message=message, count=len(ids), request_ids=sorted(ids)[:MAX_IDS])


def _ids(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in sorted(ids)[:10])
    return shown + (", ..." if len(ids) > 10 else "")


def contract_reasons(formal: Sequence[RequestRecord], contract: Contract) -> list[Reason]:
    """Every broken rule of the scenario contract among the formal requests."""
    out: list[Reason] = []
    failed = [r.id for r in formal if not r.ok]
    if contract.all_succeed and failed:
        out.append(_reason("failed_requests", f"{len(failed)} request(s) failed: {_ids(failed)}", failed))
    ok = [r for r in formal if r.ok]
    want = contract.output_len  # None: each request's own length (a scenario of the user's traffic)
    lens = {r.id: want if want is not None else r.n_out_expected for r in ok}
    short = [r.id for r in ok if r.n_out is not None and lens[r.id] is not None and r.n_out < lens[r.id]]
    long_ = [r.id for r in ok if r.n_out is not None and lens[r.id] is not None and r.n_out > lens[r.id]]
    unknown = [r.id for r in ok if r.n_out is None]
    than = f"{want} tokens" if want is not None else "the request's own output length"
    if short:
        out.append(_reason("short_output", f"{len(short)} output(s) shorter than {than}: {_ids(short)}", short))
    if long_:
        out.append(_reason("long_output", f"{len(long_)} output(s) longer than {than}: {_ids(long_)}", long_))
    if unknown:
        out.append(_reason("output_len_unknown",
                           f"{len(unknown)} output(s) without usage.completion_tokens: {_ids(unknown)}", unknown))
    if contract.zero_cache:
        hit = [r.id for r in formal if r.n_cached]
        if hit:
            out.append(_reason("unexpected_cache_hit",
                               f"{len(hit)} request(s) had cached tokens in a zero-cache scenario: {_ids(hit)}", hit))
    if contract.min_request_hit is not None:
        need = contract.min_request_hit
        below = [r.id for r in formal if r.ok and r.n_cached is not None and r.n_in
                 and r.n_cached / r.n_in < need]
        blind = [r.id for r in formal if r.ok and (r.n_cached is None or not r.n_in)]
        if below:
            out.append(_reason("cache_hit_below",
                               f"{len(below)} request(s) below the {need:.2%} per-request hit: {_ids(below)}", below))
        if blind:
            out.append(_reason("cache_hit_unknown",
                               f"{len(blind)} request(s) reported no cached_tokens, hit cannot be shown: {_ids(blind)}",
                               blind))
    return out


def judge(records: Sequence[RequestRecord], info: RunInfo, contract: Contract,
          summary_error: str | None = None, n_cards: int | None = None) -> Verdict:
    """The run's verdict with readable reasons; see the module docstring for the precedence."""
    formal = [r for r in records if not r.warmup]
    sent = [r for r in formal if r.t_send is not None]
    missing = sorted(set(range(info.warmup, info.warmup + info.n)) - {r.id for r in formal})
    unsent = [r.id for r in formal if r.t_send is None]
    if len(sent) < max(contract.min_formal_sent, 1) or missing or unsent:
        ids = missing + unsent
        msg = (f"{len(ids)} of {info.n} formal request(s) never sent"
               + (f" (no record: {_ids(missing)})" if missing else "")
               + (f" (not sent: {_ids(unsent)})" if unsent else ""))
        if not ids:
            msg = f"only {len(sent)} formal request(s) sent, contract needs {contract.min_formal_sent}"
        return Verdict(kind="orchestration_fault", reasons=[_reason("formal_not_sent", msg, ids)])
    if summary_error is not None:
        return Verdict(kind="collection_fault", reasons=[Reason(
            code="statistics_failed", message=f"requests ran but statistics failed: {summary_error}; "
                                              "re-summarise the raw file, do not re-run", count=len(sent))])
    reasons = contract_reasons(formal, contract)
    cards = n_cards if n_cards is not None else info.cards
    if contract.cards_required is not None and cards < contract.cards_required:
        reasons.append(Reason(code="cards_missing", count=contract.cards_required - cards,
                              message=f"{cards} card(s) in use, the goal requires {contract.cards_required}"))
    return Verdict(kind="contract_violation", reasons=reasons) if reasons else Verdict(kind="valid")


def handoff_fault(evidence: Evidence | None) -> Verdict | None:
    """A PD run whose KV hand-off failed (NIXL's failed transfers or notifications, or a read that completed
    after prefill released the blocks): an orchestration fault, whatever the requests did. Failed requests would
    otherwise read as a broken contract and recomputed prompts as a slow result; neither says anything about the
    station. Expired leases are named beside a failure but are not one alone (see executor/evidence_kv.py)."""
    kv = evidence.kv_transfer if evidence is not None else None
    if kv is None or not kv.failed:
        return None
    counts = ", ".join(f"{k.removeprefix('kv_').replace('_', ' ')} {v:.0f}"
                       for k, v in (("kv_failed_transfers", kv.kv_failed_transfers),
                                    ("kv_failed_notifications", kv.kv_failed_notifications),
                                    ("kv_late_reads", kv.kv_late_reads), ("kv_expired", kv.kv_expired)) if v)
    return Verdict(kind="orchestration_fault", reasons=[Reason(
        code="kv_handoff_failed", count=int(kv.failed),
        message=f"the KV hand-off from prefill to decode failed ({counts}): a tooling fault, not a result")])
