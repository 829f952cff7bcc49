"""PD launches as upstream documents them, pinned byte-for-byte: every rendered PD deployment (vLLM GPU PD through
vllm-router, vLLM-Ascend Mooncake PD, SGLang PD) and a MindIE instance is compared with its golden file under
tests/data/golden/. After a deliberate change of a rendering, regenerate them with

    TUNELOOP_REGEN_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_engine_launches.py

(the run that rewrites them fails, so a regeneration is never mistaken for a pass), then read the diff.
Two instances of one role on one host must not collide on any port (NIXL side channel, Mooncake kv_port,
SGLang bootstrap), and each instance's parallel sizes come from its own cards.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from core.knobs import catalog
from core.station import Station, full_knobs
from executor.targets import Host, Relayout, Target
from executor.templates import render

GOLDEN = Path(__file__).parent / "data" / "golden"
RELAYOUT = Relayout(collect=("tuneloop-eplb", "collect", "--out", "{stats}"),
                    fit=("tuneloop-eplb", "fit", "{stats}", "--ranks", "{ep}", "{layout}"))


def _station(engine: str, knobs: dict, key: str | None = None) -> Station:
    return Station(engine=engine, knobs=full_knobs(knobs, key or engine), scenario="copy16k-zero-cache",
                   data_version="d", source_identity="s", target="c")


def _pd(engine: str, **kw) -> Target:
    """2 prefill instances on one host (4 cards each), 1 decode instance with 8 cards, a router/load host."""
    kw.setdefault("model", "/models/dsv4")
    return Target(name="c", kind="ssh", engine=engine, run_root="/srv/tl", ssh={"known_hosts": "/kh"}, hosts=(
        Host(host="10.0.0.1", roles=("prefill",), cards=4, port=8100, devices="0,1,2,3"),
        Host(host="10.0.0.1", roles=("prefill",), cards=4, port=8101, devices="4,5,6,7"),
        Host(host="10.0.0.2", roles=("decode",), cards=8, port=8200, devices="0,1,2,3,4,5,6,7"),
        Host(host="10.0.0.3", roles=("router", "load"), cards=0, port=8000)), **kw)


CASES = {
    "vllm-pd": lambda: render(_pd("vllm"), _station("vllm", {
        "max_num_batched_tokens": 16384, "max_num_seqs": 128, "enable_expert_parallel": True,
        "speculative_method": "mtp", "num_speculative_tokens": 1})),
    "vllm-ascend-mooncake-pd": lambda: render(
        _pd("vllm-ascend", router_command=("python3", "/opt/vllm-ascend/examples/disaggregated_prefill_v1/"
                                           "load_balance_proxy_server_example.py"), relayout=RELAYOUT),
        _station("vllm-ascend", {"max_num_batched_tokens": 8192, "max_num_seqs": 64, "enable_expert_parallel": True,
                                 "expert_layout": "static_eplb"}, "vllm")),
    "sglang-pd": lambda: render(_pd("sglang", relayout=RELAYOUT), _station("sglang", {
        "max_num_batched_tokens": 32768, "max_prefill_reqs": 8, "max_num_seqs": 96, "attn_dp_size": 4,
        "enable_expert_parallel": True, "expert_layout": "static_eplb"})),
    # issue 55: vLLM GPU over MooncakeConnector (a bootstrap port per prefill, vllm-router told the connector), and
    # vLLM-Ascend with MTP (1 draft token on prefill) and a recipe's own --additional-config joining the expert map
    "vllm-mooncake-pd": lambda: render(_pd("vllm", pd_connector="MooncakeConnector"), _station("vllm", {
        "max_num_seqs": 128, "enable_expert_parallel": True, "speculative_method": "mtp",
        "num_speculative_tokens": 2})),
    "vllm-ascend-mooncake-pd-mtp": lambda: render(
        _pd("vllm-ascend", router_command=("python3", "/opt/vllm-ascend/examples/disaggregated_prefill_v1/"
                                           "load_balance_proxy_server_example.py"), relayout=RELAYOUT,
            extra_args={r: ("--additional-config", '{"enable_shared_expert_dp": true}')
                        for r in ("prefill", "decode")}),
        _station("vllm-ascend", {"max_num_seqs": 64, "enable_expert_parallel": True, "expert_layout": "static_eplb",
                                 "speculative_method": "mtp", "num_speculative_tokens": 3}, "vllm")),
    "mindie": lambda: render(Target(name="m", kind="local", engine="mindie", model="/models/dsv4", run_root="/srv/tl",
                                    hosts=(Host(host="10.0.0.1", roles=("mixed", "load"), cards=8, port=1025,
                                                devices="0,1,2,3,4,5,6,7"),)),
                             _station("mindie", {"max_num_batched_tokens": 16384, "max_prefill_reqs": 8,
                                                 "max_num_seqs": 72})),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_deployment_matches_its_golden_file(name):
    text = CASES[name]().model_dump_json(indent=1) + "\n"
    path = GOLDEN / f"{name}.json"
    if os.environ.get("TUNELOOP_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        pytest.fail(f"regenerated {path}; rerun without TUNELOOP_REGEN_GOLDEN and read the diff")
    assert path.exists(), f"{path} is missing: run with TUNELOOP_REGEN_GOLDEN=1 once"
    assert text == path.read_text(), f"{name}: the rendering changed; see the module docstring to regenerate"


@pytest.mark.parametrize("name", sorted(n for n in CASES if "pd" in n))
def test_every_golden_pd_launch_scrapes_every_prefill_and_decode_instance(name):
    """Each engine instance of each role is scraped under its own name, at its own port, and the load run is told
    every one of them (a role keyed once would keep only its last instance: prefill-0 was never scraped)."""
    from executor.transports.base import LoadPlan
    from executor.transports.local import LocalTransport

    golden = json.loads((GOLDEN / f"{name}.json").read_text())
    engines = [s for s in golden["services"] if s["role"] in ("prefill", "decode")]
    assert {s["role"] for s in engines} == {"prefill", "decode"} and len(engines) >= 3
    assert golden["metrics"] == {s["name"]: f"http://{s['host']}:{s['port']}/metrics" for s in engines}
    r = CASES[name]()
    plan = LoadPlan(endpoint=r.endpoint, scenario="s", n=1, concurrency=1, request_rate=1.0, metrics=r.metrics)
    argv = LocalTransport(_pd("vllm")).load_argv("k", plan)  # the argv the load host runs
    given = [argv[i + 1] for i, a in enumerate(argv) if a == "--metrics-url"]
    assert given == [f"{s['name']}=http://{s['host']}:{s['port']}/metrics" for s in engines]


def _after(argv, flag):
    return argv[argv.index(flag) + 1]


def test_two_vllm_prefill_instances_on_one_host_get_their_own_nixl_side_channel():
    p0, p1, d, router = render(_pd("vllm"), _station("vllm", {"data_parallel_size": 2})).services
    assert (p0.env["VLLM_NIXL_SIDE_CHANNEL_PORT"], p1.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == ("5600", "5602")  # + DP
    assert p0.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.1" and d.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.2"
    assert _after(list(p0.argv), "--tensor-parallel-size") == "2" and _after(list(p0.argv), "--data-parallel-size") == "2"
    assert _after(list(d.argv), "--tensor-parallel-size") == "4"  # 8 cards / DP 2
    prefills = [router.argv[i + 1] for i, a in enumerate(router.argv) if a == "--prefill"]
    assert prefills == ["http://10.0.0.1:8100", "http://10.0.0.1:8101"]


def test_vllm_router_gets_a_metrics_port_no_service_of_its_host_takes():
    """vllm-router always starts a Prometheus exporter (default 29000) and dies when its port is taken: each
    router gets the first port above its own that no service on its host uses."""
    one = Target(name="c", kind="local", engine="vllm", model="/m", hosts=(
        Host(host="127.0.0.1", roles=("prefill",), cards=1, port=8101),
        Host(host="127.0.0.1", roles=("decode",), cards=1, port=8102),
        Host(host="127.0.0.1", roles=("router", "load"), cards=0, port=8100)))
    router = render(one, _station("vllm", {})).services[-1]
    assert _after(list(router.argv), "--prometheus-port") == "8103"
    router = render(_pd("vllm"), _station("vllm", {})).services[-1]  # alone on its host
    assert _after(list(router.argv), "--prometheus-port") == "8001"
    p, d = render(one.model_copy(update={"env": {"VLLM_NIXL_SIDE_CHANNEL_PORT": "7100"}}),
                  _station("vllm", {})).services[:2]  # a second PD deployment on one machine: its own side channels
    assert (p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"], d.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == ("7100", "7101")
    kv = [json.loads(_after(list(s.argv), "--kv-transfer-config")) for s in (p, d)]
    assert [k["kv_role"] for k in kv] == ["kv_producer", "kv_consumer"]  # NIXL's kv_both is deprecated
    cpu = one.model_copy(update={"pd_connector_config": {"kv_buffer_device": "cpu"}})
    assert all(json.loads(_after(list(s.argv), "--kv-transfer-config"))["kv_buffer_device"] == "cpu"
               for s in render(cpu, _station("vllm", {})).services[:2])
    with pytest.raises(ValueError, match="env.VLLM_NIXL_SIDE_CHANNEL_PORT: 'x' is not a port"):
        render(one.model_copy(update={"env": {"VLLM_NIXL_SIDE_CHANNEL_PORT": "x"}}), _station("vllm", {}))
    with pytest.raises(ValueError, match="pd_connector_config.kv_buffer_device: 'cpu;rm' has characters"):
        Target.model_validate(one.model_dump() | {"pd_connector_config": {"kv_buffer_device": "cpu;rm"}})
    # one level of nesting: NIXL reads its KV lease from kv_connector_extra_config
    lease = one.model_copy(update={"pd_connector_config": {"kv_connector_extra_config": {"kv_lease_duration": 120}}})
    assert all(json.loads(_after(list(s.argv), "--kv-transfer-config"))["kv_connector_extra_config"]
               == {"kv_lease_duration": 120} for s in render(lease, _station("vllm", {})).services[:2])
    with pytest.raises(ValueError, match="pd_connector_config.kv_connector_extra_config.Lease: a connector config"):
        Target.model_validate(one.model_dump() | {"pd_connector_config": {"kv_connector_extra_config": {"Lease": 1}}})


def test_two_mooncake_instances_on_one_host_get_their_own_kv_port():
    t = _pd("vllm-ascend", router_command=("python3", "proxy.py"))
    p0, p1, d = render(t, _station("vllm-ascend", {}, "vllm")).services[:3]
    ports = [json.loads(_after(list(s.argv), "--kv-transfer-config"))["kv_port"] for s in (p0, p1, d)]
    assert ports == ["36000", "36100", "36000"]  # d is alone on its host; above AscendDirectTransport's ports
    extra = json.loads(_after(list(d.argv), "--kv-transfer-config"))["kv_connector_extra_config"]
    assert extra == {"prefill": {"tp_size": 4, "dp_size": 1}, "decode": {"tp_size": 8, "dp_size": 1}}
    # the target's extra keys join the P/D sizes Mooncake asserts on instead of replacing them
    t = t.model_copy(update={"pd_connector_config": {"kv_connector_extra_config": {"site_key": "x"}}})
    d = render(t, _station("vllm-ascend", {}, "vllm")).services[2]
    extra = json.loads(_after(list(d.argv), "--kv-transfer-config"))["kv_connector_extra_config"]
    assert extra["site_key"] == "x" and extra["decode"] == {"tp_size": 8, "dp_size": 1}


def test_two_sglang_prefill_instances_get_their_own_bootstrap_port_and_the_router_is_told():
    p0, p1, d, router = render(_pd("sglang"), _station("sglang", {})).services
    assert "--disaggregation-bootstrap-port" not in p0.argv  # 8998 is SGLang's default
    assert _after(list(p1.argv), "--disaggregation-bootstrap-port") == "8999"
    r = list(router.argv)
    given = [tuple(r[i + 1:i + 3]) for i, a in enumerate(r) if a == "--prefill"]
    assert given == [("http://10.0.0.1:8100", "8998"), ("http://10.0.0.1:8101", "8999")]
    assert _after(list(p0.argv), "--tp-size") == "4" and _after(list(d.argv), "--tp-size") == "8"


def test_sglang_max_prefill_tokens_moves_with_a_chunk_above_its_cap():
    p = render(_pd("sglang"), _station("sglang", {"max_num_batched_tokens": 32768})).services[0]
    assert _after(list(p.argv), "--chunked-prefill-size") == "32768" == _after(list(p.argv), "--max-prefill-tokens")


def test_parallel_sizes_that_do_not_fit_the_cards_are_refused_with_the_field():
    with pytest.raises(ValueError, match="tensor_parallel_size: 8 x data_parallel_size 1 = 8, but prefill host"):
        render(_pd("vllm"), _station("vllm", {"tensor_parallel_size": 8}))
    with pytest.raises(ValueError, match="data_parallel_size: 3 does not divide"):
        render(_pd("sglang"), _station("sglang", {"data_parallel_size": 3}))
    with pytest.raises(ValueError, match="attn_dp_size: 8 does not divide"):
        render(_pd("sglang"), _station("sglang", {"attn_dp_size": 8}))


def test_static_expert_layouts_per_engine():
    with pytest.raises(ValueError, match="expert_layout: vLLM 0.32 cannot load a static expert map"):
        render(_pd("vllm", relayout=RELAYOUT), _station("vllm", {"expert_layout": "static_eplb"}))
    with pytest.raises(ValueError, match="relayout.collect"):  # the map must be produced by the target's steps
        render(_pd("sglang"), _station("sglang", {"expert_layout": "static_eplb"}))
    t = _pd("vllm-ascend", router_command=("python3", "proxy.py"), relayout=RELAYOUT)
    p = render(t, _station("vllm-ascend", {"expert_layout": "static_eplb"}, "vllm")).services[0]
    assert json.loads(_after(list(p.argv), "--additional-config"))["eplb_config"]["expert_map_path"].endswith(".layout.json")
    for s in render(_pd("vllm"), _station("vllm", {"enable_expert_parallel": True})).services:
        assert "--enable-eplb" not in s.argv  # the default layout (none) switches no balancing on


def test_each_expert_layout_renders_what_it_says():
    """none: the engine's own placement (no flag); dynamic: the engine's dynamic EPLB; static_eplb: a fitted map.
    vLLM refuses dynamic EPLB without expert parallelism over more than one rank, as vLLM itself would."""
    ep = {"enable_expert_parallel": True}
    for engine in ("vllm", "sglang"):
        for s in render(_pd(engine), _station(engine, ep | {"expert_layout": "none"})).services[:3]:
            assert not {"--enable-eplb", "--init-expert-location"} & set(s.argv), (engine, s.argv)
    for s in render(_pd("vllm"), _station("vllm", ep | {"expert_layout": "dynamic"})).services[:3]:
        assert s.argv.count("--enable-eplb") == 1 and "--enable-expert-parallel" in s.argv
    for s in render(_pd("sglang"), _station("sglang", ep | {"expert_layout": "dynamic"})).services[:3]:
        assert "--enable-eplb" in s.argv and _after(list(s.argv), "--expert-distribution-recorder-mode") == "stat"
        assert "--init-expert-location" not in s.argv
    with pytest.raises(ValueError, match="expert_layout: dynamic is vLLM's dynamic EPLB .* needs enable_expert_parallel"):
        render(_pd("vllm"), _station("vllm", {"expert_layout": "dynamic"}))
    one = Target(name="g", kind="local", engine="vllm", model="/m",
                 hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=1, port=8000),))
    with pytest.raises(ValueError, match=r"expert_layout: .*\(this instance has 1 rank\)"):
        render(one, _station("vllm", ep | {"expert_layout": "dynamic"}))


SPEC = {"speculative_method": "mtp", "num_speculative_tokens": 2}


def _spec_flags(engine: str, argv: tuple[str, ...]) -> dict[str, str]:
    """The speculative part of one instance's argv, as the engine reads it."""
    a = list(argv)
    if engine in ("vllm", "vllm-ascend"):
        return json.loads(_after(a, "--speculative-config")) if "--speculative-config" in a else {}
    return {f: _after(a, f) for f in ("--speculative-algorithm", "--speculative-num-steps",
                                      "--speculative-eagle-topk", "--speculative-num-draft-tokens") if f in a}


