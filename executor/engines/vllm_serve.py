"""One `vllm serve` of the generated model on a free 127.0.0.1 port, for the self-test, the tests and the bench.

The loop itself launches vLLM through its target (executor.templates / launcher); this is the direct start that
the self-test (one completion) and the parser / metrics / cross-check checks share: a server in its own process
group, health-polled, stopped with TERM (then KILL) and its log kept for the error message.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Sequence

import httpx

from executor.engines.llamacpp_build import _signal_text
from executor.ports import free_port, owned
from executor.engines.vllm_setup import BASE_ENV, SelfTestError, avx2_check, loaded_kernels, version

# the flags every CPU serve here needs (ENGINES facts: eager mode, fp32 on an AVX2-only CPU, a short context)
CPU_ARGS = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "512")




class Server:
    """`vllm serve MODEL` with `args`; use as a context manager or start()/stop()."""

    def __init__(self, vllm: str, model: Path, args: Sequence[str] = (), log: Path | None = None,
                 port: int | None = None, env: dict[str, str] | None = None, cpus: str | None = None,
                 niceness: int | None = None):
        self.vllm, self.model, self.args = vllm, Path(model).resolve(), list(args)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._tmp = None
        if log is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="vllm-serve.")
            log = Path(self._tmp.name) / "server.log"
        self.log_path = Path(log)
        self.env = os.environ | BASE_ENV | (env or {})
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None
        self.cpus = cpus  # a taskset core list: the server and every process it starts run only there
        # a `nice` adjustment for the server and every process it starts: vLLM's CPU workers spin on their shared-
        # memory queues between steps (sched_yield), so beside other work on few cores they take what they spin on
        self.niceness = niceness

    @property
    def argv(self) -> list[str]:
        pin = ["taskset", "-c", self.cpus] if self.cpus else []
        nice = ["nice", "-n", str(self.niceness)] if self.niceness is not None else []
        return [*nice, *pin, self.vllm, "serve", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
                "--served-model-name", "tiny", *CPU_ARGS, *self.args]

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _died(self, when: str) -> SelfTestError:
        rc = self.proc.returncode if self.proc else None
        what = _signal_text(rc) if rc is not None and rc < 0 else f"exit {rc}"
        return SelfTestError(f"{self.vllm}: `vllm serve` died with {what} {when}; log ({self.log_path}) tail:\n"
                             f"{self.log_tail(1500)}")

    def start(self, timeout_s: float = 600.0, attempts: int = 3) -> "Server":
        """Start and wait for /health; a health answer from a process not of this server's session (another
        process took the port between free_port() and the bind) restarts it on a fresh port (`attempts` in all)."""
        t0 = time.monotonic()
        for attempt in range(attempts):
            if self._start_once(t0, timeout_s):
                self.startup_s = round(time.monotonic() - t0, 1)
                return self
            taken = self.port
            self.stop(keep_log=True)
            if attempt == attempts - 1:
                raise SelfTestError(f"{self.vllm}: port {taken} was taken by another process before `vllm serve` "
                                    f"bound it, {attempts} times")
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
        raise AssertionError("unreachable")

    def _start_once(self, t0: float, timeout_s: float) -> bool:
        """True once this server answers /health; False when the answer came from another process's listener."""
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         cwd=self.log_path.parent, start_new_session=True)
        with httpx.Client(base_url=self.url, timeout=10.0) as client:
            while True:
                if self.proc.poll() is not None:
                    raise self._died("while starting")
                try:
                    if client.get("/health").status_code == 200:
                        return owned(self.port, self.proc.pid) is not False
                except httpx.TransportError:
                    pass
                if time.monotonic() - t0 > timeout_s:
                    self.stop()
                    raise SelfTestError(f"{self.vllm}: not healthy after {timeout_s:.0f} s; log tail:\n{self.log_tail()}")
                time.sleep(0.5)

    def stop(self, keep_log: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self._tmp is not None and not keep_log:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def complete(self, prompt: str = "hello", max_tokens: int = 1) -> dict:
        try:
            r = httpx.post(f"{self.url}/v1/completions", timeout=120.0,
                           json={"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                                 "min_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0})
        except httpx.TransportError:
            if self.proc is not None:
                self.proc.wait(30)
            raise self._died(f"on a {max_tokens}-token completion") from None
        if r.status_code != 200:
            raise SelfTestError(f"{self.vllm}: /v1/completions answered {r.status_code}: {r.text[:500]}")
        return r.json()

    def kernels(self) -> list[str]:
        return loaded_kernels(self.proc.pid) if self.proc else []


def selftest(vllm: str, model: Path) -> dict:
    """Raise SelfTestError (naming the binary and the signal / exit) unless vLLM serves here: `--version`, a
    serve of the generated model, one completion; reports the kernel build the engine process loaded."""
    if not Path(vllm).is_file():
        raise SelfTestError(f"{vllm}: no such vllm (run `tuneloop vllm install`)")
    ver = version(vllm)
    venv = Path(vllm).resolve().parent.parent
    scan = avx2_check(venv) if list(venv.glob("lib/python*/site-packages/vllm/_C_AVX2.abi3.so")) else {}
    if scan.get("avx2_build_needs"):
        raise SelfTestError(f"{vllm}: its AVX2 kernel build {scan['avx2_build']} needs instructions an AVX2-only CPU "
                            f"lacks (would die with SIGILL there): {scan['avx2_build_needs']}")
    with Server(vllm, model) as srv:
        resp = srv.complete()
        kernels = srv.kernels()
        startup = srv.startup_s
    usage = resp.get("usage") or {}
    if usage.get("completion_tokens") != 1:
        raise SelfTestError(f"{vllm}: one-token completion returned {usage.get('completion_tokens')!r} tokens")
    if not kernels:
        raise SelfTestError(f"{vllm}: the engine process mapped none of vLLM's kernel builds {KERNELS_TEXT}")
    return {"binary": vllm, "version": ver, "kernels": kernels, "startup_s": startup,
            "avx2_build_clean": scan.get("avx2_build_needs") == {} if scan else None,
            "completion": resp["choices"][0]["text"]}


KERNELS_TEXT = "(_C, _C_AVX512, _C_AVX2)"
