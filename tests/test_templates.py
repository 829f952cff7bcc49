"""Launch templates: each engine's rendering against the flags that engine documents."""
from __future__ import annotations

import json
import shlex

import pytest

from core.knobs import KnobError
from core.station import Station, change_cost, full_knobs
from executor.targets import Host, Target, parse_targets
from executor.templates import render
from executor.transports.base import remote_command


def _station(engine: str, knobs: dict, key: str | None = None) -> Station:
    return Station(engine=engine, knobs=full_knobs(knobs, key or engine), scenario="copy16k-zero-cache",
                   data_version="d", source_identity="s", target="t")


def _pd(engine: str, **kw) -> Target:
    kw.setdefault("model", "/models/dsv4")
    return Target(name="c", kind="local", engine=engine, run_root="/srv/tl", hosts=(
        Host(host="10.0.0.1", roles=("prefill",), cards=8, port=8100, devices="0,1,2,3,4,5,6,7"),
        Host(host="10.0.0.2", roles=("decode",), cards=8, port=8200),
        Host(host="10.0.0.3", roles=("router", "load"), cards=0, port=8000)), **kw)


def _after(argv, flag):
    return argv[argv.index(flag) + 1]


def test_sim_serve_renders_knobs_and_faults():
    t = Target(name="l", kind="local", engine="sim", tuneloop=("tuneloop",), time_scale=20,
               hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=16, port=9000),))
    r = render(t, _station("sim", {"max_prefill_reqs": 2, "concurrency": 90}), ("never_healthy",))
    argv = list(r.services[0].argv)
    assert argv[:3] == ["tuneloop", "sim", "serve"] and "--scenario-free" in argv
    assert _after(argv, "--port") == "9000" and _after(argv, "--time-scale") == "20.0"
    assert "max_prefill_reqs=2" in argv and "max_num_batched_tokens=8192" in argv
    assert not any(a.startswith("concurrency=") for a in argv)  # load knobs never reach the server
    assert _after(argv, "--fault") == "never_healthy" and r.endpoint == "http://127.0.0.1:9000"


