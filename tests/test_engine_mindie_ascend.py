"""MindIE and vLLM-Ascend PD as their upstream documents them, beyond the argv: MindIE's config.json carries every
field MindIE marks required, is written 0640 (MindIE refuses a looser config file), and the service is probed and
scraped where MindIE answers (health on the management port, Prometheus on the metrics port with
MIES_SERVICE_MONITOR_MODE=1); a vLLM-Ascend PD deployment whose target leaves the HCCL / socket interfaces unset
says so in its deploy record, naming each variable, and deploys anyway.

No engine runs here: the config-file mode and the health routing go through the real LocalTransport (a `sleep`
stands in for the daemon, a stdlib HTTP server for MindIE's management port), and the deploy warning through a
real executor run whose engines and proxy are sleeping processes.
"""
from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from ports_support import free_port, free_ports

from core.journal import as_record
from core.station import Station, full_knobs
from core.trial import TrialSpec
from executor.engines.mindie import CONFIG_MODE, HEALTH_PATH, MINDIE_SECTIONS, REQUIRED
from executor.engines.vllm_ascend import HCCL_NETWORK_ENV
from executor.phases import ExecSettings
from executor.runner import Executor
from executor.targets import Host, Target
from executor.templates import render
from executor.transports.base import health_target
from executor.transports.local import LocalTransport
from state.store import Store

PY = sys.executable
SLEEP = (PY, "-c", "import time; time.sleep(60)")  # extra argv ("serve", the model, flags) lands in sys.argv
SCENARIO = "name: tiny-copy\nversion: 1\ntask: copy\ninput_len: 256\noutput_len: 16\nseed: 7\n"
HCCL_ENV = {"HCCL_IF_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo",
            "HCCL_SOCKET_IFNAME": "lo"}


def _station(engine: str, knobs: dict, key: str | None = None) -> Station:
    return Station(engine=engine, knobs=full_knobs(knobs, key or engine), scenario="copy16k-zero-cache",
                   data_version="d", source_identity="s", target="c")


def _mindie(run_root: str = "/srv/tl", host: str = "10.0.0.1", port: int = 1025) -> Target:
    return Target(name="m", kind="local", engine="mindie", model="/models/dsv4", run_root=run_root,
                  hosts=(Host(host=host, roles=("mixed", "load"), cards=8, port=port, devices="0,1,2,3,4,5,6,7"),))


def _mindie_rendered(**kw):
    rendered = render(_mindie(**kw), _station("mindie", {"max_num_batched_tokens": 16384, "max_num_seqs": 72}))
    (svc,) = rendered.services
    return rendered, svc, json.loads(svc.files["config.json"])


def _walk(cfg: dict, section: str):
    node = cfg
    for step in MINDIE_SECTIONS[section]:
        node = node[step]
    return node


def test_mindie_config_carries_every_field_mindie_documents_as_required():
    _, _, cfg = _mindie_rendered()
    assert set(REQUIRED) >= {"ServerConfig", "BackendConfig", "ModelDeployConfig", "ModelConfig", "ScheduleConfig"}
    for section, fields in REQUIRED.items():
        assert fields, f"{section}: the required table is empty"
        node = _walk(cfg, section)
        missing = [f for f in fields if node.get(f) is None]
        assert not missing, f"{section} lacks required {missing}"
    assert cfg["ServerConfig"]["maxLinkNum"] == 1000  # required, documented default
    assert cfg["Version"] == "1.0.0"


def test_mindie_is_scraped_on_its_metrics_port_with_the_monitor_mode_on():
    rendered, svc, cfg = _mindie_rendered()
    server = cfg["ServerConfig"]
    assert svc.env["MIES_SERVICE_MONITOR_MODE"] == "1"  # without it /metrics is not served
    assert server["metricsPort"] not in (server["port"], server["managementPort"])
    assert rendered.metrics == {"mixed-0": f"http://10.0.0.1:{server['metricsPort']}/metrics"}
    assert rendered.endpoint == f"http://10.0.0.1:{server['port']}"  # requests still go to the business port
    user = _mindie().model_copy(update={"env": {"MIES_SERVICE_MONITOR_MODE": "0"}})  # the scrape depends on it
    assert render(user, _station("mindie", {})).services[0].env["MIES_SERVICE_MONITOR_MODE"] == "1"


def test_mindie_health_is_probed_on_its_management_port_and_other_engines_keep_their_port():
    _, svc, cfg = _mindie_rendered()
    assert svc.health_path == HEALTH_PATH == "/v2/health/ready"
    assert svc.health_port == cfg["ServerConfig"]["managementPort"] != svc.port
    assert health_target(svc).port == cfg["ServerConfig"]["managementPort"]
    vllm = Target(name="v", kind="local", engine="vllm", model="/m",
                  hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=1, port=8000),))
    (v,) = render(vllm, _station("vllm", {})).services
    assert v.health_port is None and health_target(v) is v and v.health_path == "/health"
    assert "health_port" not in v.model_dump() and "file_modes" not in v.model_dump()  # its launch is unchanged


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == HEALTH_PATH else 404)
        self.end_headers()

    def log_message(self, *args):
        return None