@pytest.mark.parametrize("engine", ["vllm", "vllm-ascend", "sglang"])
def test_every_pd_rendering_puts_the_same_speculative_config_on_prefill_and_decode(engine):
    """vLLM's NIXL handshake compares P's and D's speculative config (and refuses a mismatch); SGLang's prefill runs
    the draft to hand its hidden states to decode: a draft on decode alone would not start or would under-measure.
    vLLM-Ascend's P/D guide drafts 1 token on prefill and the station's width on decode (the same method)."""
    t = _pd(engine, router_command=("python3", "proxy.py")) if engine == "vllm-ascend" else _pd(engine)
    services = render(t, _station(engine, SPEC, "vllm" if engine == "vllm-ascend" else None)).services
    engines = [s for s in services if s.role in ("prefill", "decode")]
    flags = [_spec_flags(engine, s.argv) for s in engines]
    if engine == "vllm-ascend":
        assert [f.pop("num_speculative_tokens") for f in flags] == [1, 1, SPEC["num_speculative_tokens"]]
    assert len(engines) == 3 and flags[0] and all(f == flags[0] for f in flags), flags
    assert {s.role for s in engines} == {"prefill", "decode"}
    none = render(t, _station(engine, {}, "vllm" if engine == "vllm-ascend" else None)).services
    assert all(_spec_flags(engine, s.argv) == {} for s in none if s.role != "router")


