"""What every engine adapter shares: the rendered-launch models, knob -> flag pairs, and the adapter base.

An adapter (one module per engine under executor/engines/) alone knows its engine: the catalog key of
its flags, how a station renders to argv / config files, the version it was written against, how to
ask a running engine its version, how to empty its prefix cache (and what counts as emptied), which
metric names feed which evidence key, its profiler routes and the cards its services hold.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from core.errors import FieldError
from core.knobs import catalog
from core.station import LOAD_KNOBS, Station
from executor.targets import Host, Target


class ServiceSpec(BaseModel):
    """One process to keep running on one host (an engine instance or a router)."""

    model_config = ConfigDict(frozen=True)
    name: str  # unique within the target, also the target-side service directory
    role: str
    host: str
    port: int
    argv: tuple[str, ...]
    env: dict[str, str] = {}
    files: dict[str, str] = {}  # file name in the service directory -> content
    health_path: str = "/health"
    cards: int = 0
    profile_dir: str | None = None  # where the engine's profiler writes traces (/start_profile../stop_profile)
    # the expert-parallel rank count a static expert map is fitted for (one map per role and count); left out of
    # dumps while unset
    expert_ranks: int | None = Field(None, exclude_if=lambda v: v is None)
    # the port the health route answers on when it is not `port` (MindIE: its management port); left out of
    # dumps while unset, so the rendered launch (and the service key hashed from it) of other engines stays as it was
    health_port: int | None = Field(None, exclude_if=lambda v: v is None)
    # file name -> permission bits where a file must not be written 0644 (MindIE refuses a config.json above 0640)
    file_modes: dict[str, int] = Field({}, exclude_if=lambda v: not v)
    # a process of a multi-host instance that is not its API server (vLLM's --headless workers, SGLang's node ranks
    # above 0): the service whose API serves its ranks. It is flushed and profiled through that one, never itself;
    # left out of dumps while unset (executor/engines/topology.py)
    leader: str | None = Field(None, exclude_if=lambda v: v is None)
    # the host the health route answers on when it is not `host` (a headless worker: its leader's); out of dumps
    # while unset
    health_host: str | None = Field(None, exclude_if=lambda v: v is None)
    # the name it is scraped under where that is not `name` (a rank endpoint `decode-0.r3`, a node `decode-0.n1`);
    # a follower with none is not scraped (its leader's /metrics carries its ranks); out of dumps while unset
    metrics_name: str | None = Field(None, exclude_if=lambda v: v is None)


class RelayoutStep(BaseModel):
    """One detached step of an expert relayout (collect statistics, fit a placement)."""

    model_config = ConfigDict(frozen=True)
    name: str
    argv: tuple[str, ...]


class Rendered(BaseModel):
    model_config = ConfigDict(frozen=True)
    services: tuple[ServiceSpec, ...]  # in start order: prefill, decode, then router
    endpoint: str  # base URL the load generator sends to
    # service name (prefill-0, decode-1, ...) -> Prometheus URL scraped during the load: every engine instance of
    # every role, each kept apart in the run's samples (its role is the name's prefix)
    metrics: dict[str, str] = {}
    engine: str
    relayout: tuple[RelayoutStep, ...] = ()  # run before the services start, when the layout changes
    # what the operator must still provide for this deployment to work as measured (the deploy phase records
    # them); left out of dumps while empty
    warnings: tuple[str, ...] = Field((), exclude_if=lambda v: not v)


ENGINE_ROLES = ("prefill", "decode", "mixed")  # roles whose services hold cards and a KV cache


def layout_files(target: Target, station: Station, role: str | None = None,
                 ranks: int | None = None) -> dict[str, str]:
    """Where a station's expert statistics and placement live on the target (keyed by its server hash). With a
    role: that role's own map, fitted for its expert-parallel rank count (`{ep}`): prefill at EP 4 and decode at EP 8
    cannot load one map, since the map places each expert on a rank of that role's instance."""
    base = f"{target.root_for(None)}/layout/{station.server_hash}"  # relayout steps run on the load host
    out = {"{stats}": f"{base}.stats.json", "{layout}": f"{base}.layout.json"}
    if role is not None:
        out |= {"{layout}": f"{base}.{role}-ep{ranks}.layout.json", "{role}": role, "{ep}": str(ranks)}
    return out


