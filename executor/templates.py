"""Launch templates: pure rendering of engine command lines and config files from a station.

One renderer per engine family. Knob -> flag names come from the catalog's `engines` field, so
nothing here hard-codes a knob list. Output is argv (never a shell string) plus files to write,
so a value reaches the engine byte-exact; remote command strings are built later with shlex.
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from core.knobs import catalog
from core.station import LOAD_KNOBS, Station
from executor.targets import Host, Target, check_safe


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


class RelayoutStep(BaseModel):
    """One detached step of an expert relayout (collect statistics, fit a placement)."""

    model_config = ConfigDict(frozen=True)
    name: str
    argv: tuple[str, ...]


class Rendered(BaseModel):
    model_config = ConfigDict(frozen=True)
    services: tuple[ServiceSpec, ...]  # in start order: prefill, decode, then router
    endpoint: str  # base URL the load generator sends to
    metrics: dict[str, str] = {}  # role -> Prometheus URL scraped during the load
    engine: str
    relayout: tuple[RelayoutStep, ...] = ()  # run before the services start, when the layout changes


def layout_files(target: Target, station: Station) -> dict[str, str]:
    """Where a station's expert statistics and placement live on the target (keyed by its server hash)."""
    base = f"{target.root_for(None)}/layout/{station.server_hash}"  # relayout steps run on the load host
    return {"{stats}": f"{base}.stats.json", "{layout}": f"{base}.layout.json"}


def _fill(argv: tuple[str, ...], files: dict[str, str]) -> tuple[str, ...]:
    out = []
    for a in argv:
        for k, v in files.items():
            a = a.replace(k, v)
        out.append(a)
    return tuple(out)


def with_relayout(target: Target, station: Station, rendered: Rendered) -> Rendered:
    """A static expert layout declared by the target: collect / fit steps, and the engines load it."""
    if target.relayout is None or station.server_knobs.get("expert_layout") != "static_eplb":
        return rendered
    files = layout_files(target, station)
    steps = tuple(RelayoutStep(name=n, argv=_fill(getattr(target.relayout, n), files))
                  for n in ("collect", "fit") if getattr(target.relayout, n))
    extra = _fill(target.relayout.load, files)
    services = tuple(s.model_copy(update={"argv": s.argv + extra}) if s.role != "router" and extra else s
                     for s in rendered.services)
    return rendered.model_copy(update={"services": services, "relayout": steps})


def svc_dir(target: Target, name: str, host: str | None = None) -> str:
    """A service's directory under the run root of the host it runs on."""
    return f"{target.root_for(host)}/svc/{name}"


def _fmt(v: Any) -> str:
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
        if knob.role is not None and role not in (knob.role, "mixed"):
            continue
        out.append((flag, value))
    return out


def _generic(pairs: list[tuple[str, Any]], no_prefix: str = "--no-") -> list[str]:
    argv: list[str] = []
    for flag, value in pairs:
        if isinstance(value, bool):
            argv.append(flag if value else no_prefix + flag[2:])
        else:
            argv += [flag, _fmt(value)]
    return argv


def _env(target: Target, host: Host, visible: str) -> dict[str, str]:
    env = dict(target.env)
    if host.devices:
        env[visible] = host.devices
    return env


# ---- tuneloop sim serve -------------------------------------------------------------------------

def render_sim(target: Target, station: Station, faults: tuple[str, ...] = (), expected_requests: int | None = None) -> Rendered:
    hosts = target.hosts_for("mixed") or target.hosts_for("prefill") or list(target.hosts)
    host = hosts[0] if hosts else Host(host="sim", roles=("mixed", "load"), cards=0, port=1)  # virtual-time target
    argv = list(target.tuneloop or ("tuneloop",)) + ["sim", "serve", "--profile", target.profile, "--scenario-free",
                                                     "--port", str(host.port), "--time-scale", _fmt(target.time_scale)]
    for flag, value in knob_flags(station.server_knobs, "sim", "mixed"):
        argv += ["--knob", f"{flag}={_fmt(value)}"]
    for f in faults:
        argv += ["--fault", f]
    if expected_requests and any(f.startswith("crash_at") for f in faults):
        argv += ["--expected-requests", str(expected_requests)]  # crash_at=F crashes after F * N requests
    url = f"http://{host.host}:{host.port}"
    svc = ServiceSpec(name="sim-0", role="mixed", host=host.host, port=host.port, argv=tuple(argv), cards=host.cards)
    return Rendered(services=(svc,), endpoint=url, metrics={"mixed": f"{url}/metrics"}, engine="sim")


