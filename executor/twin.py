"""The goal's deployment twin: a simulator profile calibrated to the goal's own valid runs, fitted from a prior.

The prior is a profile of the same structure (roles, instance counts, cards, engine kind): the target's
`calibrated_profile` where it has one, else the profile a simulated goal names (`sim_profile`, as a user starts
from a similar deployment's profile); the fit and the predictions go through the executor's door into the
simulator (executor/transports/sim.py). Never a simulated target's hidden truth (`Target.truth_profile`): the
twin learns the deployment only from its runs. The fit is `simulator.calibrate.calibrate` over the runs' own
records and evidence (step costs with their standard errors, prompt tokenisation, MTP acceptance per task and its
decay per draft position, each expert layout's imbalance): what the runs say wins over the prior, and a coefficient
the runs cannot separate or did not observe keeps the prior's value and says so.

The fit on no run is the prior itself (it predicts the goal's first run out of sample). Fits are kept per set of runs (the planner asks for the twin fitted on every prefix of the goal's runs to
measure its out-of-sample error, agent/planner/twin.py); a station's prediction is kept per fit, in memory and on
disk (`DiskCache`: shared by every process of the user, so a restarted `tuneloop run`, a service's workers and the
goals of one deployment that fit the same profile simulate a station once).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import numpy
from pydantic import VERSION as PYDANTIC_VERSION

from core import profiles, scenarios
from core.canonical import canon
from core.profiles import Profile
from core.summary import Summary
from executor.derived import write_derived
from executor.transports.sim import calibrate_runs, simulate_station

FITS_KEPT = 64  # fits kept per executor (each a profile and a few hundred floats): a long goal refits every run
CACHE_ENV = "TUNELOOP_TWIN_CACHE"  # the on-disk prediction cache's directory, or "off"
# what a prediction is computed by (besides the profile and scenario in its key): the simulator, core/ (the summary,
# profiles, scenarios, knob catalog), this module and the sim transport's door
CODE = ("simulator", "core", "executor/twin.py", "executor/transports/sim.py")
VERSIONS_KEPT = 3  # code versions whose predictions stay on disk (this one and the two used last): each edit of
# simulator/ or core/ is a version of its own, and a test suite's run writes ~10-90 MB of predictions


@lru_cache(maxsize=1)
def code_version() -> str:
    """A digest of every file a prediction is computed by (CODE) and of the Python, numpy and pydantic it runs on:
    any change to them starts a fresh cache directory."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(f"{sys.version}|{numpy.__version__}|{PYDANTIC_VERSION}".encode())
    for rel in CODE:
        top = root / rel
        files = sorted(p for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if top.is_dir() else [top]
        for f in files:
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


class DiskCache:
    """The twin's predictions on disk: a station's simulated Summary is a pure function of the fitted profile, the
    scenario, the knobs, N, warm-up, seed, the goal's SLOs and native-window rule and the code (`code_version`), and
    the key is a digest of them all (exact: `repr` of every value), so a hit is the Summary the simulation returns.
    A Summary that does not read back equal from its JSON is not kept. A write is a temporary file renamed into
    place, so concurrent processes never read half an entry. The directory: $TUNELOOP_TWIN_CACHE, else
    $XDG_CACHE_HOME/tuneloop/twin, else ~/.cache/tuneloop/twin; `TUNELOOP_TWIN_CACHE=off` keeps predictions in
    memory only (the benches that time a search turn it off)."""

    def __init__(self, root: Path):
        self.dir = Path(root) / code_version()
        self.hits = self.misses = 0
        self._pruned = False

    @classmethod
    def from_env(cls) -> DiskCache | None:
        where = os.environ.get(CACHE_ENV, "").strip()
        if where.lower() == "off":
            return None
        if not where:
            base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
            where = str(Path(base) / "tuneloop" / "twin")
        return cls(Path(where))

    @staticmethod
    def digest(model: Any) -> str:
        """A digest of a model's every value (`repr` of its dump): the part of a key that a fit or a scenario
        contributes, computed once per Twin and scenario rather than per station."""
        return hashlib.sha256(repr(model.model_dump()).encode()).hexdigest()

    @staticmethod
    def key(profile_digest: str, scenario_digest: str, knobs: dict[str, Any], n: int, warmup: int, seed: int,
            slos: dict[str, float] | None, rule: dict[str, Any]) -> str:
        parts = (profile_digest, scenario_digest, repr(sorted((k, repr(v)) for k, v in knobs.items())), n, warmup,
                 seed, repr(sorted((slos or {}).items())), repr(sorted(rule.items())))
        return hashlib.sha256(repr(parts).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> tuple[Summary, list[str]] | None:
        try:
            d = json.loads(self._path(key).read_text())
            got = Summary.model_validate(d["summary"]), list(d["knobs_not_modelled"])
        except (OSError, ValueError, KeyError, TypeError):  # absent, or unreadable: simulate (and write it afresh)
            self.misses += 1
            return None
        self.hits += 1
        return got

    def put(self, key: str, summary: Summary, left: list[str]) -> None:
        blob = json.dumps({"summary": canon(summary.model_dump()), "knobs_not_modelled": list(left)},
                          allow_nan=False)
        if Summary.model_validate(json.loads(blob)["summary"]) != summary:
            return  # a figure JSON does not carry exactly (a NaN): simulated again next time, never approximated
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".w-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                f.write(blob)
            os.replace(tmp, path)
        except OSError:  # a full or read-only disk costs a simulation next time, never the prediction
            return
        if not self._pruned:
            self._pruned = True
            self._prune()

    def _prune(self) -> None:
        """Mark this version used now and remove all but the VERSIONS_KEPT versions used last (a process still
        reading a removed one simulates again: a miss, never a wrong prediction)."""
        try:
            (self.dir / ".used").touch()
            versions = [d for d in self.dir.parent.iterdir() if d.is_dir()]
        except OSError:
            return

        def used(d: Path) -> float:
            try:
                return (d / ".used").stat().st_mtime
            except OSError:
                return 0.0

        for old in sorted(versions, key=used, reverse=True)[VERSIONS_KEPT:]:
            if old != self.dir:
                shutil.rmtree(old, ignore_errors=True)


@dataclass
class Twin:
    """One fit: the calibrated profile, the runs it came from, and its coefficient table."""

    profile: Profile
    prior: str
    runs: tuple[str, ...]
    table: list[tuple[str, float, float | None, str]]
    disk: DiskCache | None = None  # the predictions on disk (Twins gives its fits the user's; None: memory only)
    _cache: dict[str, dict[str, Any]] = field(default_factory=dict)
    _scenario_digests: dict[str, str] = field(default_factory=dict)  # the disk key's part per scenario
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @cached_property
    def _profile_digest(self) -> str:  # the disk key's part the fit contributes (a Twin's profile never changes)
        return DiskCache.digest(self.profile)

    def _disk_key(self, scenario: str, knobs: dict[str, Any], n: int, warmup: int, seed: int,
                  slos: dict[str, float] | None, rule: dict[str, Any]) -> str:
        assert self.disk is not None
        with self._lock:
            scen = self._scenario_digests.get(scenario)
        if scen is None:
            scen = DiskCache.digest(scenarios.load(scenario))
            with self._lock:
                self._scenario_digests[scenario] = scen
        return self.disk.key(self._profile_digest, scen, knobs, n, warmup, seed, slos, rule)

    def predict(self, scenario: str, knobs: dict[str, Any], n: int, warmup: int = 0, seed: int = 0,
                slos: dict[str, float] | None = None, native: tuple[int, float] | None = None) -> dict[str, Any]:
        """The twin's prediction of one station: `summary`, the whole Summary of its simulated run, made by the code
        that summarises a measured run (core.metrics.summarize) with the goal's SLOs (`slos`: goodput) and native
        window rule (`native`: its least requests and seconds), so every objective and every limit the goal may
        name is predicted at its own window and statistic; beside it the whole window's output tok/s (and per card),
        mean TPOT and TTFT, the cards in use and the knobs the simulator does not model."""
        key = (f"{scenario}|{sorted((k, repr(v)) for k, v in knobs.items())}|{n}|{warmup}|{seed}|"
               f"{sorted((slos or {}).items())}|{native}")
        with self._lock:
            got = self._cache.get(key)
        if got is None:
            rule = {} if native is None else {"native_min_requests": native[0], "native_min_seconds": native[1]}
            disk_key = self._disk_key(scenario, knobs, n, warmup, seed, slos, rule) if self.disk else ""
            stored = self.disk.get(disk_key) if self.disk else None
            if stored is not None:
                s, left = stored
            else:
                s, left = simulate_station(self.profile, scenario, knobs, n, warmup=warmup, seed=seed, slos=slos,
                                           **rule)
                if self.disk:
                    self.disk.put(disk_key, s, left)
            got = {"profile": self.profile.name, "summary": s, "cards": s.cards, "knobs_not_modelled": left,
                   "output_tok_s": s.whole.output_tok_s if s.whole else None,
                   "output_tok_s_per_card": s.whole.output_tok_s_per_card if s.whole else None,
                   "tpot_mean_ms": s.tpot_ms.mean, "ttft_mean_ms": s.ttft_ms.mean}
            with self._lock:
                self._cache[key] = got
        return got

    @property
    def origin(self) -> str:
        """Where the fit started: the prior's name, or how a derived prior was derived."""
        derived = self.profile.derived or {}
        return f"prior {derived['origin']}" if derived.get("origin") else f"prior profile {self.prior}"

    def coefficients(self) -> dict[str, tuple[float, float | None, str]]:
        """name -> (value, standard error, how it was fitted or why it was kept)."""
        return {name: (v, se, note) for name, v, se, note in self.table}


class Twins:
    """The fits of one executor, by (prior, runs); thread-safe (the service plans goals in threads)."""

    def __init__(self, runs_root: Path, disk: DiskCache | None | bool = True):
        """`disk`: the prediction cache its fits share (True: the user's, DiskCache.from_env; None: memory only)."""
        self.root = Path(runs_root)
        self.disk = DiskCache.from_env() if disk is True else disk or None
        self._fits: dict[tuple[str, tuple[str, ...]], Twin | str] = {}
        self._lock = threading.Lock()

    def fit(self, prior: str, run_ids: tuple[str, ...]) -> Twin | str:
        """The twin fitted on these runs from this prior; a str says why it could not be fitted."""
        key = (prior, tuple(run_ids))
        with self._lock:
            got = self._fits.get(key)
        if got is not None:
            return got
        got = self._fit(prior, run_ids)
        with self._lock:
            if len(self._fits) >= FITS_KEPT:
                self._fits.pop(next(iter(self._fits)))
            self._fits[key] = got
        return got

    def _fit(self, prior: str, run_ids: tuple[str, ...]) -> Twin | str:
        try:
            base = profiles.load(prior)
        except Exception as e:  # a prior that cannot be read: no twin, said once per fit
            return f"prior profile {prior!r} cannot be read: {e}"
        if not run_ids:  # the prior itself, before any run: what predicts the first run out of sample
            return Twin(profile=base, prior=prior, runs=(), table=[], disk=self.disk)
        dirs = [self.root / r for r in run_ids]
        missing = [r for r, d in zip(run_ids, dirs) if not d.is_dir()]
        if missing:
            return f"run directories not under {self.root}: {', '.join(missing)}"
        try:
            prof, table = calibrate_runs(dirs, prior, name=f"{base.name.removesuffix('-calibrated')}-twin")
        except Exception as e:  # runs the fit cannot use, or a solver failure: no twin this step, the rules lead
            return f"the fit failed: {type(e).__name__}: {e}"
        return Twin(profile=prof, prior=prior, runs=tuple(run_ids), table=table, disk=self.disk)


def prior_of(target: Any, sim_profile: str | None, root: Path | None = None) -> str | None:
    """The twin's prior for a goal on this target: its calibrated profile, else the simulated goal's profile (a
    simulated target's own `profile` when the goal names none), else - a real target that names its card kind - a
    prior derived from its model, card, engine and topology (executor/derived.py), written under `root`. None:
    nothing to start from (a real target that names no card). A real target whose prior cannot be derived raises
    FieldError saying why."""
    if target is None:
        return None
    cal = getattr(target, "calibrated_profile", None)
    if cal:
        return str(cal)
    if getattr(target, "kind", None) == "sim":
        return getattr(target, "twin_prior", None) or sim_profile or getattr(target, "profile", None)
    if root is None or not getattr(target, "card", None):  # no card kind named: nothing to derive from
        return None
    return str(write_derived(target, root))
