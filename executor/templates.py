"""Launch templates: pure rendering of engine command lines and config files from a station.

Each engine's rendering lives in its adapter (executor/engines/<engine>.py); this module is the one entry
point the executor calls (`render`), plus the expert-relayout steps a target declares. Knob -> flag names
come from the catalog's `engines` field. Output is argv (never a shell string) plus files to write, so a
value reaches the engine byte-exact; remote command strings are built later with shlex.
"""
from __future__ import annotations

from typing import Callable

from core.errors import FieldError
from core.station import Station
from executor.engines import ADAPTERS
from executor.engines.base import (RelayoutStep, Rendered, ServiceSpec, knob_flags, layout_files, service_layout,
                                   svc_dir)
from executor.targets import Target, check_safe

__all__ = ["ENGINE_KEY", "RENDERERS", "RelayoutStep", "Rendered", "ServiceSpec", "knob_flags", "layout_files",
           "render", "service_layout", "svc_dir", "with_relayout"]


def _fill(argv: tuple[str, ...], files: dict[str, str]) -> tuple[str, ...]:
    out = []
    for a in argv:
        for k, v in files.items():
            a = a.replace(k, v)
        out.append(a)
    return tuple(out)


def with_relayout(target: Target, station: Station, rendered: Rendered) -> Rendered:
    """A static expert layout declared by the target: collect once, fit one map per role and expert-parallel rank
    count (a step per map, `{role}`, `{ep}` and that map's `{layout}` filled in), and each engine loads its own."""
    if target.relayout is None or station.server_knobs.get("expert_layout") != "static_eplb":
        return rendered
    engines = [s for s in rendered.services if s.role != "router"]
    steps = [RelayoutStep(name="collect", argv=_fill(target.relayout.collect, layout_files(target, station)))
             ] if target.relayout.collect else []
    if target.relayout.fit:
        maps: dict[str, dict[str, str]] = {}
        for s in engines:
            files = service_layout(target, station, s)
            maps.setdefault(files["{layout}"], files)
        for files in maps.values():
            name = f"fit-{files['{role}']}-ep{files['{ep}']}" if "{role}" in files else "fit"
            steps.append(RelayoutStep(name=name, argv=_fill(target.relayout.fit, files)))
    services = tuple(s.model_copy(update={"argv": s.argv + _fill(target.relayout.load,
                                                                 service_layout(target, station, s))})
                     if s.role != "router" and target.relayout.load else s for s in rendered.services)
    return rendered.model_copy(update={"services": services, "relayout": tuple(steps)})


RENDERERS: dict[str, Callable[..., Rendered]] = {name: a.render for name, a in ADAPTERS.items()}
ENGINE_KEY = {name: a.knob_key for name, a in ADAPTERS.items()}


def render(target: Target, station: Station, faults: tuple[str, ...] = (), expected_requests: int | None = None) -> Rendered:
    """Render every service of the target for this station. Extra argv strings are checked too."""
    template = target.template or target.engine
    if template not in RENDERERS:
        raise FieldError("template", f"{template!r} is not one of {sorted(RENDERERS)}")
    for role, args in target.extra_args.items():
        for a in args:
            if "\x00" in a:
                raise FieldError(f"extra_args.{role}", f"NUL byte in {a!r}")
    for name, args in (target.relayout.model_dump() if target.relayout else {}).items():
        for a in args:
            if "\x00" in a:
                raise FieldError(f"relayout.{name}", f"NUL byte in {a!r}")
    for f in faults:
        check_safe("faults", f)
    return with_relayout(target, station, RENDERERS[template](target, station, tuple(faults), expected_requests))
