"""SGLang's own parsers check every argv tuneloop renders for SGLang (executor/engines/sglang_parser.py installs the pinned
sglang 0.5.23 wheel's `ServerArgs` argparse parser and sglang-router 0.3.2's launch_router parser into the tuneloop
cache). Every SGLang knob of the catalog is
rendered at each of its value classes, for a PD target (prefill and decode) and a mixed one, and every argv must
parse; a misspelt flag, a removed one and a bad choice must be refused by that same parser. Under CI=true a
parser that cannot be installed fails this module; elsewhere it is skipped with the reason."""
from __future__ import annotations

import pytest
from test_llamacpp_flags import _value_classes  # min, default, max; both booleans; every choice; None
from unavailable import missing

from core.knobs import catalog
from core.station import Station, full_knobs
from executor.engines import sglang_parser
from executor.targets import Host, Relayout, Target
from executor.templates import render

KNOBS = catalog().for_engine("sglang")
RELAYOUT = Relayout(collect=("collect", "{stats}"), fit=("fit", "{stats}", "{layout}"))


@pytest.fixture(scope="module")
def parser():
    try:
        return sglang_parser.ensure()
    except sglang_parser.ParserUnavailable as e:
        missing(f"SGLang's parser is not installed here: {e}")


def _targets(cards: int) -> list[Target]:
    pd = Target(name="c", kind="local", engine="sglang", model="/models/m", run_root="/srv/tl", relayout=RELAYOUT,
                hosts=(Host(host="10.0.0.1", roles=("prefill",), cards=cards, port=8100),
                       Host(host="10.0.0.1", roles=("prefill",), cards=cards, port=8101),
                       Host(host="10.0.0.2", roles=("decode",), cards=cards, port=8200),
                       Host(host="10.0.0.3", roles=("router", "load"), cards=0, port=8000)))
    mixed = Target(name="m", kind="local", engine="sglang", model="/models/m", relayout=RELAYOUT,
                   hosts=(Host(host="127.0.0.1", roles=("mixed", "load"), cards=cards, port=30000),))
    return [pd, mixed]


def _knobs(knob, value) -> dict:
    out = {knob.name: value}
    # e.g. a draft width needs a speculative method first (at its default, 0, it needs none: a method with width 0
    # is refused before any rendering, core.station.full_knobs)
    for dep in (knob.depends_on if value != knob.default else ()):
        out[dep.knob] = "mtp" if dep.knob == "speculative_method" else dep.value
    if out.get("speculative_method") not in (None, "none") and not out.get("num_speculative_tokens"):
        out["num_speculative_tokens"] = 1  # a draft method drafts a token at least (full_knobs refuses 0)
    if knob.name == "attn_dp_size" and value is not None:
        out["tensor_parallel_size"] = value  # attention DP groups divide the TP width
    if knob.name == "expert_layout" and value == "dynamic":
        out["enable_expert_parallel"] = True  # SGLang's --enable-eplb asserts an EP size above 1
    return out


def _argvs(knobs: dict, cards: int = 0, router: bool = False) -> list[list[str]]:
    """The engine argvs (after `-m sglang.launch_server`), or with router=True the router argvs."""
    argvs = []
    for t in _targets(cards):
        st = Station(engine="sglang", knobs=full_knobs(knobs, "sglang"), scenario="s", data_version="d",
                     source_identity="s", target=t.name)
        for svc in render(t, st).services:
            if (svc.role == "router") == router:
                module = "sglang_router.launch_router" if router else "sglang.launch_server"
                assert list(svc.argv[:3]) == ["python", "-m", module]
                argvs.append(list(svc.argv[3:]))
    return argvs


def _engine_argvs(knobs: dict, cards: int = 0) -> list[list[str]]:
    return _argvs(knobs, cards)


def test_every_knob_and_value_class_parses(parser):
    argvs, labels = [], []
    for knob in KNOBS:
        for value in _value_classes(knob):
            dynamic = knob.name == "expert_layout" and value == "dynamic"
            for argv in _engine_argvs(_knobs(knob, value), 2 if dynamic else 0):  # EP over 2 cards
                argvs.append(argv)
                labels.append(f"{knob.name}={value!r}")
    for cards in (1, 8):  # sizes rendered from the cards of each instance
        for argv in _engine_argvs({"enable_expert_parallel": True, "attn_dp_size": 1}, cards):
            argvs.append(argv)
            labels.append(f"cards={cards}")
    verdicts = sglang_parser.check_with(parser, argvs)
    bad = [(lab, v, a) for lab, v, a in zip(labels, verdicts, argvs) if v is not None]
    assert not bad, bad[:5]
    assert len(argvs) > 3 * len(KNOBS)