def static_layout_path(target: Target, station: Station, engine: str, role: str, ranks: int) -> str:
    """The fitted expert map one role's instances load (one per role and rank count); the target's relayout
    steps must produce it."""
    if target.relayout is None or not (target.relayout.collect or target.relayout.fit):
        raise FieldError("expert_layout", f"static_eplb on {engine} loads a fitted expert map, so the target needs "
                         "relayout.collect / relayout.fit steps that write {layout}")
    return layout_files(target, station, role, ranks)["{layout}"]


def service_layout(target: Target, station: Station, svc: "ServiceSpec") -> dict[str, str]:
    """The layout files of one service: its role's map at its rank count, or the station's one map where the
    adapter named no rank count (an engine loading the map only through the target's relayout.load)."""
    if svc.expert_ranks is None:
        return layout_files(target, station)
    return layout_files(target, station, svc.role, svc.expert_ranks)


def svc_dir(target: Target, name: str, host: str | None = None) -> str:
    """A service's directory under the run root of the host it runs on."""
    return f"{target.root_for(host)}/svc/{name}"


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return "inf" if math.isinf(v) else repr(v)
    return str(v)


def knob_flags(knobs: dict[str, Any], engine_key: str, role: str) -> list[tuple[str, Any]]:
    """(flag, value) for every server knob that this engine has and that applies to this role."""
    cat = catalog()
    out = []
    for name, value in knobs.items():
        if name in LOAD_KNOBS or name not in cat:
            continue
        knob = cat.get(name)
        flag = knob.engines.get(engine_key)
        if flag is None or value is None:
            continue
        if knob.side is not None and not knob.both_sides and role not in (knob.side, "mixed"):
            continue
        out.append((flag, value))
    return out


