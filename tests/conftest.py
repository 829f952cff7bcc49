"""Shared fixtures: `pg_url` (a fresh PostgreSQL schema per test) and `store` (SQLite and PostgreSQL).

PostgreSQL comes from TUNELOOP_TEST_PG_URL (exported by `make test`). Without it a PostgreSQL test
fails under CI=true and is skipped otherwise.

`make test` runs the suite on two pytest-xdist workers (`-n 2`). The modules that start a real engine (vLLM,
llama-server) are one scheduling scope (pytest_xdist_make_scheduler below), so they run one after another on one
worker and never two engines at once on this machine's two cores; every other module is a scope of its own, spread
over both workers, so a module's fixtures (a `tuneloop demo` run, a browser, a started engine) are set up once,
not once per worker that happens to get one of its tests.
"""
from __future__ import annotations

import os
import uuid
from typing import Iterator

import pytest

BACKENDS = ["sqlite", "postgresql"]

REAL_ENGINE_MODULES = frozenset({
    "test_vllm_loop", "test_vllm_flags", "test_vllm_pd", "test_llamacpp_loop", "test_llamacpp_ssh",
    "test_llamacpp_cache", "test_llamacpp_cpu", "test_llamacpp_flags", "test_drift_llamacpp", "test_make_demo_real"})


def pytest_xdist_make_scheduler(config, log):
    """Under `-n N`: the real-engine modules are one scope (one worker, one engine at a time), every other module
    its own scope, balanced over the workers. (xdist's own `xdist_group` marks are not applied under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling

    class RealEnginesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
            return "real-engines" if module in REAL_ENGINE_MODULES else nodeid.split("::", 1)[0]

    return RealEnginesTogether(config, log)


def _pg_base() -> str:
    from unavailable import missing

    url = os.environ.get("TUNELOOP_TEST_PG_URL")
    if not url:
        missing("TUNELOOP_TEST_PG_URL is not set: PostgreSQL tests cannot run (`make services` starts it)")
    return url


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema, dropped after the test."""
    import sqlalchemy as sa

    base = _pg_base()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base)
    with admin.begin() as c:
        c.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as c:
            c.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh database URL, once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(store_url: str):
    from state.store import Store

    s = Store(store_url)
    yield s
    s.close()


@pytest.fixture
def make_result():
    """Factory of TrialResults with just the figures the state layer reads (tok/s/card, TPOT, N)."""
    from core.summary import Dist, Summary, Verdict, WindowFigures
    from core.trial import CostEntry, TrialResult

    def window(kind: str, per_card: float, n: int, dur: float) -> WindowFigures:
        return WindowFigures(kind=kind, start=0.0, end=dur, duration=dur, n_requests=n, output_tokens=per_card * 16 * dur,
                             output_tok_s=per_card * 16, output_tok_s_per_card=per_card, qps=n / dur,
                             achieved_concurrency=100.0)

    def make(run_id: str, *, verdict: str = "valid", whole: float = 200.0, native: float | None = 210.0, n: int = 640,
             tpot: float = 10.0, load_s: float = 120.0, cards: int = 16, station_hash: str | None = None):
        summary = Summary(n_total=n, n_formal=n, n_sent=n, n_ok=n, n_failed=0, cards=cards, concurrency=128,
                          request_rate=6.0, whole=window("whole", whole, n, load_s),
                          native=window("native", native, n * 3 // 4, 90.0) if native is not None else None,
                          native_reason=None if native is not None else "window 50.7 s < 60 s",
                          ttft_ms=Dist(n=n, mean=900.0, p90=1500.0), tpot_ms=Dist(n=n, mean=tpot, p90=tpot * 1.2),
                          itl_ms=Dist(n=n), e2e_ms=Dist(n=n), queue_delay_ms=Dist(n=n), output_len_min=1024,
                          output_len_max=1024)
        return TrialResult(run_id=run_id, verdict=Verdict(kind=verdict), summary=summary if verdict == "valid" else None,
                           costs=[CostEntry(what="restart", seconds=300.0, cards=cards),
                                  CostEntry(what="load", seconds=load_s, cards=cards)],
                           station_hash=station_hash)

    return make

