"""The embedded simulator (`tuneloop sim serve`): every catalog knob of the sim as `--knob NAME=VALUE`."""
from __future__ import annotations

from core.station import Station
from executor.engines.base import Adapter, Rendered, ServiceSpec, fmt, knob_flags, success_answer
from executor.targets import Host, Target


class Sim(Adapter):
    name = "sim"
    knob_key = "sim"
    pinned = "tuneloop simulator (this repository)"
    flush_path = "/reset_prefix_cache"  # answered like vLLM's: {"success": true}

    def render(self, target: Target, station: Station, faults: tuple[str, ...] = (),
               expected_requests: int | None = None) -> Rendered:
        hosts = target.hosts_for("mixed") or target.hosts_for("prefill") or list(target.hosts)
        host = hosts[0] if hosts else Host(host="sim", roles=("mixed", "load"), cards=0, port=1)  # virtual-time target
        argv = list(target.tuneloop or ("tuneloop",)) + ["sim", "serve", "--profile", target.profile, "--scenario-free",
                                                         "--port", str(host.port), "--time-scale", fmt(target.time_scale)]
        for flag, value in knob_flags(station.server_knobs, self.knob_key, "mixed"):
            argv += ["--knob", f"{flag}={fmt(value)}"]  # the simulator's defaults are the catalog's: all rendered
        for f in faults:
            argv += ["--fault", f]
        if expected_requests and any(f.startswith("crash_at") for f in faults):
            argv += ["--expected-requests", str(expected_requests)]  # crash_at=F crashes after F * N requests
        url = f"http://{host.host}:{host.port}"
        svc = ServiceSpec(name="sim-0", role="mixed", host=host.host, port=host.port, argv=tuple(argv), cards=host.cards)
        return Rendered(services=(svc,), endpoint=url, metrics={"mixed": f"{url}/metrics"}, engine="sim")


    def flushed(self, status: int | None, body: str) -> bool:
        return success_answer(status, body)


ADAPTER = Sim()