# ---- vLLM and vLLM-Ascend: `vllm serve`, PD through a KV connector ------------------------------

def _vllm_knob_args(knobs: dict[str, Any], role: str) -> list[str]:
    pairs, spec = [], {}
    for flag, value in knob_flags(knobs, "vllm", role):
        if flag.startswith("--speculative-config."):
            spec[flag.split(".", 1)[1]] = value
        elif flag == "--enable-eplb":
            if value == "static_eplb":
                pairs.append((flag, True))
        else:
            pairs.append((flag, value))
    argv = _generic(pairs)
    if spec.get("method") not in (None, "none"):
        spec = {k: v for k, v in spec.items() if v is not None}
        argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    return argv


def render_vllm(target: Target, station: Station, faults: tuple[str, ...] = ()) -> Rendered:
    ascend = target.engine == "vllm-ascend"
    connector = target.pd_connector or ("MooncakeConnectorV1" if ascend else "NixlConnector")
    visible = "ASCEND_RT_VISIBLE_DEVICES" if ascend else "CUDA_VISIBLE_DEVICES"
    services: list[ServiceSpec] = []
    roles = ("prefill", "decode") if target.pd else ("mixed",)
    for role in roles:
        for i, host in enumerate(target.hosts_for(role) or list(target.hosts)):
            argv = ["vllm", "serve", str(target.model), "--host", "0.0.0.0", "--port", str(host.port)]
            if target.pd:
                kv = {"kv_connector": connector, "kv_role": "kv_producer" if role == "prefill" else "kv_consumer"}
                if connector == "NixlConnector":
                    kv["kv_role"] = "kv_both"
                argv += ["--kv-transfer-config", json.dumps(kv, sort_keys=True, separators=(",", ":"))]
            argv += _vllm_knob_args(station.server_knobs, role) + list(target.extra_args.get(role, ()))
            trace = f"{svc_dir(target, f'{role}-{i}', host.host)}/trace"
            # dev mode mounts /reset_prefix_cache; a profiler dir mounts /start_profile and /stop_profile
            env = _env(target, host, visible) | {"VLLM_SERVER_DEV_MODE": "1", "VLLM_TORCH_PROFILER_DIR": trace}
            services.append(ServiceSpec(name=f"{role}-{i}", role=role, host=host.host, port=host.port,
                                        argv=tuple(argv), env=env, cards=host.cards, profile_dir=trace))
    return _with_router(target, services, "vllm", _vllm_router)


def _vllm_router(target: Target, router: Host, ps: list[ServiceSpec], ds: list[ServiceSpec]) -> list[str]:
    argv = ["python", "-m", "vllm_router.toy_proxy_server", "--host", "0.0.0.0", "--port", str(router.port),
            "--prefiller-hosts", *[s.host for s in ps], "--prefiller-ports", *[str(s.port) for s in ps],
            "--decoder-hosts", *[s.host for s in ds], "--decoder-ports", *[str(s.port) for s in ds]]
    return argv + list(target.extra_args.get("router", ()))


def _with_router(target: Target, services: list[ServiceSpec], engine: str,
                 router_argv: Callable[[Target, Host, list[ServiceSpec], list[ServiceSpec]], list[str]]) -> Rendered:
    metrics = {s.role: f"http://{s.host}:{s.port}/metrics" for s in services}
    if target.pd:
        routers = target.hosts_for("router")
        if not routers:
            raise ValueError("hosts: a prefill/decode target needs a host with the role 'router'")
        r = routers[0]
        ps = [s for s in services if s.role == "prefill"]
        ds = [s for s in services if s.role == "decode"]
        services.append(ServiceSpec(name="router-0", role="router", host=r.host, port=r.port,
                                    argv=tuple(router_argv(target, r, ps, ds)), env=dict(target.env)))
        endpoint = f"http://{r.host}:{r.port}"
    else:
        endpoint = f"http://{services[0].host}:{services[0].port}"
    return Rendered(services=tuple(services), endpoint=endpoint, metrics=metrics, engine=engine)


