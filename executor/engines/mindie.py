"""MindIE (Ascend): a config.json per instance + `mindieservice_daemon`; no prefix-cache flush route."""
from __future__ import annotations

import json
from typing import Any

from core.station import Station
from executor.engines.base import (PY_VERSION, Adapter, Host, Rendered, ServiceSpec, device_env, instances, knob_flags,
                                   svc_dir, with_router)
from executor.engines.vllm import proxy_argv
from executor.targets import Target

MINDIE_SECTIONS = {"ScheduleConfig": ("BackendConfig", "ScheduleConfig"),
                   "ModelConfig": ("BackendConfig", "ModelDeployConfig", "ModelConfig", 0)}


def mindie_config(target: Target, station: Station, role: str, host: Host) -> dict[str, Any]:
    model: dict[str, Any] = {"modelName": str(target.model).rstrip("/").split("/")[-1], "modelWeightPath": target.model,
                             "worldSize": max(host.cards, 1), "npuMemSize": -1}
    cfg: dict[str, Any] = {
        "ServerConfig": {"ipAddress": "0.0.0.0", "port": host.port, "managementPort": host.port + 1,
                         "metricsPort": host.port + 2, "httpsEnabled": False, "inferMode": "dmi" if target.pd else "standard"},
        "BackendConfig": {"npuDeviceIds": [[int(d) for d in (host.devices or "0").split(",")]],
                          "ModelDeployConfig": {"ModelConfig": [model]},
                          "ScheduleConfig": {}},
    }
    if target.pd:
        cfg["ServerConfig"]["pdRole"] = role
    for key, value in knob_flags(station.server_knobs, "mindie", role):
        section, field = key.split(".", 1)
        node: Any = cfg
        for step in MINDIE_SECTIONS[section]:
            node = node[step]
        if field == "npuMemSize":  # the catalog's knob is a memory fraction; MindIE sizes KV itself (-1)
            continue
        node[field] = value
    return cfg


class MindIE(Adapter):
    name = "mindie"
    knob_key = "mindie"
    pinned = "MindIE 2.x (mindie_llm)"
    flush_path = None  # no flush route: a zero-cache run restarts the daemon

    def render(self, target: Target, station: Station, faults: tuple[str, ...] = (),
               expected_requests: int | None = None) -> Rendered:
        services: list[ServiceSpec] = []
        for role, i, host in instances(target):
            name = f"{role}-{i}"
            conf = f"{svc_dir(target, name, host.host)}/config.json"
            env = device_env(target, host, "ASCEND_RT_VISIBLE_DEVICES") | {"MIES_CONFIG_JSON_PATH": conf}
            text = json.dumps(mindie_config(target, station, role, host), indent=2, sort_keys=True)
            services.append(ServiceSpec(name=name, role=role, host=host.host, port=host.port,
                                        argv=("mindieservice_daemon",), env=env, files={"config.json": text},
                                        health_path="/health", cards=host.cards))
        return with_router(target, services, "mindie", proxy_argv)

    def version_probe(self, argv: tuple[str, ...], python: str) -> list[str] | None:
        return [python, "-c", PY_VERSION, "mindie_llm"]


ADAPTER = MindIE()
