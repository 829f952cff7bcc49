"""The engine's own command for a station: what a person pastes into a shell to serve it without tuneloop.

It is the launch the executor renders (executor/templates.render, one adapter per engine under executor/engines/),
never a second rendering: each service's environment and argv shell-quoted (`shlex`), and the files an engine reads
(MindIE's config.json) written first by a quoted here-document, with their permission bits. Two sources:

* a run on a real target: the run's own `rendered.json`, the launch the executor recorded at prepare;
* a run on the simulator: the simulated profile's deployment (its engine, model and layout: `Profile.deployment`)
  rendered by that engine's adapter for the station's knobs, on placeholder hosts (`HOST_PREFILL_0`, ...) that a
  person replaces with their own (and, for a static expert layout, the operator's own recorder and fitter,
  `YOUR_EXPERT_LOAD_RECORDER` / `YOUR_EXPERT_MAP_FITTER`, in the relayout steps; vllm-ascend's P/D proxy from the
  operator's checkout, `YOUR_VLLM_ASCEND_SOURCE`).
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from core import profiles
from core.errors import FieldError
from core.station import Station
from executor.engines.base import Rendered, ServiceSpec
from executor.engines.vllm_ascend import PROXY as ASCEND_PROXY
from executor.targets import Host, Relayout, Target
from executor.templates import render

PORT = 8000  # every placeholder host serves on this port
STATION_FIELDS = ("hash", "engine", "knobs", "scenario", "data_version", "source_identity", "target")
HEREDOC = "TUNELOOP_EOF"  # the delimiter of a file's here-document (a file holding this line alone is refused)


class ServiceCommand(BaseModel):
    """One service of the launch: where it runs and the shell lines that start it there."""

    model_config = ConfigDict(frozen=True)
    name: str
    role: str
    host: str
    cards: int
    shell: str  # copy-pasteable: files first (here-documents), then the environment and the argv, shell-quoted


class EngineCommand(BaseModel):
    """The engine's command for one station, or why there is none."""

    model_config = ConfigDict(frozen=True)
    station: str | None = None
    engine: str | None = None
    source: str  # where it comes from: a run's recorded launch, or a profile's deployment
    services: tuple[ServiceCommand, ...] = ()
    # the expert relayout's steps that run before the services start (name, shell line), where the layout is static
    steps: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()  # what the operator must still provide (the adapter's rendering says)
    error: str | None = None  # no command: why (the adapter's refusal naming its field, no deployment, no run dir)

    def text(self) -> str:
        """Every service's lines, each headed by a comment naming the service, its host and its cards."""
        if self.error is not None:
            return f"# no engine command: {self.error}"
        notes = [f"# note: {w}" for w in self.warnings]
        steps = [f"# first, the expert layout: step {name}\n{line}" for name, line in self.steps]
        return "\n\n".join(notes + steps + [f"# {s.name} ({s.role}) on {s.host}, {s.cards} card(s)\n{s.shell}"
                                     for s in self.services])


def file_path(svc: ServiceSpec, name: str) -> str:
    """Where the engine reads a rendered file: the path its environment or argv names (MindIE's
    MIES_CONFIG_JSON_PATH), else the directory the command runs in (tuneloop's launcher starts each service in the
    directory its files are written to)."""
    for ref in [*svc.env.values(), *svc.argv]:
        if ref.endswith(f"/{name}"):
            return ref
    return f"./{name}"


def service_shell(svc: ServiceSpec) -> str:
    """The shell lines that start one service: its files, then `ENV=... argv...`, every word shell-quoted."""
    lines: list[str] = []
    for name, text in sorted(svc.files.items()):
        if HEREDOC in text.splitlines():
            raise FieldError("files", f"{svc.name}/{name} holds the line {HEREDOC!r}: no here-document can carry it")
        path = file_path(svc, name)
        parent = path.rsplit("/", 1)[0]
        if parent not in (".", ""):
            lines.append(f"mkdir -p {shlex.quote(parent)}")
        lines.append(f"cat > {shlex.quote(path)} <<'{HEREDOC}'\n{text.rstrip(chr(10))}\n{HEREDOC}")
        mode = svc.file_modes.get(name)
        if mode is not None:
            lines.append(f"chmod {mode:o} {shlex.quote(path)}")
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(svc.env.items())]
    lines.append(" ".join([*env, shlex.join(svc.argv)]))
    return "\n".join(lines)


def of_rendered(rendered: Rendered, source: str, station: str | None = None,
                engine: str | None = None) -> EngineCommand:
    """The command of a rendered launch: one entry per service, in start order (prefill, decode, router).
    `engine`: the target's engine where the launch names its family (vllm-ascend renders `vllm serve`)."""
    engine = engine or rendered.engine
    try:
        services = tuple(ServiceCommand(name=s.name, role=s.role, host=s.host, cards=s.cards, shell=service_shell(s))
                         for s in rendered.services)
    except FieldError as e:
        return EngineCommand(station=station, engine=engine, source=source, error=str(e))
    steps = tuple((r.name, shlex.join(r.argv)) for r in rendered.relayout)
    return EngineCommand(station=station, engine=engine, source=source, services=services, steps=steps,
                         warnings=rendered.warnings)


