"""The launches the field would run, correct (issue 55, part 2), each against the engine's own source:

* vLLM's parser keeps one `--additional-config` (a full JSON given twice: the last; dotted keys: their JSON, appended
  last; vllm/utils/argparse_utils.py), so a vLLM-Ascend recipe's own `--additional-config` joins the expert map in one
  JSON, in the rendered command and in the deploy phase's record of it (`rendered.json`);
* vLLM-Ascend's MTP drafts 1 token on prefill (its P/D guide), the station's width on decode;
* SGLang's attention-DP port block (PortArgs: --port + 233, seven ports) never overlaps another's on one host, and
  `--dp-size` with `--attn-dp-size` both above 1 is refused as SGLang refuses it;
* vLLM GPU with MooncakeConnector: a bootstrap port per prefill instance and vllm-router told `--kv-connector
  mooncake` with each port; LMCacheConnectorV1 refused;
* llama.cpp starts on the host with the role 'mixed', not on the first host listed.

The argvs go through SGLang's and vllm-router's own parsers in tests/test_engine_parsers_sglang.py, vLLM's in
tests/test_vllm_flags.py; a draft method of width 0 is refused at every entry in tests/test_draft_width_zero.py.
"""
from __future__ import annotations

import asyncio
import json

import pytest
from test_engine_launches import RELAYOUT, _after, _pd, _station

from core.trial import TrialSpec
from executor.engines.sglang_ports import PORT_ARGS_BLOCK, ZMQ_TCP_PORT_DELTA
from executor.runjournal import RunJournal
from executor.targets import Host, Target
from executor.templates import render
from executor.transports import make_transport
from executor.trialrun import TrialRun

EP_STATIC = {"enable_expert_parallel": True, "expert_layout": "static_eplb"}
SHARED_DP = '{"enable_shared_expert_dp": true}'


def _ascend(**kw) -> Target:
    return _pd("vllm-ascend", router_command=("python3", "proxy.py"), relayout=RELAYOUT, **kw)


def _additional(svc) -> dict:
    a = list(svc.argv)
    assert sum(1 for x in a if x.split("=", 1)[0].split(".", 1)[0] == "--additional-config") == 1, a
    return json.loads(_after(a, "--additional-config"))


def test_a_recipes_own_additional_config_keeps_the_expert_map_in_the_command_and_the_record(tmp_path):
    """The recipe's key and the station's expert map in one JSON on every engine instance; the deploy phase's
    prepare records that launch (rendered.json) beside the station it ran (station.json)."""
    t = _ascend(extra_args={"prefill": ("--additional-config", SHARED_DP),
                            "decode": ("--additional-config.enable_shared_expert_dp", "true")},  # vLLM's dotted form
                image_digest="sha256:0123")  # the source identity without asking an engine
    st = _station("vllm-ascend", EP_STATIC, "vllm")
    for svc in render(t, st).services[:3]:
        cfg = _additional(svc)
        assert cfg["enable_shared_expert_dp"] is True
        assert cfg["eplb_config"]["expert_map_path"].endswith(f".{svc.role}-ep{svc.expert_ranks}.layout.json")
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nversion: 1\ntask: copy\ninput_len: 64\noutput_len: 8\nseed: 1\n")
    spec = TrialSpec.model_validate(dict(run_id="r", goal_id="g", target="c", scenario=str(scenario), n=4, seed=1,
                                         knobs=EP_STATIC | {"concurrency": 2, "request_rate": 1.0}))
    work = tmp_path / "work"
    work.mkdir()
    run = TrialRun(spec, t, work, make_transport(t), RunJournal(None, "r", "c", []), lease=None,
                   settings=None)  # its prepare phase alone: no lease or settings read
    asyncio.run(run.prepare())
    recorded = json.loads((work / "rendered.json").read_text())
    engines = [s for s in recorded["services"] if s["role"] in ("prefill", "decode")]
    assert len(engines) == 3
    for s in engines:
        cfg = json.loads(_after(s["argv"], "--additional-config"))
        assert cfg["enable_shared_expert_dp"] is True and "expert_map_path" in cfg["eplb_config"], s["argv"]
    assert json.loads((work / "station.json").read_text())["knobs"]["expert_layout"] == "static_eplb"