def test_a_misspelt_removed_or_bad_value_flag_is_refused_by_the_parser(parser):
    argv = _engine_argvs({"max_num_batched_tokens": 32768})[0]
    assert "--chunked-prefill-size" in argv and "--max-prefill-tokens" in argv
    misspelt = [("--chunked-prefil-size" if a == "--chunked-prefill-size" else a) for a in argv]
    removed = argv + ["--cuda-graph-max-bs", "8"]  # gone in 0.5.23 (split into -decode / -prefill)
    bad_choice = argv + ["--disaggregation-transfer-backend", "carrier-pigeon"]
    ok, v1, v2, v3 = sglang_parser.check_with(parser, [argv, misspelt, removed, bad_choice])
    assert ok is None
    assert v1 and "--chunked-prefil-size" in v1
    assert v2 and "--cuda-graph-max-bs" in v2
    assert v3 and "carrier-pigeon" in v3


def test_the_pd_router_argv_parses_with_every_bootstrap_port_and_a_misspelt_flag_does_not(parser):
    (argv,) = _argvs({}, 8, router=True)
    assert argv.count("--prefill") == 2 and "8999" in argv
    misspelt = [("--pd-disagregation" if a == "--pd-disaggregation" else a) for a in argv]
    ok, bad = sglang_parser.check_with(parser, [argv, misspelt], kind="router")
    assert ok is None and bad and "--pd-disagregation" in bad


def _vllm_router(**kw) -> tuple[str, ...]:
    """The vllm-router argv of a vLLM P/D target: two prefill instances on one host, one decode instance."""
    t = Target(name="v", kind="local", engine="vllm", model="/models/m", run_root="/srv/tl", **kw,
               hosts=(Host(host="10.0.0.1", roles=("prefill",), cards=1, port=8100),
                      Host(host="10.0.0.1", roles=("prefill",), cards=1, port=8101),
                      Host(host="10.0.0.2", roles=("decode",), cards=1, port=8200),
                      Host(host="10.0.0.3", roles=("router", "load"), cards=0, port=8000)))
    st = Station(engine="vllm", knobs=full_knobs({}, "vllm"), scenario="s", data_version="d", source_identity="s",
                 target="v")
    return render(t, st).services[-1].argv


def test_the_vllm_pd_router_argv_parses_with_vllm_routers_own_arguments(parser):
    rendered = _vllm_router()
    assert rendered[0] == "vllm-router"
    argv = list(rendered[1:])
    misspelt = [("--vllm-pd-disagregation" if a == "--vllm-pd-disaggregation" else a) for a in argv]
    ok, bad = sglang_parser.check_with(parser, [argv, misspelt], kind="vllm-router")
    assert ok is None and bad and "--vllm-pd-disagregation" in bad


def test_attention_dp_instances_moved_off_each_others_port_block_parse(parser):
    """Two prefill instances at ports 8100 and 8101 with --attn-dp-size 4: the second is given its own PortArgs block
    by --dist-init-addr, which SGLang's parser takes (executor/engines/sglang_ports.py)."""
    t = _targets(4)[0]
    st = Station(engine="sglang", knobs=full_knobs({"attn_dp_size": 4}, "sglang"), scenario="s", data_version="d",
                 source_identity="s", target=t.name)
    argvs = [list(s.argv[3:]) for s in render(t, st).services if s.role != "router"]
    assert sum("--dist-init-addr" in a for a in argvs) == 1
    assert sglang_parser.check_with(parser, argvs) == [None] * len(argvs)


def test_the_vllm_router_mooncake_argv_parses_and_a_connector_it_does_not_know_does_not(parser):
    argv = list(_vllm_router(pd_connector="MooncakeConnector")[1:])
    assert argv[argv.index("--kv-connector") + 1] == "mooncake" and "8999" in argv  # each prefill's bootstrap port
    bad = [("lmcache" if a == "mooncake" else a) for a in argv]
    ok, refused = sglang_parser.check_with(parser, [argv, bad], kind="vllm-router")
    assert ok is None and refused and "lmcache" in refused