# ---- SGLang: `python -m sglang.launch_server --disaggregation-mode prefill|decode` + router -----

def _sglang_knob_args(knobs: dict[str, Any], role: str) -> list[str]:
    argv: list[str] = []
    spec_method, k = None, 0
    for flag, value in knob_flags(knobs, "sglang", role):
        if flag == "--disable-radix-cache":
            if value is False:  # the catalog's knob is "enable"; SGLang's flag says "disable"
                argv.append(flag)
        elif flag == "--enable-eplb":
            if value == "static_eplb":
                argv.append(flag)
        elif flag == "--speculative-algorithm":
            spec_method = value
        elif flag == "--speculative-num-draft-tokens":
            k = int(value)
        elif isinstance(value, bool):
            if value:
                argv.append(flag)
        else:
            argv += [flag, _fmt(value)]
    if spec_method not in (None, "none") and k > 0:
        # DeepSeek MTP runs as EAGLE with the model's NextN heads: k steps, top-1, k + 1 draft tokens
        argv += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(k),
                 "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(k + 1)]
    return argv


def render_sglang(target: Target, station: Station, faults: tuple[str, ...] = ()) -> Rendered:
    services: list[ServiceSpec] = []
    roles = ("prefill", "decode") if target.pd else ("mixed",)
    for role in roles:
        for i, host in enumerate(target.hosts_for(role) or list(target.hosts)):
            argv = ["python", "-m", "sglang.launch_server", "--model-path", str(target.model),
                    "--host", "0.0.0.0", "--port", str(host.port), "--enable-metrics"]
            if target.pd:
                argv += ["--disaggregation-mode", role,
                         "--disaggregation-transfer-backend", target.pd_connector or "mooncake"]
            argv += _sglang_knob_args(station.server_knobs, role) + list(target.extra_args.get(role, ()))
            trace = f"{svc_dir(target, f'{role}-{i}', host.host)}/trace"
            env = _env(target, host, "CUDA_VISIBLE_DEVICES") | {"SGLANG_TORCH_PROFILER_DIR": trace}
            services.append(ServiceSpec(name=f"{role}-{i}", role=role, host=host.host, port=host.port, argv=tuple(argv),
                                        env=env, cards=host.cards, profile_dir=trace))
    return _with_router(target, services, "sglang", _sglang_router)


def _sglang_router(target: Target, router: Host, ps: list[ServiceSpec], ds: list[ServiceSpec]) -> list[str]:
    argv = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation", "--host", "0.0.0.0",
            "--port", str(router.port)]
    for s in ps:
        argv += ["--prefill", f"http://{s.host}:{s.port}"]
    for s in ds:
        argv += ["--decode", f"http://{s.host}:{s.port}"]
    return argv + list(target.extra_args.get("router", ()))


# ---- MindIE (vLLM-Ascend family PD on Ascend): a config.json file + the daemon ------------------

MINDIE_SECTIONS = {"ScheduleConfig": ("BackendConfig", "ScheduleConfig"),
                   "ModelConfig": ("BackendConfig", "ModelDeployConfig", "ModelConfig", 0)}


