"""The Ascend, EPLB and router launches as each engine's own source documents them (each test fails on the rendering
before these fixes):

* the vLLM-Ascend proxy is polled at the route it serves, `GET /healthcheck`
  (vllm-ascend examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py);
* a static expert map is fitted per role and expert-parallel rank count, and each instance loads its own role's;
* SGLang's `--enable-eplb` only with an EP size above 1 (sglang/srt/server_args.py asserts it);
* vLLM-Ascend's dynamic EPLB by its own switches: Model Runner V1 `eplb_config.dynamic_eplb` + DYNAMIC_EPLB=true,
  `--enable-eplb` (synchronous) only on V2 (vllm_ascend/platform.py, ascend_config.py, its EPLB feature guide);
* Mooncake's kv_port above AscendDirectTransport's random port range (vllm-ascend's multi-node PD tutorial);
* MindIE's config complete: managementIpAddress, npuDeviceIds and worldSize from the cards, C within maxLinkNum;
* the PD router's worker-start timeout from the target (vllm-router / sglang-router router_args.py, 600 s there).
"""
from __future__ import annotations

import json

import pytest
from test_engine_launches import RELAYOUT, _after, _pd, _station

from executor.engines.mindie import MAX_LINK_NUM
from executor.targets import Host, Target
from executor.templates import render

EP = {"enable_expert_parallel": True}


def _ascend(**kw) -> Target:
    return _pd("vllm-ascend", router_command=("python3", "proxy.py"), **kw)


def test_the_vllm_ascend_proxy_is_polled_at_healthcheck_and_vllm_router_at_health():
    router = render(_ascend(), _station("vllm-ascend", {}, "vllm")).services[-1]
    assert router.role == "router" and router.health_path == "/healthcheck"
    assert render(_pd("vllm"), _station("vllm", {})).services[-1].health_path == "/health"
    assert render(_pd("sglang"), _station("sglang", {})).services[-1].health_path == "/health"


@pytest.mark.parametrize("engine", ["vllm-ascend", "sglang"])
def test_each_role_loads_its_own_expert_map_fitted_for_its_rank_count(engine):
    """Prefill at EP 4 and decode at EP 8 (the golden layout): two maps, two fit steps each told its rank count;
    the two prefill instances (same role, same EP) share one map."""
    t = _ascend(relayout=RELAYOUT) if engine == "vllm-ascend" else _pd("sglang", relayout=RELAYOUT)
    r = render(t, _station(engine, EP | {"expert_layout": "static_eplb"}, "vllm" if engine == "vllm-ascend" else None))
    p0, p1, d = r.services[:3]

    def loaded(s):
        a = list(s.argv)
        if engine == "sglang":
            return _after(a, "--init-expert-location")
        return json.loads(_after(a, "--additional-config"))["eplb_config"]["expert_map_path"]

    assert loaded(p0) == loaded(p1) != loaded(d)
    assert loaded(p0).endswith(".prefill-ep4.layout.json") and loaded(d).endswith(".decode-ep8.layout.json")
    assert (p0.expert_ranks, d.expert_ranks) == (4, 8)
    fits = {st.name: st.argv for st in r.relayout if st.name.startswith("fit")}
    assert set(fits) == {"fit-prefill-ep4", "fit-decode-ep8"}
    assert _after(list(fits["fit-decode-ep8"]), "--ranks") == "8" and fits["fit-decode-ep8"][-1] == loaded(d)
    assert [st.name for st in r.relayout][0] == "collect"  # the statistics are collected once


def test_sglang_dynamic_eplb_only_with_an_ep_size_above_one():
    for s in render(_pd("sglang"), _station("sglang", EP | {"expert_layout": "dynamic"})).services[:3]:
        assert "--enable-eplb" in s.argv and int(_after(list(s.argv), "--ep-size")) > 1
    with pytest.raises(ValueError, match=r"expert_layout: dynamic is SGLang's --enable-eplb, which asserts an EP "
                                         r"size above 1 .* EP size is 1\)"):
        render(_pd("sglang"), _station("sglang", {"expert_layout": "dynamic"}))