def test_vllm_pd_uses_kv_transfer_config_and_documented_flags():
    st = _station("vllm", {"max_num_batched_tokens": 4096, "max_num_seqs": 64, "enable_prefix_caching": False,
                           "speculative_method": "mtp", "num_speculative_tokens": 2, "gpu_memory_utilization": 0.85})
    r = render(_pd("vllm"), st)
    p, d, router = r.services
    assert p.argv[:3] == ("vllm", "serve", "/models/dsv4")
    kv = json.loads(_after(list(p.argv), "--kv-transfer-config"))
    assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}  # decode: kv_consumer (kv_both is
    assert json.loads(_after(list(d.argv), "--kv-transfer-config"))["kv_role"] == "kv_consumer"  # deprecated)
    assert _after(list(p.argv), "--max-num-batched-tokens") == "4096" and "--max-num-seqs" not in p.argv  # decode knob
    assert _after(list(d.argv), "--max-num-seqs") == "64" and "--max-num-batched-tokens" not in d.argv
    assert "--no-enable-prefix-caching" in p.argv and _after(list(p.argv), "--gpu-memory-utilization") == "0.85"
    assert json.loads(_after(list(d.argv), "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 2}
    assert _after(list(p.argv), "--speculative-config") == _after(list(d.argv), "--speculative-config")  # P = D
    assert _after(list(p.argv), "--tensor-parallel-size") == "8"  # an 8-card instance never launches at TP=1
    assert p.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert (p.env["VLLM_NIXL_SIDE_CHANNEL_HOST"], p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == ("10.0.0.1", "5600")
    assert router.argv[:8] == ("vllm-router", "--host", "0.0.0.0", "--port", "8000", "--prometheus-port", "8001",
                               "--vllm-pd-disaggregation")
    assert _after(list(router.argv), "--prefill") == "http://10.0.0.1:8100"
    assert _after(list(router.argv), "--decode") == "http://10.0.0.2:8200"
    assert r.endpoint == "http://10.0.0.3:8000"
    assert r.metrics == {"prefill-0": "http://10.0.0.1:8100/metrics", "decode-0": "http://10.0.0.2:8200/metrics"}


def test_vllm_renders_only_what_differs_from_its_defaults():
    p = render(_pd("vllm"), _station("vllm", {})).services[0]
    for flag in ("--gpu-memory-utilization", "--enable-prefix-caching", "--no-enable-prefix-caching",
                 "--long-prefill-token-threshold", "--enable-eplb", "--speculative-config", "--data-parallel-size"):
        assert flag not in p.argv, flag


def test_vllm_ascend_uses_mooncake_with_both_sides_sizes_and_its_proxy():
    t = _pd("vllm-ascend", router_command=("python3", "/opt/vllm-ascend/proxy.py"))
    r = render(t, _station("vllm-ascend", {"data_parallel_size": 2}, "vllm"))
    p, d, router = r.services
    kp = json.loads(_after(list(p.argv), "--kv-transfer-config"))
    kd = json.loads(_after(list(d.argv), "--kv-transfer-config"))
    assert kp["kv_role"] == "kv_producer" and kd["kv_role"] == "kv_consumer"
    assert kd["kv_connector"] == "MooncakeConnectorV1" and kp["kv_port"] == "36000" and kp["engine_id"] != kd["engine_id"]
    sizes = {"prefill": {"tp_size": 4, "dp_size": 2}, "decode": {"tp_size": 4, "dp_size": 2}}
    assert kp["kv_connector_extra_config"] == sizes == kd["kv_connector_extra_config"]
    assert p.env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert router.argv[:2] == ("python3", "/opt/vllm-ascend/proxy.py") and _after(list(router.argv), "--decoder-ports") == "8200"
    with pytest.raises(ValueError, match="router_command"):
        render(_pd("vllm-ascend"), _station("vllm-ascend", {}, "vllm"))


def test_sglang_disaggregation_mode_router_and_inverted_flags():
    st = _station("sglang", {"max_prefill_reqs": 2, "max_num_batched_tokens": 8192, "max_num_seqs": 96,
                             "enable_prefix_caching": False, "speculative_method": "mtp", "num_speculative_tokens": 3,
                             "expert_layout": "static_eplb", "gpu_memory_utilization": 0.8})
    t = _pd("sglang", relayout={"collect": ("collect", "{stats}"), "fit": ("fit", "{stats}", "{layout}")})
    p, d, router = render(t, st).services
    assert p.argv[:3] == ("python", "-m", "sglang.launch_server") and _after(list(p.argv), "--model-path") == "/models/dsv4"
    assert _after(list(p.argv), "--disaggregation-mode") == "prefill" and _after(list(d.argv), "--disaggregation-mode") == "decode"
    assert _after(list(p.argv), "--prefill-max-requests") == "2" and _after(list(p.argv), "--chunked-prefill-size") == "8192"
    assert _after(list(d.argv), "--max-running-requests") == "96" and "--prefill-max-requests" not in d.argv
    assert "--disable-radix-cache" in p.argv and "--enable-eplb" not in p.argv  # --enable-eplb is periodic rebalancing
    assert _after(list(p.argv), "--init-expert-location").endswith(".layout.json")  # the static layout
    assert _after(list(p.argv), "--mem-fraction-static") == "0.8" and _after(list(p.argv), "--tp-size") == "8"
    assert _after(list(d.argv), "--speculative-algorithm") == "EAGLE"
    assert (_after(list(d.argv), "--speculative-num-steps"), _after(list(d.argv), "--speculative-num-draft-tokens")) == ("3", "4")
    assert router.argv[:3] == ("python", "-m", "sglang_router.launch_router") and "--pd-disaggregation" in router.argv
    i = router.argv.index("--prefill")
    assert router.argv[i + 1:i + 3] == ("http://10.0.0.1:8100", "8998")  # the router is told the bootstrap port
    assert _after(list(router.argv), "--decode") == "http://10.0.0.2:8200"


def test_sglang_defaults_render_no_flag_sglang_sizes_itself():
    p = render(_pd("sglang"), _station("sglang", {})).services[0]
    assert "--disable-radix-cache" not in p.argv and "--speculative-algorithm" not in p.argv
    assert "--mem-fraction-static" not in p.argv  # SGLang computes it when absent; the catalog default is not forced
    assert "--max-prefill-tokens" not in p.argv  # 8192 is under SGLang's 16384 cap


def test_mindie_renders_config_file_and_daemon():
    st = _station("mindie", {"max_prefill_reqs": 4, "max_num_batched_tokens": 16384, "max_num_seqs": 72})
    t = Target(name="m", kind="local", engine="mindie", model="/models/dsv4", run_root="/srv/tl", hosts=(
        Host(host="10.0.0.1", roles=("mixed", "load"), cards=8, port=8100, devices="0,1,2,3,4,5,6,7"),))
    (p,) = render(t, st).services
    assert p.argv == ("mindieservice_daemon",)
    assert p.env["MIES_CONFIG_JSON_PATH"] == "/srv/tl/svc/mixed-0/config.json"
    cfg = json.loads(p.files["config.json"])
    sched = cfg["BackendConfig"]["ScheduleConfig"]
    assert (sched["maxPrefillBatchSize"], sched["maxPrefillTokens"], sched["maxBatchSize"]) == (4, 16384, 72)
    assert cfg["ServerConfig"]["port"] == 8100 and cfg["ServerConfig"]["inferMode"] == "standard"
    assert cfg["ServerConfig"]["allowAllZeroIpListening"] is True  # MindIE refuses 0.0.0.0 otherwise
    assert cfg["BackendConfig"]["npuDeviceIds"] == [[0, 1, 2, 3, 4, 5, 6, 7]]
    assert cfg["BackendConfig"]["ModelDeployConfig"]["ModelConfig"][0]["modelWeightPath"] == "/models/dsv4"
    assert cfg["BackendConfig"]["ModelDeployConfig"]["maxInputTokenLen"] <= sched["maxPrefillTokens"]
    with pytest.raises(ValueError, match="MindIE MS"):  # PD needs the MS controller + coordinator
        render(_pd("mindie"), st)


def test_llamacpp_flags_and_negated_booleans():
    t = Target(name="l", kind="local", engine="llamacpp", model="/m/q4.gguf",
               hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), port=8080),))
    argv = list(render(t, _station("llamacpp", {"parallel": 4, "ctx_size": 8192, "kv_unified": False,
                                                "cache_prompt": True})).services[0].argv)
    assert argv[0] == "llama-server" and _after(argv, "-m") == "/m/q4.gguf"
    assert _after(argv, "--parallel") == "4" and _after(argv, "--ctx-size") == "8192"
    assert "--no-kv-unified" in argv and "--cache-prompt" in argv and "--metrics" in argv