def mindie_config(target: Target, station: Station, role: str, host: Host) -> dict[str, Any]:
    model: dict[str, Any] = {"modelName": str(target.model).rstrip("/").split("/")[-1], "modelWeightPath": target.model,
                             "worldSize": max(host.cards, 1), "npuMemSize": -1}
    cfg: dict[str, Any] = {
        "ServerConfig": {"ipAddress": "0.0.0.0", "port": host.port, "managementPort": host.port + 1,
                         "metricsPort": host.port + 2, "httpsEnabled": False, "inferMode": "dmi" if target.pd else "standard"},
        "BackendConfig": {"npuDeviceIds": [[int(d) for d in (host.devices or "0").split(",")]],
                          "ModelDeployConfig": {"ModelConfig": [model]},
                          "ScheduleConfig": {}},
    }
    if target.pd:
        cfg["ServerConfig"]["pdRole"] = role
    for key, value in knob_flags(station.server_knobs, "mindie", role):
        section, field = key.split(".", 1)
        node: Any = cfg
        for step in MINDIE_SECTIONS[section]:
            node = node[step]
        if field == "npuMemSize":  # the catalog's knob is a memory fraction; MindIE sizes KV itself (-1)
            continue
        node[field] = value
    return cfg


def render_mindie(target: Target, station: Station, faults: tuple[str, ...] = ()) -> Rendered:
    services: list[ServiceSpec] = []
    roles = ("prefill", "decode") if target.pd else ("mixed",)
    for role in roles:
        for i, host in enumerate(target.hosts_for(role) or list(target.hosts)):
            name = f"{role}-{i}"
            conf = f"{svc_dir(target, name, host.host)}/config.json"
            env = _env(target, host, "ASCEND_RT_VISIBLE_DEVICES") | {"MIES_CONFIG_JSON_PATH": conf}
            text = json.dumps(mindie_config(target, station, role, host), indent=2, sort_keys=True)
            services.append(ServiceSpec(name=name, role=role, host=host.host, port=host.port,
                                        argv=("mindieservice_daemon",), env=env, files={"config.json": text},
                                        health_path="/health", cards=host.cards))
    return _with_router(target, services, "mindie", _vllm_router)


# ---- llama.cpp `llama-server` -------------------------------------------------------------------

def render_llamacpp(target: Target, station: Station, faults: tuple[str, ...] = ()) -> Rendered:
    host = target.hosts[0]
    argv = [*(target.engine_command or ("llama-server",)), "--host", "0.0.0.0", "--port", str(host.port), "--metrics"]
    if target.model:
        argv += ["-m", target.model]
    argv += ["--slot-save-path", "."]  # without it llama-server answers 501 to slot erase (the prefix-cache flush)
    argv += _generic(knob_flags(station.server_knobs, "llamacpp", "mixed")) + list(target.extra_args.get("mixed", ()))
    svc = ServiceSpec(name="mixed-0", role="mixed", host=host.host, port=host.port, argv=tuple(argv),
                      env=dict(target.env), cards=host.cards)
    url = f"http://{host.host}:{host.port}"
    return Rendered(services=(svc,), endpoint=url, metrics={"mixed": f"{url}/metrics"}, engine="llamacpp")


RENDERERS: dict[str, Callable[..., Rendered]] = {
    "sim": render_sim, "vllm": render_vllm, "vllm-ascend": render_vllm, "sglang": render_sglang,
    "mindie": render_mindie, "llamacpp": render_llamacpp,
}
ENGINE_KEY = {"sim": "sim", "vllm": "vllm", "vllm-ascend": "vllm", "sglang": "sglang", "mindie": "mindie",
              "llamacpp": "llamacpp"}


def render(target: Target, station: Station, faults: tuple[str, ...] = (), expected_requests: int | None = None) -> Rendered:
    """Render every service of the target for this station. Extra argv strings are checked too."""
    template = target.template or target.engine
    if template not in RENDERERS:
        raise ValueError(f"template: {template!r} is not one of {sorted(RENDERERS)}")
    for role, args in target.extra_args.items():
        for a in args:
            if "\x00" in a:
                raise ValueError(f"extra_args.{role}: NUL byte in {a!r}")
    for name, args in (target.relayout.model_dump() if target.relayout else {}).items():
        for a in args:
            if "\x00" in a:
                raise ValueError(f"relayout.{name}: NUL byte in {a!r}")
    for f in faults:
        check_safe("faults", f)
    if template == "sim":
        return with_relayout(target, station, render_sim(target, station, tuple(faults), expected_requests))
    return with_relayout(target, station, RENDERERS[template](target, station, tuple(faults)))
