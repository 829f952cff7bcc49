"""Instances that span hosts (issue 55 part 1): a DeepSeek-class MoE at the field's scale, prefill DP 2 x TP 8 and decode
DP 32 x TP 1 with EP 32 over 2 + 4 hosts of 8 cards, and the same P8 + D8 on one 16-card host, for vLLM (NIXL),
SGLang (Mooncake) and vLLM-Ascend (Mooncake). Every rank's process is rendered and pinned byte-for-byte with its
golden file under tests/data/golden/topology-*.json, beside it the ports every process binds on each host
(topology-*.ports.json), read back from the argv and env by each engine's own rules (executor/engines/topology.py
`listening_ports`), all distinct per host. Each argv goes through its engine's own parser (vLLM's `vllm serve` from
the vLLM venv, SGLang's ServerArgs, sglang-router's and vllm-router's). Regenerate after a deliberate change with

    TUNELOOP_REGEN_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_engine_topology.py

(the run that rewrites them fails), then read the diff.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_engine_parsers_sglang import parser  # noqa: F401 - the pinned SGLang / router parsers (a fixture)

from core.station import Station, full_knobs
from executor.engines.topology import listening_ports
from executor.evidence_ranks import group_of
from executor.identity import engine_argv
from executor.scrape import parse_endpoints
from executor.targets import Host, Target, load_targets
from executor.templates import render

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "data" / "golden"
EXAMPLE = ROOT / "examples" / "targets-deepseek-pd-multinode.yaml"
PROXY = ("python3", "/opt/vllm-ascend/examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py")
EIGHT = "0,1,2,3,4,5,6,7"
FIELD = {"prefill": {"instances": 1, "tp": 8, "dp": 2, "ep": 16, "dp_local": 1},
         "decode": {"instances": 1, "tp": 1, "dp": 32, "ep": 32, "dp_local": 8}}
ONE_HOST = {"prefill": {"instances": 1, "tp": 8, "dp": 1, "ep": 8},
            "decode": {"instances": 1, "tp": 1, "dp": 8, "ep": 8, "dp_local": 8}}
ENGINES = {"vllm": ("vllm", {"pd_connector": "NixlConnector"}),
           "sglang": ("sglang", {"pd_connector": "mooncake"}),
           "vllm-ascend": ("vllm", {"router_command": PROXY, "env": {
               "GLOO_SOCKET_IFNAME": "eth0", "TP_SOCKET_IFNAME": "eth0", "HCCL_SOCKET_IFNAME": "eth0"}})}


def _station(engine: str, knobs: dict | None = None) -> Station:
    key = ENGINES[engine][0]
    return Station(engine=engine, knobs=full_knobs({"max_num_seqs": 64, "enable_expert_parallel": True,
                                                    **(knobs or {})}, key),
                   scenario="copy16k-zero-cache", data_version="d", source_identity="s", target="c")


def _multinode_hosts() -> tuple[Host, ...]:
    return (*(Host(host=f"10.0.1.{i}", roles=("prefill",), cards=8, port=8100, devices=EIGHT) for i in (1, 2)),
            *(Host(host=f"10.0.2.{i}", roles=("decode",), cards=8, port=8200, devices=EIGHT) for i in (1, 2, 3, 4)),
            Host(host="10.0.0.1", roles=("router", "load"), cards=0, port=8000))


def _one_host() -> tuple[Host, ...]:
    """P8 + D8 on one 16-card host, its router and load generator there too."""
    return (Host(host="10.0.0.1", roles=("prefill",), cards=8, port=8100, devices=EIGHT),
            Host(host="10.0.0.1", roles=("decode",), cards=8, port=8200, devices="8,9,10,11,12,13,14,15"),
            Host(host="10.0.0.1", roles=("router", "load"), cards=0, port=8000))


def _target(engine: str, hosts: tuple[Host, ...], topology: dict, **over) -> Target:
    fields = dict(name="c", kind="ssh", engine=engine, model="/models/dsr1", run_root="/srv/tl",
                  ssh={"known_hosts": "/kh"}, hosts=hosts, topology=topology, **ENGINES[engine][1])
    return Target(**(fields | over))


CASES = {f"topology-{engine}-{shape}": (engine, hosts, topo)
         for engine in ENGINES for shape, hosts, topo in (("p2x8-d32x1-6hosts", _multinode_hosts, FIELD),
                                                           ("p8-d8-1host", _one_host, ONE_HOST))}


def _rendered(name: str):
    engine, hosts, topo = CASES[name]
    return render(_target(engine, hosts(), topo), _station(engine))


def _compare(path: Path, text: str) -> None:
    if os.environ.get("TUNELOOP_REGEN_GOLDEN") == "1":
        path.write_text(text)
        pytest.fail(f"regenerated {path}; rerun without TUNELOOP_REGEN_GOLDEN and read the diff")
    assert path.exists(), f"{path} is missing: run with TUNELOOP_REGEN_GOLDEN=1 once"
    assert text == path.read_text(), f"{path.name}: the rendering changed; see the module docstring to regenerate"


def _ports_text(r) -> str:
    listing = {h: [f"{p} {what}" for p, what in ps] for h, ps in sorted(listening_ports(r).items())}
    return json.dumps(listing, indent=1) + "\n"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_rank_process_matches_its_golden_file(name):
    _compare(GOLDEN / f"{name}.json", _rendered(name).model_dump_json(indent=1) + "\n")


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_port_per_host_is_listed_and_distinct(name):
    """The ports every process of the deployment binds, per host (a golden listing), no port claimed twice."""
    r = _rendered(name)
    text = _ports_text(r)
    _compare(GOLDEN / f"{name}.ports.json", text)
    for host, ports in listening_ports(r).items():
        seen: dict[int, str] = {}
        for port, what in ports:
            assert port not in seen, f"{host}:{port} is claimed by {seen[port]} and {what}"
            seen[port] = what


def _ranks(svc) -> list[int]:
    a = list(svc.argv)
    def after(flag, default):
        return int(a[a.index(flag) + 1]) if flag in a else default
    if "--data-parallel-rank" in a:
        return [after("--data-parallel-rank", 0)]
    if "--node-rank" in a:  # SGLang: node k holds attention-DP ranks k x L .. (k + 1) x L - 1
        dp, nodes = after("--attn-dp-size", 1), after("--nnodes", 1)
        k = after("--node-rank", 0)
        return list(range(k * dp // nodes, (k + 1) * dp // nodes))
    first = after("--data-parallel-start-rank", 0)
    return list(range(first, first + after("--data-parallel-size-local", after("--data-parallel-size",
                                                                                 after("--attn-dp-size", 1)))))


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_dp_rank_of_every_instance_has_exactly_one_process_on_its_cards(name):
    engine, _, topo = CASES[name]
    r = _rendered(name)
    for role, shape in topo.items():
        procs = [s for s in r.services if s.role == role]
        ranks = sorted(x for s in procs for x in _ranks(s))
        assert ranks == list(range(shape["dp"])), (role, ranks)
        assert sum(s.cards for s in procs) == shape["tp"] * shape["dp"]
        per_host: dict[str, set[str]] = {}
        for s in procs:
            devs = s.env.get("ASCEND_RT_VISIBLE_DEVICES") or s.env.get("CUDA_VISIBLE_DEVICES")
            got = set(devs.split(","))
            assert len(got) == s.cards and not got & per_host.get(s.host, set()), (s.name, devs)
            per_host.setdefault(s.host, set()).update(got)
    leaders = [s for s in r.services if s.role in ("prefill", "decode") and s.leader is None]
    followers = [s for s in r.services if s.leader is not None]
    assert all(f.leader in {s.name for s in leaders} for f in followers)
    expect = {"vllm": 2, "sglang": 2, "vllm-ascend": 2 + 32}[engine] if "6hosts" in name else \
        {"vllm": 2, "sglang": 2, "vllm-ascend": 1 + 8}[engine]
    assert len(leaders) == expect


def _after(argv, flag):
    return argv[argv.index(flag) + 1]


def test_vllm_multinode_flags_follow_vllms_own_dp_deployment():
    """vLLM's data_parallel_deployment: the leader serves the API with --data-parallel-size-local / -address /
    -rpc-port; each other host runs --headless from --data-parallel-start-rank k x L, healthy when its leader is."""
    r = _rendered("topology-vllm-p2x8-d32x1-6hosts")
    decode = [s for s in r.services if s.role == "decode"]
    assert [s.host for s in decode] == ["10.0.2.1", "10.0.2.2", "10.0.2.3", "10.0.2.4"]
    lead, *rest = decode
    assert "--headless" not in lead.argv and _after(lead.argv, "--port") == "8200"
    for k, s in enumerate(rest, start=1):
        assert "--headless" in s.argv and "--port" not in s.argv
        assert _after(s.argv, "--data-parallel-start-rank") == str(8 * k)
        assert (s.leader, s.health_host, s.health_port) == ("decode-0", "10.0.2.1", 8200)
        assert s.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == s.host  # remote peers reach each node's own side channel
    for s in decode:
        assert _after(s.argv, "--data-parallel-size") == "32" and _after(s.argv, "--data-parallel-size-local") == "8"
        assert _after(s.argv, "--data-parallel-address") == "10.0.2.1"
        assert "--enable-expert-parallel" in s.argv and "--tensor-parallel-size" not in s.argv  # TP 1
    router = r.services[-1]
    assert [router.argv[i + 1] for i, a in enumerate(router.argv) if a in ("--prefill", "--decode")] == [
        "http://10.0.1.1:8100", "http://10.0.2.1:8200"]


def test_sglang_multinode_flags_and_node_endpoints():
    r = _rendered("topology-sglang-p2x8-d32x1-6hosts")
    decode = [s for s in r.services if s.role == "decode"]
    for k, s in enumerate(decode):
        assert (_after(s.argv, "--nnodes"), _after(s.argv, "--node-rank")) == ("4", str(k))
        assert _after(s.argv, "--dist-init-addr") == "10.0.2.1:8433"  # --port + 233, SGLang's own default offset
        assert (_after(s.argv, "--tp-size"), _after(s.argv, "--attn-dp-size"), _after(s.argv, "--ep-size")) == (
            "32", "32", "32")
        assert "--dp-size" not in s.argv  # SGLang refuses DP replicas across nodes
    prefill = [s for s in r.services if s.role == "prefill"]
    assert [(_after(s.argv, "--tp-size"), _after(s.argv, "--attn-dp-size")) for s in prefill] == [("16", "2")] * 2
    # node ranks above 0 serve /health and /metrics on their own --port: scraped as the instance's node endpoints
    assert sorted(r.metrics) == ["decode-0", "decode-0.n1", "decode-0.n2", "decode-0.n3", "prefill-0", "prefill-0.n1"]


def test_vllm_ascend_external_dp_as_its_guide_runs_it():
    """One process per DP rank (examples/external_online_dp): its own port (the host's + local index) and TP cards,
    --data-parallel-rank; the proxy lists every rank; one kv_port per instance, each rank's at + rank x TP."""
    r = _rendered("topology-vllm-ascend-p2x8-d32x1-6hosts")
    decode = [s for s in r.services if s.role == "decode"]
    assert len(decode) == 32
    s = decode[13]  # rank 13: the second host's sixth rank
    assert (s.name, s.host, s.port, s.env["ASCEND_RT_VISIBLE_DEVICES"]) == ("decode-0-r13", "10.0.2.2", 8205, "5")
    assert _after(s.argv, "--data-parallel-rank") == "13" and _after(s.argv, "--data-parallel-address") == "10.0.2.1"
    kv = json.loads(_after(s.argv, "--kv-transfer-config"))
    assert kv["kv_connector_extra_config"] == {"prefill": {"tp_size": 8, "dp_size": 2},
                                               "decode": {"tp_size": 1, "dp_size": 32}}
    router = list(r.services[-1].argv)
    hosts = router[router.index("--decoder-hosts") + 1:router.index("--decoder-ports")]
    assert len(hosts) == 32 and hosts[8] == "10.0.2.2"
    assert router[router.index("--prefiller-ports") + 1:router.index("--decoder-hosts")] == ["8100", "8100"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_process_serving_metrics_is_a_scrape_target_the_scraper_takes(name):
    """Each process with a /metrics of its own is scraped under its instance: a rank endpoint (decode-0.r3), a node
    (decode-0.n1), or the instance (its leader); a vLLM headless worker is not (its leader's /metrics has its ranks)."""
    r = _rendered(name)
    engines = [s for s in r.services if s.role != "router"]
    named = parse_endpoints([f"{k}={v}" for k, v in r.metrics.items()])
    assert {group_of(n)[0] for n, _ in named} == {s.leader or s.name.split("-r")[0] for s in engines}
    for s in engines:
        key = s.metrics_name or s.name
        if s.leader is not None and s.metrics_name is None:
            assert key not in r.metrics and "--headless" in s.argv
        else:
            assert r.metrics[key] == f"http://{s.host}:{s.port}/metrics"


def _field_target(engine: str, **topo) -> Target:
    shape = {"prefill": FIELD["prefill"], "decode": FIELD["decode"] | topo}
    return _target(engine, _multinode_hosts(), shape)


def test_bad_shapes_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"topology.decode.dp_local: 6 DP ranks per host do not divide DP 32"):
        _field_target("vllm", dp_local=6)
    with pytest.raises(ValueError, match=r"topology.decode.ep: 8: the engines shard experts over every rank"):
        _field_target("vllm", ep=8)
    with pytest.raises(ValueError, match=r"topology.decode.tp: TP 2 x 8 DP rank\(s\) per host = 16 cards, but host "
                                         r"entry 10.0.2.1:8200 has 8"):
        _field_target("vllm", tp=2, ep=None)
    with pytest.raises(ValueError, match=r"topology.decode.instances: 2 instance\(s\) of DP 32 .* take 8 host entries"):
        _field_target("vllm", instances=2)
    with pytest.raises(ValueError, match=r"topology: engine 'mindie' renders one instance per host entry"):
        Target(**(_field_target("vllm").model_dump() | {"engine": "mindie"}))
    with pytest.raises(ValueError, match=r"topology.decode.dp_local: instance 0 of decode would take two host entries"):
        _target("vllm", (*_one_host()[:1], *(Host(host="10.0.0.1", roles=("decode",), cards=4, port=8200 + i)
                                              for i in (0, 1)), _one_host()[2]),
                {"prefill": ONE_HOST["prefill"], "decode": {"tp": 1, "dp": 8, "dp_local": 4}})
    t = _field_target("vllm")  # the station's parallel knobs may not contradict the target's topology
    with pytest.raises(ValueError, match=r"data_parallel_size: 4 differs from the target's topology.prefill"):
        render(t, _station("vllm", {"data_parallel_size": 4}))
    with pytest.raises(ValueError, match=r"enable_expert_parallel: true, but the target's topology.decode fixes ep: 1"):
        render(_field_target("vllm", ep=1), _station("vllm"))


def test_the_example_targets_file_loads_and_every_target_renders_with_distinct_ports():
    targets = load_targets(EXAMPLE)
    names = [n for n in targets if n != "sim"]
    assert len(names) == 3
    for n in names:
        t = targets[n]
        r = render(t, _station(t.engine))
        assert len([s for s in r.services if s.role != "router"]) == (34 if t.engine == "vllm-ascend" else 6)
        for host, ports in listening_ports(r).items():
            assert len({p for p, _ in ports}) == len(ports), (n, host)


# -- each argv through its engine's own parser ------------------------------------------------------------------

def _vllm_python() -> str:
    from unavailable import missing

    from executor.engines.vllm_setup import vllm_binary
    try:
        return str(Path(vllm_binary()).parent / "python")
    except FileNotFoundError as e:
        missing(f"vllm is not installed: {e} (make vllm)")


@pytest.mark.parametrize("shape", ["p2x8-d32x1-6hosts", "p8-d8-1host"])
def test_vllm_and_vllm_ascend_processes_parse_with_vllms_own_parser(shape):
    from vllm_support import parse_with_vllm

    argvs, labels = [], []
    for engine in ("vllm", "vllm-ascend"):
        for s in _rendered(f"topology-{engine}-{shape}").services:
            if s.role != "router":
                argvs.append(list(engine_argv(s.argv)[1:]))
                labels.append(f"{engine} {s.name}")
    results = parse_with_vllm(_vllm_python(), argvs)
    bad = [(lab, r["error"], r["inexact"]) for lab, r in zip(labels, results) if not r["ok"] or r["inexact"]]
    assert not bad, bad
    by = dict(zip(labels, results))
    head = by["vllm decode-0"]["args"]
    assert (head["data_parallel_size"], head["data_parallel_size_local"], head["headless"]) == (
        (32, 8, False) if "6hosts" in shape else (8, None, False))  # one host: vLLM's internal DP, no address
    if "6hosts" in shape:
        worker = by["vllm decode-0-n3"]["args"]
        assert (worker["headless"], worker["data_parallel_start_rank"], worker["data_parallel_address"]) == (
            True, 24, "10.0.2.1")
        rank = by["vllm-ascend decode-0-r31"]["args"]
        assert (rank["data_parallel_rank"], rank["data_parallel_size"]) == (31, 32)


@pytest.mark.parametrize("shape", ["p2x8-d32x1-6hosts", "p8-d8-1host"])
def test_sglang_processes_and_both_routers_parse_with_their_own_parsers(parser, shape):
    from executor.engines import sglang_parser

    r = _rendered(f"topology-sglang-{shape}")
    engines = [list(s.argv[3:]) for s in r.services if s.role != "router"]
    assert sglang_parser.check_with(parser, engines) == [None] * len(engines)
    router = list(r.services[-1].argv[3:])
    assert sglang_parser.check_with(parser, [router], kind="router") == [None]
    vrouter = list(_rendered(f"topology-vllm-{shape}").services[-1].argv[1:])
    assert sglang_parser.check_with(parser, [vrouter], kind="vllm-router") == [None]


def test_vllm_mooncake_bootstrap_is_planned_on_each_prefill_leader_and_told_to_the_router():
    """vLLM's MooncakeConnector on the field's shape: one bootstrap server per prefill instance (DP index 0, on its
    leader; a headless node's workers register there), every process of the instance told its port."""
    t = _target("vllm", _multinode_hosts(), FIELD, pd_connector="MooncakeConnector")
    r = render(t, _station("vllm"))
    prefill = [s for s in r.services if s.role == "prefill"]
    assert {s.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] for s in prefill} == {"8998"}
    router = list(r.services[-1].argv)
    assert router[router.index("--prefill") + 1:router.index("--prefill") + 3] == ["http://10.0.1.1:8100", "8998"]
    ports = listening_ports(r)
    assert [w for p, w in ports["10.0.1.1"] if p == 8998] == ["prefill-0: Mooncake bootstrap server"]
    assert all(len({p for p, _ in ps}) == len(ps) for ps in ports.values())