def test_a_recipe_that_changes_what_the_station_renders_is_refused_naming_its_field():
    clash = _ascend(extra_args={"prefill": ("--additional-config", '{"eplb_config":{"expert_map_path":"/x"}}')})
    with pytest.raises(ValueError, match=r"extra_args.prefill: sets --additional-config eplb_config.expert_map_path"):
        render(clash, _station("vllm-ascend", EP_STATIC, "vllm"))
    bad = _ascend(extra_args={"decode": ("--additional-config", "{not json")})
    with pytest.raises(ValueError, match=r"extra_args.decode: --additional-config '\{not json' is not JSON"):
        render(bad, _station("vllm-ascend", EP_STATIC, "vllm"))
    # a recipe alone (no station JSON to join) is left as written; two of its own become one
    alone = _pd("vllm", extra_args={"decode": ("--additional-config", SHARED_DP)})
    d = render(alone, _station("vllm", {})).services[2]
    assert list(d.argv[-2:]) == ["--additional-config", SHARED_DP]
    two = _pd("vllm", extra_args={"decode": ("--additional-config", SHARED_DP, "--additional-config", '{"a":1}')})
    assert _additional(render(two, _station("vllm", {})).services[2]) == {"a": 1, "enable_shared_expert_dp": True}


def test_vllm_ascend_mtp_drafts_one_token_on_prefill_and_the_stations_width_on_decode():
    st = _station("vllm-ascend", {"speculative_method": "mtp", "num_speculative_tokens": 3}, "vllm")
    p0, p1, d = render(_ascend(), st).services[:3]
    widths = [json.loads(_after(list(s.argv), "--speculative-config"))["num_speculative_tokens"] for s in (p0, p1, d)]
    assert widths == [1, 1, 3]
    one = Target(name="a", kind="local", engine="vllm-ascend", model="/m",
                 hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=1, port=8000),))
    (mixed,) = render(one, st).services  # no P/D: the station's width
    assert json.loads(_after(list(mixed.argv), "--speculative-config"))["num_speculative_tokens"] == 3


def _sglang_ports(services) -> dict[str, list[int]]:
    """Every fixed port each SGLang engine instance takes: its --port, its bootstrap port (prefill), and with
    attention DP the PortArgs block from its dist-init port (--dist-init-addr's, else --port + 233)."""
    out = {}
    for s in services:
        if s.role == "router":
            continue
        a = list(s.argv)
        ports = [s.port]
        if s.role == "prefill":
            ports.append(int(_after(a, "--disaggregation-bootstrap-port")) if "--disaggregation-bootstrap-port" in a
                         else 8998)
        if "--attn-dp-size" in a and int(_after(a, "--attn-dp-size")) > 1:
            start = int(_after(a, "--dist-init-addr").rsplit(":", 1)[1]) if "--dist-init-addr" in a \
                else s.port + ZMQ_TCP_PORT_DELTA
            ports += list(range(start, start + PORT_ARGS_BLOCK))
        out[s.name] = ports
    return out


def test_two_sglang_attention_dp_instances_on_one_host_take_port_blocks_that_never_overlap():
    r = render(_pd("sglang"), _station("sglang", {"attn_dp_size": 4}))
    ports = _sglang_ports(r.services)
    assert ports["prefill-0"] == [8100, 8998, *range(8333, 8340)]  # SGLang's own default block, not rendered
    assert ports["prefill-1"] == [8101, 8999, *range(8340, 8347)]  # 8334-8340 would overlap prefill-0's
    assert _after(list(r.services[1].argv), "--dist-init-addr") == "127.0.0.1:8340"
    assert "--dist-init-addr" not in r.services[0].argv and "--dist-init-addr" not in r.services[2].argv
    by_host: dict[str, list[int]] = {}
    for s in r.services:
        by_host.setdefault(s.host, []).extend(ports.get(s.name, [s.port]))
    assert all(len(p) == len(set(p)) for p in by_host.values()), by_host
    plain = render(_pd("sglang"), _station("sglang", {}))  # no attention DP: IPC sockets, nothing moved
    assert not any("--dist-init-addr" in s.argv for s in plain.services)


