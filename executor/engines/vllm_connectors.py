"""Which KV connectors the vLLM adapters render for P/D, and what each needs beyond its --kv-transfer-config.

A connector is either rendered complete or refused before any launch, naming `pd_connector` and why:

* NixlConnector (vLLM's default): its side channel per instance (executor/engines/vllm.py `pd_env`).
* MooncakeConnector (vLLM 0.32, distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py): each prefill
  instance starts a bootstrap server on VLLM_MOONCAKE_BOOTSTRAP_PORT (vllm/envs.py, default 8998;
  `should_launch_bootstrap_server` / `get_mooncake_bootstrap_addr`), so two prefill instances on one host need two
  ports; vLLM's docs/features/mooncake_connector_usage.md counts a port per worker on a node (base + DP rank x TP +
  TP rank), so each further prefill instance on a host starts TP x DP above the one before. vllm-router is told
  `--kv-connector mooncake` (its default is nixl; py_src/vllm_router/router_args.py) and each prefill's bootstrap
  port (`--prefill URL PORT`), since Mooncake's router asks each prefill's bootstrap server for its engine ids.
* LMCacheConnectorV1: refused. LMCache's P/D reads a configuration file per role (LMCACHE_CONFIG_FILE: enable_pd,
  pd_role sender / receiver, the peer's host and ports, its proxy, transfer_channel), and LMCache's examples put its
  own proxy in front (disagg_proxy_server.py), none of which tuneloop renders; launched without them it would not
  hand KV over as measured.
* Anything else: refused, naming the ones rendered.
"""
from __future__ import annotations

from typing import Any

from core.errors import FieldError
from executor.targets import Target

MOONCAKE = "MooncakeConnector"
MOONCAKE_BOOTSTRAP_PORT = 8998  # vLLM's default VLLM_MOONCAKE_BOOTSTRAP_PORT (vllm/envs.py)
LMCACHE_WHY = ("LMCacheConnectorV1 needs LMCache's own P/D configuration per role (LMCACHE_CONFIG_FILE with "
               "enable_pd, pd_role sender / receiver, the peer's host and ports, its proxy and transfer_channel) and "
               "LMCache's proxy in front, which tuneloop does not render; use NixlConnector or MooncakeConnector")


def env_port(target: Target, name: str, default: int) -> int:
    """The first port of a per-host block the target's env may move (two P/D deployments on one machine need
    different ones), else the engine's default."""
    raw = target.env.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise FieldError(f"env.{name}", f"{raw!r} is not a port")
    return int(raw)


def check_connector(connector: str, rendered: tuple[str, ...], engine: str) -> None:
    """Refuse a P/D connector this adapter does not render complete."""
    if connector in rendered:
        return
    if connector == "LMCacheConnectorV1":
        raise FieldError("pd_connector", LMCACHE_WHY)
    raise FieldError("pd_connector", f"{connector!r} is not a KV connector tuneloop renders for {engine} P/D "
                     f"(it renders {', '.join(rendered)}); a connector launched without what it needs would not "
                     "hand KV over as measured")


class MooncakeBootstrap:
    """The bootstrap port of every prefill instance, per host: the target's VLLM_MOONCAKE_BOOTSTRAP_PORT or 8998,
    then TP x DP above each prefill instance before it on that host."""

    def __init__(self, target: Target):
        self.base = env_port(target, "VLLM_MOONCAKE_BOOTSTRAP_PORT", MOONCAKE_BOOTSTRAP_PORT)
        self.next: dict[str, int] = {}

    def take(self, host: str, ranks: int) -> int:
        port = self.next.get(host, self.base)
        if port + ranks - 1 > 65535:
            raise FieldError("env.VLLM_MOONCAKE_BOOTSTRAP_PORT", f"the prefill instances on {host} need bootstrap "
                             f"ports up to {port + ranks - 1}, above 65535")
        self.next[host] = port + ranks
        return port


def router_connector_args(connector: str) -> list[str]:
    """vllm-router's connector flag (its default, nixl, is left unsaid)."""
    return ["--kv-connector", "mooncake"] if connector == MOONCAKE else []


def merged(kv: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The rendered connector config with the target's keys on top; a nested table (kv_connector_extra_config)
    is merged key by key, so the target's keys join the adapter's (vLLM-Ascend's P/D sizes) instead of
    replacing them."""
    out = dict(kv)
    for k, v in extra.items():
        out[k] = (dict(out[k]) | v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