@pytest.mark.parametrize("engine", ["vllm", "vllm-ascend", "sglang"])
def test_a_mixed_instance_over_two_hosts_serves_one_endpoint_with_every_rank_behind_it(engine):
    """Without P/D there is no proxy to spread requests over ranks: the load goes to the instance's leader, and vLLM-
    Ascend renders vLLM's own DP (headless beyond the leader) rather than one process per rank."""
    t = Target(name="m", kind="local", engine=engine, model="/m", hosts=(
        Host(host="10.0.0.1", roles=("mixed", "load"), cards=8, port=8000),
        Host(host="10.0.0.2", roles=("mixed",), cards=8, port=8000)),
        topology={"mixed": {"tp": 2, "dp": 8, "dp_local": 4}})
    r = render(t, _station(engine, {"enable_expert_parallel": False}))
    assert r.endpoint == "http://10.0.0.1:8000" and [s.name for s in r.services] == ["mixed-0", "mixed-0-n1"]
    assert r.services[1].leader == "mixed-0" and sum(s.cards for s in r.services) == 16
    assert _ranks(r.services[0]) == [0, 1, 2, 3] and _ranks(r.services[1]) == [4, 5, 6, 7]


def test_a_headless_worker_is_probed_flushed_and_profiled_through_its_leader():
    """A vLLM --headless process serves no HTTP: its health probe goes to its leader's host and port, the prefix-cache
    flush and the profiler window skip it (its leader's API reaches its ranks); an SGLang node above 0 answers its own
    /health (SGLang's dummy health server) and is flushed through node 0."""
    from executor.cacheflush import cache_holders
    from executor.transports.base import health_target

    r = _rendered("topology-vllm-p2x8-d32x1-6hosts")
    worker = next(s for s in r.services if s.name == "decode-0-n2")
    probe = health_target(worker)
    assert (probe.host, probe.port, worker.host) == ("10.0.2.1", 8200, "10.0.2.3")
    assert [s.name for s in cache_holders(r.services)] == ["prefill-0", "decode-0"]
    assert [s.name for s in r.services if s.profile_dir] == ["prefill-0", "decode-0"]
    r = _rendered("topology-sglang-p2x8-d32x1-6hosts")
    node = next(s for s in r.services if s.name == "decode-0-n2")
    assert (health_target(node).host, health_target(node).port) == ("10.0.2.3", 8200)
    assert [s.name for s in cache_holders(r.services)] == ["prefill-0", "decode-0"]


