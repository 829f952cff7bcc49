"""The shared-prefix scenario's cache contract against the real llama-server prompt cache.

llamacpp-shared-prefix promises every formal request at least `min_request_hit` of its prompt from the
cache (two groups share 75 % of the prompt). The verdict reads the server's own
usage.prompt_tokens_details.cached_tokens: with the prompt cache on and a slot per group the contract
holds; with it off the same load breaks the contract (never a slow-but-valid result).

The prefix-cache flush against the same server: erasing its slots leaves its host-RAM prompt cache (--cache-ram,
on by default) holding earlier prompts, so that erase counts as a flush only with --cache-ram 0; otherwise the
server is restarted, and after either a repeated prompt finds nothing cached.
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



ZERO = "llamacpp-chat"  # a zero-cache scenario (the station's; the prompts below are the test's own)


def _serve(argv: list[str], port: int):  # type: ignore[no-untyped-def]
    import subprocess
    import time

    import httpx

    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, f"llama-server exited rc={proc.returncode}"
        time.sleep(0.3)
    raise AssertionError("llama-server never healthy")


def _cached(port: int, prompt: str) -> int:
    import httpx

    r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                   json={"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0.0})
    r.raise_for_status()
    return int(((r.json().get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def test_slot_erase_is_a_flush_only_without_the_ram_prompt_cache(engine, tmp_path):  # noqa: F811
    """One slot, prompt cache on (llama-server's default). Prompt A, then B takes the slot: A's state goes into the
    host-RAM prompt cache. Erasing the slots leaves it there (A comes back cached), so the adapter says the erase is
    no flush while --cache-ram is on, and after the restart the runner then does A finds nothing cached; with
    --cache-ram 0 the erase is the flush and A finds nothing cached either."""
    import asyncio
    import os
    import signal

    from core.station import Station, full_knobs
    from executor.cacheflush import flush_service
    from executor.templates import render
    from executor.transports.local import LocalTransport

    words = " ".join(f"w{i}" for i in range(120))
    a, b = f"alpha {words}", f"beta {words[::-1]}"
    for extra, erase_is_flush in (((), False), (("--cache-ram", "0"), True)):
        tg = _target(engine, tmp_path / f"t{len(extra)}", extra_args={"mixed": extra})
        st = Station(engine="llamacpp", knobs=full_knobs({"parallel": 1, "threads": 1, "ctx_size": 4096,
                                                           "cache_prompt": True}, "llamacpp"),
                     scenario=ZERO, data_version="d", source_identity="s", target=tg.name)
        (svc,) = render(tg, st).services
        port = svc.port
        proc = _serve(list(svc.argv), port)
        try:
            assert _cached(port, a) == 0
            _cached(port, b)  # B takes the one slot: A's prompt state is saved to the RAM cache
            out = asyncio.run(flush_service(LocalTransport(tg), svc, "llamacpp"))
            assert out["slots"] == 1 and out["status"] == [200] and out["ok"] is erase_is_flush, out
            if erase_is_flush:
                assert _cached(port, a) == 0
                continue
            assert _cached(port, a) > 1  # what 'held' says: the erased slot got A back from the RAM cache
            os.killpg(proc.pid, signal.SIGTERM)  # what the runner does when the flush is refused: restart
            proc.wait(30)
            proc = _serve(list(svc.argv), port)
            assert _cached(port, a) == 0
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