async def test_local_transport_probes_mindie_health_on_the_management_port(tmp_path):
    """Nothing listens on the business port; the management port answers the readiness route."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Ready)  # the management port first: never a port someone holds
    target = _mindie(str(tmp_path / "tgt"), "127.0.0.1", httpd.server_port - 1)
    (svc,) = render(target, _station("mindie", {})).services
    assert svc.health_port == httpd.server_port
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        t = LocalTransport(target)
        assert await t.health(svc)
        assert not await t.health(svc.model_copy(update={"health_port": None}))  # the business port: nothing
    finally:
        httpd.shutdown()
        httpd.server_close()


async def test_mindie_config_is_written_0640_through_the_local_transport(tmp_path):
    target = _mindie(str(tmp_path / "tgt"), "127.0.0.1", free_port())
    (svc,) = render(target, _station("mindie", {})).services
    svc = svc.model_copy(update={"argv": ("sleep", "30")})  # the rendered files, a stand-in for the daemon
    t = LocalTransport(target)
    umask = os.umask(0o022)  # a usual umask: without an explicit mode the file would be 0644
    try:
        await t.start_service(svc, "k1", 1)
        conf = Path(svc.env["MIES_CONFIG_JSON_PATH"])
        assert conf == tmp_path / "tgt" / "svc" / svc.name / "config.json"
        assert stat.S_IMODE(conf.stat().st_mode) == CONFIG_MODE == 0o640
        assert conf.read_text() == svc.files["config.json"]
        assert (await t.service_state(svc)).alive
        await t.start_service(svc, "k2", 2)  # a restart rewrites it: the mode holds
        assert stat.S_IMODE(conf.stat().st_mode) == 0o640
    finally:
        os.umask(umask)
        await t.stop_service(svc, 2)
    assert not (await t.service_state(svc)).alive


def _pd(env: dict[str, str] | None = None) -> Target:
    return Target(name="c", kind="ssh", engine="vllm-ascend", model="/models/dsv4", run_root="/srv/tl",
                  ssh={"known_hosts": "/kh"}, router_command=("python3", "proxy.py"), env=env or {}, hosts=(
                      Host(host="10.0.0.1", roles=("prefill",), cards=4, port=8100, devices="0,1,2,3"),
                      Host(host="10.0.0.2", roles=("decode",), cards=8, port=8200, devices="0,1,2,3,4,5,6,7"),
                      Host(host="10.0.0.3", roles=("router", "load"), cards=0, port=8000)))


def test_vllm_ascend_pd_rendering_names_each_missing_interface_variable_and_what_it_is_for():
    station = _station("vllm-ascend", {}, "vllm")
    (warning,) = render(_pd(), station).warnings
    for name, what in HCCL_NETWORK_ENV.items():
        assert f"{name}: {what}" in warning
    assert "single-node PD can run without them" in warning
    assert render(_pd(HCCL_ENV), station).warnings == ()
    (partial,) = render(_pd({"HCCL_IF_IP": "10.0.0.1", "HCCL_SOCKET_IFNAME": "eth0"}), station).warnings
    assert "GLOO_SOCKET_IFNAME" in partial and "TP_SOCKET_IFNAME" in partial
    assert "HCCL_IF_IP:" not in partial and "HCCL_SOCKET_IFNAME:" not in partial
    one = Target(name="a", kind="local", engine="vllm-ascend", model="/m",
                 hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=1, port=8000),))
    assert render(one, station).warnings == ()  # no PD, no KV hand-off between nodes
    for s in render(_pd(HCCL_ENV), station).services[:2]:
        assert all(s.env[k] == v for k, v in HCCL_ENV.items())  # the operator's values reach every instance


@pytest.fixture
def local_pd(tmp_path):
    """A vLLM-Ascend PD target on this machine whose engines and proxy are sleeping processes."""
    (tmp_path / "s.yaml").write_text(SCENARIO)
    ports = free_ports(3)

    def target(env: dict[str, str]) -> Target:
        return Target(name="asc", kind="local", engine="vllm-ascend", model="/models/m", run_root=str(tmp_path / "tgt"),
                      image_digest="sha256:test", engine_command=SLEEP, router_command=SLEEP, env=env, hosts=(
                          Host(host="127.0.0.1", roles=("prefill",), cards=1, port=ports[0]),
                          Host(host="127.0.0.1", roles=("decode",), cards=1, port=ports[1]),
                          Host(host="127.0.0.1", roles=("router", "load"), cards=0, port=ports[2])))
    started: list[Target] = []
    yield target, started, tmp_path
    for t in started:
        transport = LocalTransport(t)
        for svc in render(t, _station("vllm-ascend", {}, "vllm")).services:
            asyncio.run(transport.stop_service(svc, 10**9))


@pytest.mark.parametrize("env", [{}, HCCL_ENV], ids=["unset", "set"])
def test_vllm_ascend_pd_deploy_records_the_interface_warning_and_deploys_anyway(local_pd, env):
    target, started, tmp = local_pd
    t = target(env)
    started.append(t)
    # a health phase of 8 s: the poller's own deadline (4 s) leaves the last probe 4 s before the phase's timeout
    # on cores the rest of the suite keeps busy (at 1 s the phase's timeout could win the race: "no outcome")
    ex = Executor(Store(f"sqlite:///{tmp / 'state.db'}"), {"asc": t},
                  ExecSettings(runs_root=tmp / "runs", holder="asc", poll_interval_s=0.05, timeouts_s={"health": 8.0}))
    result = ex.run_trial(TrialSpec(run_id="r", goal_id="g", target="asc", scenario=str(tmp / "s.yaml"), n=4, seed=1,
                                    knobs={"concurrency": 2, "request_rate": "inf"}))
    assert result.failed_phase == "health" and "never answered 200" in result.error  # started; sleepers serve nothing
    deploy = next(r.detail for r in map(as_record, ex.store.phases("r"))
                  if r.phase == "deploy" and r.event == "outcome" and r.status == "ok")
    assert deploy["restarted"] and deploy["services"] == ["prefill-0", "decode-0", "router-0"]  # not refused
    if env:
        assert "warnings" not in deploy
    else:
        (warning,) = deploy["warnings"]
        assert all(name in warning for name in HCCL_NETWORK_ENV)