def test_the_simulator_and_mindie_carry_no_one_sided_draft():
    """The simulator runs P and D in one process (every knob on its one command line); MindIE has no draft knob and
    its PD is refused."""
    sim = Target(name="s", kind="local", engine="sim", model="m", profile="deepseek-v3-910c-p4d8",
                 hosts=(Host(host="127.0.0.1", roles=("prefill", "decode", "router", "load"), cards=12, port=8000),))
    (svc,) = render(sim, _station("sim", SPEC)).services
    assert "speculative_method=mtp" in svc.argv and "num_speculative_tokens=2" in svc.argv
    assert not {"speculative_method", "num_speculative_tokens"} & {k.name for k in catalog().for_engine("mindie")}
    with pytest.raises(ValueError, match="MindIE PD needs MindIE MS"):
        render(_pd("mindie"), _station("mindie", {}))


def test_a_four_card_instance_never_launches_at_tp_1():
    t = Target(name="g", kind="local", engine="vllm", model="/m",
               hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=4, port=8000),))
    (svc,) = render(t, _station("vllm", {})).services
    assert _after(list(svc.argv), "--tensor-parallel-size") == "4" and svc.cards == 4


def test_every_example_target_renders_at_its_engines_defaults():
    from executor.targets import load_targets

    targets = load_targets(Path(__file__).parents[1] / "examples" / "targets.yaml")
    for name, t in targets.items():
        key = "vllm" if t.engine == "vllm-ascend" else t.engine
        r = render(t, _station(t.engine, {"expert_layout": "static_eplb"} if t.relayout else {}, key))
        assert r.services, name