def test_node_endpoints_of_one_instance_digest_as_its_ranks():
    """Samples scraped from SGLang's node endpoints (decode-0, decode-0.n1) are one instance's ranks, each rank the
    one its dp_rank label names, and the instance counts once."""
    from core.records import EngineSample
    from executor.evidence_ranks import ranks

    def sample(t, inst, rank, running):
        return EngineSample(t=t, role="decode", instance=inst,
                            values={f'sglang:num_running_reqs{{dp_rank="{rank}"}}': running})
    got = ranks([sample(t, "decode-0" if r < 2 else "decode-0.n1", r, 4.0 + r) for t in (0.0, 1.0) for r in range(4)])
    assert list(got) == ["decode-0"]
    assert {k: v.running_mean for k, v in got["decode-0"].ranks.items()} == {
        "dp_rank=0": 4.0, "dp_rank=1": 5.0, "dp_rank=2": 6.0, "dp_rank=3": 7.0}


def test_nixl_moving_host_memory_gets_its_sleeping_progress_thread_on_every_process_of_a_multinode_instance():
    """The shim a one-host P/D instance gets when NIXL moves host memory (executor/engines/vllm_nixl.py) reaches every
    process of an instance over several hosts, headless workers included, each in its own service directory; a
    deployment whose KV stays on its cards gets none."""
    from executor.engines.base import svc_dir
    from executor.engines.vllm_nixl import SHIM, SITECUSTOMIZE

    t = _target("vllm", _multinode_hosts(), FIELD, pd_connector_config={"kv_buffer_device": "cpu"},
                env={"PYTHONPATH": "/opt/site"})
    *engines, router = render(t, _station("vllm")).services
    assert {s.role for s in engines} == {"prefill", "decode"} and any(s.leader for s in engines)
    for s in engines:
        assert s.files == {SITECUSTOMIZE: SHIM}
        assert s.env["PYTHONPATH"] == f"{svc_dir(t, s.name, s.host)}:/opt/site"
    assert not router.files
    assert all(not s.files and "PYTHONPATH" not in s.env for s in _rendered("topology-vllm-p2x8-d32x1-6hosts").services)