def test_vllm_ascend_dynamic_eplb_by_its_own_switches():
    st = _station("vllm-ascend", EP | {"expert_layout": "dynamic"}, "vllm")
    for s in render(_ascend(), st).services[:3]:  # Model Runner V1, vllm-ascend's default
        assert "--enable-eplb" not in s.argv and s.env["DYNAMIC_EPLB"] == "true"
        assert json.loads(_after(list(s.argv), "--additional-config")) == {"eplb_config": {"dynamic_eplb": True}}
    v2 = _ascend(env={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    for s in render(v2, st).services[:3]:
        assert "--enable-eplb" in s.argv and "DYNAMIC_EPLB" not in s.env and "--additional-config" not in s.argv
        assert json.loads(_after(list(s.argv), "--eplb-config")) == {"use_async": False}  # V2 refuses async
    with pytest.raises(ValueError, match="expert_layout: static_eplb loads eplb_config.expert_map_path, which "
                                         "vllm-ascend's Model Runner V2 refuses"):
        render(v2.model_copy(update={"relayout": RELAYOUT}),
               _station("vllm-ascend", EP | {"expert_layout": "static_eplb"}, "vllm"))
    with pytest.raises(ValueError, match="expert_layout: dynamic is vllm-ascend's dynamic EPLB"):
        render(_ascend(), _station("vllm-ascend", {"expert_layout": "dynamic"}, "vllm"))


def test_mooncake_kv_ports_sit_above_ascend_direct_transports_range():
    """AscendDirectTransport takes ports in [20000, 20000 + NPUs x 1000): 20000-35999 on a 16-NPU A3 node."""
    def ports(t):
        return [int(json.loads(_after(list(s.argv), "--kv-transfer-config"))["kv_port"])
                for s in render(t, _station("vllm-ascend", {}, "vllm")).services if s.role != "router"]

    assert all(p >= 36000 for p in ports(_ascend())) and ports(_ascend()) == [36000, 36100, 36000]
    wide = _ascend().model_copy(update={"hosts": (
        Host(host="10.0.0.1", roles=("prefill",), cards=8, port=8100, devices="24,25,26,27,28,29,30,31"),
        Host(host="10.0.0.2", roles=("decode",), cards=8, port=8200, devices="0,1,2,3,4,5,6,7"),
        Host(host="10.0.0.3", roles=("router", "load"), cards=0, port=8000))})
    assert min(ports(wide)) >= 20000 + 32 * 1000  # a host whose device ids reach 31 holds at least 32 NPUs


def _mindie_config(host: Host, knobs: dict | None = None) -> dict:
    t = Target(name="m", kind="local", engine="mindie", model="/models/dsv4", run_root="/srv/tl", hosts=(host,))
    return json.loads(render(t, _station("mindie", knobs or {})).services[0].files["config.json"])


def test_mindie_config_is_complete_and_consistent():
    cfg = _mindie_config(Host(host="10.0.0.1", roles=("mixed", "load"), cards=8, port=1025))  # no `devices`
    server, backend = cfg["ServerConfig"], cfg["BackendConfig"]
    assert server["managementIpAddress"] == "0.0.0.0"  # its documented default, 127.0.0.2, is not reachable
    world = backend["ModelDeployConfig"]["ModelConfig"][0]["worldSize"]
    assert world == 8 and backend["npuDeviceIds"] == [list(range(8))]  # one source: the cards
    with pytest.raises(ValueError, match=r"hosts: 10.0.0.1:1025 names devices '0,1' \(2\) but has 8 card"):
        _mindie_config(Host(host="10.0.0.1", roles=("mixed", "load"), cards=8, port=1025, devices="0,1"))
    assert _mindie_config(Host(host="h", roles=("mixed", "load"), cards=2, port=1025),
                          {"concurrency": MAX_LINK_NUM})["ServerConfig"]["maxLinkNum"] == MAX_LINK_NUM
    with pytest.raises(ValueError, match=r"concurrency: 1001 clients exceed MindIE's ServerConfig.maxLinkNum"):
        _mindie_config(Host(host="h", roles=("mixed", "load"), cards=2, port=1025), {"concurrency": 1001})


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_pd_router_waits_for_its_workers_as_long_as_the_target_says(engine):
    router = render(_pd(engine), _station(engine, {})).services[-1]
    assert _after(list(router.argv), "--worker-startup-timeout-secs") == "1800"  # the executor's health budget
    router = render(_pd(engine, worker_start_s=3600), _station(engine, {})).services[-1]
    assert _after(list(router.argv), "--worker-startup-timeout-secs") == "3600"


def test_the_pd_demo_target_sets_the_kv_lease_the_tests_found_necessary(tmp_path):
    """`tuneloop vllm prepare --pd` (make demo-real ENGINE=vllm-pd) fills examples/targets-vllm-pd.yaml: both of its
    targets hold NIXL's KV lease at 300 s, as tests/test_vllm_pd.py does (vLLM's 30 s expired under load here)."""
    from executor.engines.vllm_cli import EXAMPLE_PD, render_targets
    from executor.targets import load_targets

    text = render_targets(EXAMPLE_PD.read_text(), vllm="/v/bin/vllm", model="/m", run_root=str(tmp_path), port=8391,
                          python="/usr/bin/python3", router="/v/bin/vllm-router")
    (tmp_path / "targets.yaml").write_text(text)
    targets = load_targets(tmp_path / "targets.yaml")
    assert {"vllm-pd-local", "vllm-pd-ssh"} <= set(targets)  # (load_targets adds the built-in sim target)
    for t in (targets["vllm-pd-local"], targets["vllm-pd-ssh"]):
        for s in render(t, _station("vllm", {})).services[:2]:
            kv = json.loads(_after(list(s.argv), "--kv-transfer-config"))
            assert kv["kv_connector_extra_config"] == {"kv_lease_duration": 300} and kv["kv_buffer_device"] == "cpu"


def test_nixl_moving_host_memory_gets_a_progress_thread_that_sleeps(tmp_path):
    """NIXL's Python agent gives its UCX progress thread a 0 ms poll timeout, a spin that holds a core per instance
    (executor/engines/vllm_nixl.py): each instance of a P/D pair whose NIXL moves host memory (the demo target's
    `kv_buffer_device: cpu`) gets the sitecustomize.py that sets the delay, in its service directory, first on its
    PYTHONPATH; a pair whose KV stays on its cards, and the router, are rendered as before."""
    from executor.engines.base import svc_dir
    from executor.engines.vllm_nixl import PTHR_DELAY_US, SHIM, SITECUSTOMIZE

    cpu = _pd("vllm", pd_connector_config={"kv_buffer_device": "cpu"}, env={"PYTHONPATH": "/opt/site"})
    *engines, router = render(cpu, _station("vllm", {})).services
    assert [s.role for s in engines] == ["prefill", "prefill", "decode"]
    for s in engines:
        assert s.files == {SITECUSTOMIZE: SHIM} and f"DELAY_US = {PTHR_DELAY_US}" in SHIM
        assert s.env["PYTHONPATH"] == f"{svc_dir(cpu, s.name, s.host)}:/opt/site"  # the target's own path kept
    assert not router.files and router.env.get("PYTHONPATH") == "/opt/site"
    for s in render(_pd("vllm"), _station("vllm", {})).services:
        assert not s.files and "PYTHONPATH" not in s.env
    # the shim is Python that patches NIXL's bindings as they load and nothing else
    compile(SHIM, SITECUSTOMIZE, "exec")
    assert "nixlAgent" in SHIM and "pthrDelay" in SHIM
