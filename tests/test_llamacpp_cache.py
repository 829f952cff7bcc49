"""The shared-prefix scenario's cache contract against the real llama-server prompt cache.

llamacpp-shared-prefix promises every formal request at least `min_request_hit` of its prompt from the
cache (two groups share 75 % of the prompt). The verdict reads the server's own
usage.prompt_tokens_details.cached_tokens: with the prompt cache on and a slot per group the contract
holds; with it off the same load breaks the contract (never a slow-but-valid result).
"""
from __future__ import annotations

from test_llamacpp_loop import _executor, _stop_all, _target, engine  # noqa: F401  (engine: shared fixture)

from core import scenarios
from core.trial import TrialSpec

SCENARIO = "llamacpp-shared-prefix"
# one request at a time: every request finds both slots idle, and llama-server gives it the slot whose
# last prompt shares the most with it (its group's prefix, primed by the warm-up requests)
KNOBS = {"parallel": 2, "threads": 1, "ctx_size": 4096, "concurrency": 1, "request_rate": 1000.0}


def _run(ex, run_id: str, knobs: dict):  # type: ignore[no-untyped-def]
    return ex.run_trial(TrialSpec(run_id=run_id, goal_id="g", target="llama", scenario=SCENARIO, knobs=knobs,
                                  stage="screen", n=8, warmup=2, seed=0))


def test_shared_prefix_contract_holds_with_the_prompt_cache_and_breaks_without(engine, tmp_path):  # noqa: F811
    sc = scenarios.load(SCENARIO)
    need = sc.min_request_hit
    assert need is not None and sc.prefix_groups == 2  # the scenario carries a cache contract
    target = _target(engine, tmp_path / "tgt")
    store, ex = _executor(tmp_path, target)
    try:
        on = _run(ex, "cache-on", KNOBS | {"cache_prompt": True})
        assert on.verdict.kind == "valid", on.verdict
        s = on.summary
        assert s.n_failed == 0 and s.output_len_min == s.output_len_max == sc.output_len
        assert s.cache_hit_min_request is not None and s.cache_hit_min_request >= need, s
        assert s.cache_hit <= sc.prefix_share + 0.1, s  # the unique tail of each prompt is never cached

        off = _run(ex, "cache-off", KNOBS | {"cache_prompt": False})
        assert off.verdict.kind == "contract_violation", off.verdict
        assert [r.code for r in off.verdict.reasons] == ["cache_hit_below"], off.verdict
        assert off.summary.cache_hit == 0.0  # the server's own cached_tokens, not an estimate
    finally:
        _stop_all(ex, target)
        store.close()


ZERO = "llamacpp-chat"  # a zero-cache scenario: no prompt may hit a cache; the same seed sends the same prompts


def _flushes(store, run_id: str) -> list[dict]:
    from core.journal import as_record

    return [d for r in map(as_record, store.phases(run_id)) if r.phase == "warmup" and r.event == "outcome"
            for d in (r.detail or {}).get("cache_flush", [])]


def _zero(ex, run_id: str, target: str):  # type: ignore[no-untyped-def]
    return ex.run_trial(TrialSpec(run_id=run_id, goal_id="g", target=target, scenario=ZERO, stage="screen", n=8,
                                  warmup=2, seed=0, knobs={"parallel": 2, "threads": 1, "ctx_size": 4096,
                                                           "cache_prompt": True, "concurrency": 2,
                                                           "request_rate": 1000.0}))


def test_a_zero_cache_run_on_a_warm_llama_server_finds_no_cached_prompt(engine, tmp_path):  # noqa: F811
    """The same prompts twice on one llama-server (its prompt cache on): slot erase alone leaves the host-RAM
    prompt cache (--cache-ram, on by default) holding them, so with it on the flush is not a flush and the server
    restarts; with --cache-ram 0 the erase is the flush. Either way the second run reports 0 cached tokens."""
    ram = _target(engine, tmp_path / "ram", name="ram")
    off = _target(engine, tmp_path / "off", name="off", extra_args={"mixed": ("--cache-ram", "0")})
    store, ex = _executor(tmp_path, ram, off)
    try:
        for tg in (ram, off):
            first = _zero(ex, f"{tg.name}-1", tg.name)
            again = _zero(ex, f"{tg.name}-2", tg.name)
            for res in (first, again):
                assert res.verdict.kind == "valid", (tg.name, res.verdict)
                assert res.summary.cache_hit == 0.0, (tg.name, res.summary)  # the server's own cached_tokens
            (flush,) = _flushes(store, f"{tg.name}-2")  # the second run found the server warm and flushed it
            assert flush["slots"] == 2 and all(code == 200 for code in flush["status"]), flush
            if tg is ram:
                assert flush["ok"] is False and "--cache-ram" in flush["held"], flush  # then restarted
            else:
                assert flush["ok"] is True and "held" not in flush, flush
            _stop_all(ex, tg)
    finally:
        for tg in (ram, off):
            _stop_all(ex, tg)
        store.close()