def parallel_sizes(knobs: dict[str, Any], host: Host, where: str) -> tuple[int, int]:
    """(tensor-parallel, data-parallel) width of one instance; TP defaults to the instance's cards / DP, so a
    4-card instance never launches at TP=1. A size that does not match the instance's cards is refused."""
    dp = int(knobs.get("data_parallel_size") or 1)
    tp = knobs.get("tensor_parallel_size")
    cards = host.cards
    if tp is None:
        if cards and cards % dp:
            raise FieldError("data_parallel_size", f"{dp} does not divide the {cards} cards of {where}")
        return (max(cards // dp, 1) if cards else 1), dp
    if cards and int(tp) * dp != cards:
        raise FieldError("tensor_parallel_size", f"{tp} x data_parallel_size {dp} = {int(tp) * dp}, "
                         f"but {where} has {cards} cards")
    return int(tp), dp


def generic_argv(pairs: list[tuple[str, Any]], no_prefix: str = "--no-") -> list[str]:
    argv: list[str] = []
    for flag, value in pairs:
        if isinstance(value, bool):
            argv.append(flag if value else no_prefix + flag[2:])
        else:
            argv += [flag, fmt(value)]
    return argv


def device_env(target: Target, host: Host, visible: str) -> dict[str, str]:
    env = dict(target.env)
    if host.devices:
        env[visible] = host.devices
    return env


def instances(target: Target) -> list[tuple[str, int, Host]]:
    """(role, index, host) of every engine instance: prefill then decode for a PD target, else one mixed role."""
    roles = ("prefill", "decode") if target.pd else ("mixed",)
    return [(role, i, host) for role in roles for i, host in enumerate(target.hosts_for(role) or list(target.hosts))]


RouterArgv = Callable[[Target, Host, list[ServiceSpec], list[ServiceSpec]], list[str]]


def with_router(target: Target, services: list[ServiceSpec], engine: str, router_argv: RouterArgv,
                router_health: str = "/health") -> Rendered:
    """A PD deployment gets its router (on the host with the role 'router'), polled at `router_health` (the
    route its router serves); the endpoint is the router. Every engine instance is scraped under its own service
    name (a P8 + D8 deployment has 16 scrape targets)."""
    metrics = {s.metrics_name or s.name: f"http://{s.host}:{s.port}/metrics" for s in services
               if s.leader is None or s.metrics_name is not None}
    if target.pd:
        routers = target.hosts_for("router")
        if not routers:
            raise FieldError("hosts", "a prefill/decode target needs a host with the role 'router'")
        r = routers[0]
        ps = [s for s in services if s.role == "prefill" and s.leader is None]  # each instance's (or rank's) API
        ds = [s for s in services if s.role == "decode" and s.leader is None]
        services.append(ServiceSpec(name="router-0", role="router", host=r.host, port=r.port,
                                    argv=tuple(router_argv(target, r, ps, ds)), env=dict(target.env),
                                    health_path=router_health))
        endpoint = f"http://{r.host}:{r.port}"
    else:
        endpoint = f"http://{services[0].host}:{services[0].port}"
    return Rendered(services=tuple(services), endpoint=endpoint, metrics=metrics, engine=engine)


def success_answer(status: int | None, body: str) -> bool:
    """A 2xx answer whose JSON body says {"success": true} (vLLM's /reset_prefix_cache answers 200 with
    {"success": false} while blocks are still held, vllm/entrypoints/serve/dev/cache/api_router.py)."""
    if status is None or not 200 <= status < 300:
        return False
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and answer.get("success") is True


PY_VERSION = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"


class Adapter:
    """One engine. Subclasses set the class attributes and override what differs."""

    name: str = ""  # the target's `engine`
    knob_key: str = ""  # the key of this engine's flags in core/knobs.yaml `engines`
    pinned: str = ""  # the upstream version the rendering and metric names were written against
    flush_path: str | None = None  # POST route that empties the prefix cache (None: no route, restart instead)
    # evidence key -> metric names, first present wins (executor/evidence.py reads these)
    metrics: dict[str, tuple[str, ...]] = {}
    profile_routes: tuple[str, str] | None = None  # (start, stop) POST routes of the engine's profiler
    # the engine's own default per catalog knob: a station value equal to it is not rendered
    defaults: dict[str, Any] = {}
    # knobs the engine sizes itself when the flag is absent: the catalog default stands for "let the engine
    # decide" and is not rendered (e.g. SGLang computes --mem-fraction-static from the GPU when it is absent)
    automatic: frozenset[str] = frozenset()

    def changed_knobs(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """The station's server knobs less those the engine would take anyway (only differences are rendered)."""
        cat = catalog()
        out = {}
        for name, value in knobs.items():
            if name in self.defaults and value == self.defaults[name]:
                continue
            if name in self.automatic and name in cat and value == cat.get(name).default:
                continue
            out[name] = value
        return out

    def render(self, target: Target, station: Station, faults: tuple[str, ...] = (),
               expected_requests: int | None = None) -> Rendered:
        raise NotImplementedError

    # -- source identity -------------------------------------------------------------------------
    def version_probe(self, argv: tuple[str, ...], python: str) -> list[str] | None:
        """The command that makes this engine state its version, or None when it has none."""
        return None

    def parse_version(self, out: str) -> str | None:
        """The version from the probe's output (the last line, when it looks like a version)."""
        text = out.strip()
        if not text:
            return None
        last = text.splitlines()[-1].strip()  # vllm prints log lines before the bare version
        return last if re.fullmatch(r"[0-9][0-9A-Za-z.+\-_]*", last) else None

    # -- prefix cache ----------------------------------------------------------------------------
    def flushed(self, status: int | None, body: str) -> bool:
        """Whether the flush answer means the cache is empty."""
        return status is not None and 200 <= status < 300

    async def flush(self, probe: Any, svc: ServiceSpec) -> dict[str, Any]:
        """One service's flush; `ok` False means the caller must restart it to get an empty cache."""
        if self.flush_path is None:
            return {"service": svc.name, "method": None, "status": None, "ok": False}
        status, body = await probe.http(svc, "POST", self.flush_path)
        return {"service": svc.name, "method": f"POST {self.flush_path}", "status": status,
                "ok": self.flushed(status, body)}

    # -- cards -----------------------------------------------------------------------------------
    def cards_in_use(self, rendered: Rendered) -> int:
        """The cards of the engine services (routers and load hosts hold none)."""
        return sum(s.cards for s in rendered.services if s.role in ENGINE_ROLES)