def test_sglang_dp_size_with_attn_dp_size_both_above_one_is_refused_as_sglang_refuses_it():
    with pytest.raises(ValueError, match=r"attn_dp_size: 2 with data_parallel_size 2: SGLang refuses data-parallel "
                                         r"replicas combined with attention data parallelism"):
        render(_pd("sglang"), _station("sglang", {"data_parallel_size": 2, "attn_dp_size": 2}))
    r = render(_pd("sglang"), _station("sglang", {"data_parallel_size": 2}))  # either alone renders
    assert _after(list(r.services[0].argv), "--dp-size") == "2"


def test_vllm_mooncake_gets_a_bootstrap_port_per_prefill_and_the_router_is_told():
    r = render(_pd("vllm", pd_connector="MooncakeConnector"), _station("vllm", {}))
    p0, p1, d, router = r.services
    assert (p0.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"], p1.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"]) == ("8998", "9002")  # TP 4
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in d.env and "VLLM_NIXL_SIDE_CHANNEL_PORT" not in p0.env
    assert [json.loads(_after(list(s.argv), "--kv-transfer-config"))["kv_connector"] for s in (p0, d)] == \
        ["MooncakeConnector"] * 2
    a = list(router.argv)
    assert _after(a, "--kv-connector") == "mooncake"
    assert [tuple(a[i + 1:i + 3]) for i, x in enumerate(a) if x == "--prefill"] == \
        [("http://10.0.0.1:8100", "8998"), ("http://10.0.0.1:8101", "9002")]
    moved = render(_pd("vllm", pd_connector="MooncakeConnector", env={"VLLM_MOONCAKE_BOOTSTRAP_PORT": "7000"}),
                   _station("vllm", {})).services
    assert moved[0].env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "7000"
    nixl = list(render(_pd("vllm"), _station("vllm", {})).services[-1].argv)
    assert "--kv-connector" not in nixl  # vllm-router's default is nixl


def test_a_connector_not_rendered_complete_is_refused_naming_pd_connector():
    with pytest.raises(ValueError, match=r"pd_connector: LMCacheConnectorV1 needs LMCache's own P/D configuration"):
        render(_pd("vllm", pd_connector="LMCacheConnectorV1"), _station("vllm", {}))
    with pytest.raises(ValueError, match=r"pd_connector: 'P2pNcclConnector' is not a KV connector tuneloop renders "
                                         r"for vllm P/D \(it renders NixlConnector, MooncakeConnector\)"):
        render(_pd("vllm", pd_connector="P2pNcclConnector"), _station("vllm", {}))
    with pytest.raises(ValueError, match=r"pd_connector: 'NixlConnector' is not a KV connector tuneloop renders for "
                                         r"vllm-ascend"):
        render(_ascend(pd_connector="NixlConnector"), _station("vllm-ascend", {}, "vllm"))


def test_llama_cpp_starts_on_the_host_with_the_role_mixed():
    t = Target(name="l", kind="ssh", engine="llamacpp", ssh={"known_hosts": "/kh"}, hosts=(
        Host(host="10.0.0.9", roles=("load",), port=9000),
        Host(host="10.0.0.5", roles=("mixed",), cards=1, port=8080)))
    (svc,) = (r := render(t, _station("llamacpp", {}))).services
    assert (svc.host, svc.port) == ("10.0.0.5", 8080) and r.endpoint == "http://10.0.0.5:8080"
    two = t.model_copy(update={"hosts": (*t.hosts, Host(host="10.0.0.6", roles=("mixed",), cards=1, port=8080))})
    with pytest.raises(ValueError, match="hosts: llama.cpp runs one instance, but 2 hosts have the role 'mixed'"):
        render(two, _station("llamacpp", {}))