def profile_target(profile: profiles.Profile, knobs: dict[str, Any]) -> Target:
    """The deployment a simulated profile stands for, as a target of its engine: one placeholder host per instance
    (as many as the station's knobs deploy), the profile's cards per instance, the router and the load generator on
    a host of their own (or beside the one engine of a mixed deployment)."""
    d = profile.deployment
    if d is None:
        raise FieldError("deployment", f"profile {profile.name!r} does not say what it deploys (engine, model, card)")
    model = str(d.model.get("_name_or_path") or profile.name)
    hosts: list[Host] = []
    if profile.mixed:
        for i in range(int(knobs.get("num_decode_instances") or profile.decode.instances)):
            hosts.append(Host(host=f"HOST_MIXED_{i}", roles=("mixed",) + (("load",) if i == 0 else ()),
                              cards=profile.decode.cards_per_instance, port=PORT))
    else:
        for role, spec, key in (("prefill", profile.prefill, "num_prefill_instances"),
                                ("decode", profile.decode, "num_decode_instances")):
            for i in range(int(knobs.get(key) or spec.instances)):
                hosts.append(Host(host=f"HOST_{role.upper()}_{i}", roles=(role,), cards=spec.cards_per_instance,
                                  port=PORT))
        hosts.append(Host(host="HOST_ROUTER", roles=("router", "load"), cards=0, port=PORT))
    relayout = None
    if knobs.get("expert_layout") == "static_eplb":  # the operator's own tools record expert load and fit the map
        relayout = Relayout(collect=("YOUR_EXPERT_LOAD_RECORDER", "{stats}"),
                            fit=("YOUR_EXPERT_MAP_FITTER", "{stats}", "{layout}"))
    # vllm-ascend's P/D proxy is the example its source ships: the operator's checkout of it
    router = ("python3", f"YOUR_VLLM_ASCEND_SOURCE/{ASCEND_PROXY}") if d.engine == "vllm-ascend" else None
    return Target(name=f"{profile.name}-deployment", kind="local", engine=d.engine, model=model, hosts=tuple(hosts),
                  relayout=relayout, router_command=router)


def of_profile(profile_name: str, station: dict[str, Any]) -> EngineCommand:
    """A simulated station's command on the real engine its profile stands for (`Profile.deployment`)."""
    try:
        prof = profiles.load(profile_name)
        target = profile_target(prof, station["knobs"])
        st = Station(engine=target.engine, knobs=dict(station["knobs"]), scenario=station["scenario"],
                     data_version=station["data_version"], source_identity=station["source_identity"],
                     target=target.name)
        rendered = render(target, st)
    except (FieldError, ValueError, FileNotFoundError) as e:
        return EngineCommand(station=station.get("hash"), source=f"profile {profile_name}'s deployment", error=str(e))
    source = (f"profile {profile_name}'s deployment ({target.engine}, model {target.model}): the simulated station's "
              f"launch on that engine, on placeholder hosts HOST_* to replace with yours")
    return of_rendered(rendered, source, station.get("hash"), target.engine)


def work_file(run_dir: str | Path | None, name: str) -> Path | None:
    """A file the executor wrote at prepare (`rendered.json`, `station.json`) in the run's directory: `<runs
    root>/<run id>`, or the `load` folder inside it that the store keeps as the result's run_dir."""
    if run_dir is None:
        return None
    d = Path(run_dir)
    return next((p for p in (d / name, d.parent / name) if p.is_file()), None)


def of_run(run_dir: str | Path | None, station: Any = None, sim_profile: str | None = None) -> EngineCommand:
    """The station's command from the run that ran it: the launch its `rendered.json` recorded; a simulated run's
    from the profile it simulated (`sim_profile`, else the one its source identity names). `station`: the frozen
    station (a mapping or the store's record of it), else the run's own `station.json`."""
    if station is None:
        path = work_file(run_dir, "station.json")
        if path is None:
            return EngineCommand(source="the run's launch", error=f"no station.json under {run_dir}: the run directory "
                                 "is not on this machine (the runs root this was read from)")
        try:
            station = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            return EngineCommand(source=str(path), error=f"{path}: {e}")
    if not isinstance(station, dict):
        station = {k: getattr(station, k) for k in STATION_FIELDS}
    sid = str(station.get("source_identity") or "")
    if station.get("engine") == "sim" or sid.startswith("simulator:"):
        name = sim_profile or next((p.split("=", 1)[1] for p in sid.split(":") if p.startswith("profile=")), None)
        if name is None:
            return EngineCommand(station=station.get("hash"), source="the simulator",
                                 error="the simulated run names no profile")
        return of_profile(name, station)
    path = work_file(run_dir, "rendered.json")
    if path is None:
        return EngineCommand(station=station.get("hash"), source="the run's launch",
                             error=f"no rendered.json under {run_dir}: the run directory is not on this machine (the "
                                   "runs root this was read from)")
    try:
        rendered = Rendered.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        return EngineCommand(station=station.get("hash"), source=str(path), error=f"{path}: {e}")
    return of_rendered(rendered, f"the launch the executor recorded ({path})", station.get("hash"),
                       station.get("engine"))