@pytest.mark.parametrize("value", ["2; rm -rf /", "$(id)", "`id`", "2 && true", "2|cat"])
def test_metacharacter_knob_values_refused_by_validation(value):
    with pytest.raises(KnobError, match="max_prefill_reqs"):
        full_knobs({"max_prefill_reqs": value}, "sim")


def test_metacharacter_enum_refused_and_target_strings_refused():
    with pytest.raises(KnobError, match="speculative_method: must be one of"):
        full_knobs({"speculative_method": "mtp;id"}, "sim")
    with pytest.raises(ValueError, match=r"hosts\.0\.host"):
        parse_targets({"targets": [{"name": "x", "kind": "local", "hosts": [{"host": "a;id", "roles": ["load"]}]}]})
    with pytest.raises(ValueError, match="model"):
        _pd("vllm", model="/m/$(id)")


def test_extra_args_arrive_byte_exact_in_a_remote_string():
    t = _pd("vllm", extra_args={"prefill": ("--served-model-name", "a b;$(id)`x`")})
    p = render(t, _station("vllm", {})).services[0]
    assert shlex.split(remote_command(list(p.argv))) == list(p.argv)


def test_change_cost_classes():
    a = full_knobs({}, "sim")
    assert change_cost(a, a) is None
    assert change_cost(a, a | {"concurrency": 90}) == "hot"
    assert change_cost(a, a | {"concurrency": 90, "max_prefill_reqs": 2}) == "restart"
    assert change_cost(a, a | {"expert_layout": "static_eplb"}) == "relayout"
    assert change_cost(None, a) == "restart"


def test_targets_file_errors_name_the_field():
    with pytest.raises(ValueError, match="ssh"):
        parse_targets({"targets": [{"name": "c", "kind": "ssh", "engine": "sim",
                                    "hosts": [{"host": "h", "roles": ["load", "mixed"]}]}]})
    with pytest.raises(ValueError, match="role 'load'"):
        parse_targets({"targets": [{"name": "c", "kind": "local", "hosts": [{"host": "h", "roles": ["mixed"]}]}]})
    with pytest.raises(ValueError, match="needs a model"):
        parse_targets({"targets": [{"name": "c", "kind": "local", "engine": "vllm",
                                    "hosts": [{"host": "h", "roles": ["mixed", "load"]}]}]})
