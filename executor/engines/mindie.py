"""MindIE Service (Ascend): one config.json per instance (MIES_CONFIG_JSON_PATH) + `mindieservice_daemon`.

The config carries every field MindIE marks required (必填) with its documented default unless a knob sets it
(MindIE-LLM docs user_manual/service_parameter_configuration.md); 0.0.0.0 is refused unless
allowAllZeroIpListening is true. PD (`inferMode: "dmi"`) is not rendered: there the model loads only after the
MindIE MS Controller assigns each instance its role from a global rank table, and requests enter through the MS
Coordinator (ms_controller.json / ms_coordinator.json, TLS material, a cluster deployment), none of which a
target describes today; a PD MindIE target is refused with that reason. No prefix-cache flush route: a
zero-cache run restarts the daemon.
"""
from __future__ import annotations

import json
from typing import Any

from core.station import Station
from executor.engines.base import (PY_VERSION, Adapter, Host, Rendered, ServiceSpec, device_env, instances, knob_flags,
                                   svc_dir)
from executor.targets import Target

MINDIE_SECTIONS = {"ScheduleConfig": ("BackendConfig", "ScheduleConfig"),
                   "ModelConfig": ("BackendConfig", "ModelDeployConfig", "ModelConfig", 0)}
MAX_OUTPUT = 4096  # maxIterTimes: the longest output a request may ask for
SCHEDULE_DEFAULTS = {"templateType": "Standard", "templateName": "Standard_LLM", "cacheBlockSize": 128,
                     "maxPrefillBatchSize": 50, "maxPrefillTokens": 8192, "prefillTimeMsPerReq": 150,
                     "prefillPolicyType": 0, "decodeTimeMsPerReq": 50, "decodePolicyType": 0, "maxBatchSize": 200,
                     "maxIterTimes": MAX_OUTPUT, "maxPreemptCount": 0, "supportSelectBatch": False,
                     "maxQueueDelayMicroseconds": 5000}


def mindie_config(target: Target, station: Station, role: str, host: Host) -> dict[str, Any]:
    model: dict[str, Any] = {"modelInstanceType": "Standard", "modelName": str(target.model).rstrip("/").split("/")[-1],
                             "modelWeightPath": target.model, "worldSize": max(host.cards, 1), "cpuMemSize": 5,
                             "npuMemSize": -1, "backendType": "atb", "trustRemoteCode": False}
    cfg: dict[str, Any] = {
        "Version": "1.0.0",
        "LogConfig": {"dynamicLogLevel": "", "dynamicLogLevelValidHours": 2, "dynamicLogLevelValidTime": ""},
        "ServerConfig": {"ipAddress": "0.0.0.0", "allowAllZeroIpListening": True, "port": host.port,
                         "managementPort": host.port + 1, "metricsPort": host.port + 2, "httpsEnabled": False,
                         "inferMode": "standard", "interCommTLSEnabled": False, "distDPServerEnabled": False},
        "BackendConfig": {"backendName": "mindieservice_llm_engine", "modelInstanceNumber": 1,
                          "npuDeviceIds": [list(range(len((host.devices or "0").split(","))))],
                          "tokenizerProcessNumber": 8, "multiNodesInferEnabled": False, "interNodeTLSEnabled": False,
                          "ModelDeployConfig": {"truncation": False, "ModelConfig": [model]},
                          "ScheduleConfig": dict(SCHEDULE_DEFAULTS)},
    }
    for key, value in knob_flags(station.server_knobs, "mindie", role):
        section, field = key.split(".", 1)
        node: Any = cfg
        for step in MINDIE_SECTIONS[section]:
            node = node[step]
        if field == "npuMemSize":  # the catalog's knob is a memory fraction; MindIE sizes KV itself (-1)
            continue
        node[field] = value
    sched = cfg["BackendConfig"]["ScheduleConfig"]
    if sched["maxPrefillBatchSize"] > sched["maxBatchSize"]:
        sched["maxPrefillBatchSize"] = sched["maxBatchSize"]  # MindIE's range is [1, maxBatchSize]
    deploy = cfg["BackendConfig"]["ModelDeployConfig"]
    deploy["maxInputTokenLen"] = sched["maxPrefillTokens"]  # maxPrefillTokens must be >= maxInputTokenLen
    deploy["maxSeqLen"] = sched["maxPrefillTokens"] + MAX_OUTPUT
    return cfg


class MindIE(Adapter):
    name = "mindie"
    knob_key = "mindie"
    pinned = "MindIE 2.x (mindie_llm; config.json Version 1.0.0)"
    flush_path = None  # no flush route: a zero-cache run restarts the daemon

    def render(self, target: Target, station: Station, faults: tuple[str, ...] = (),
               expected_requests: int | None = None) -> Rendered:
        if target.pd:
            raise ValueError("hosts: MindIE PD needs MindIE MS (a Controller that assigns P/D roles from a global "
                             "rank table, a Coordinator in front); tuneloop renders single MindIE instances only")
        services: list[ServiceSpec] = []
        for role, i, host in instances(target):
            name = f"{role}-{i}"
            conf = f"{svc_dir(target, name, host.host)}/config.json"
            env = device_env(target, host, "ASCEND_RT_VISIBLE_DEVICES") | {"MIES_CONFIG_JSON_PATH": conf}
            text = json.dumps(mindie_config(target, station, role, host), indent=2, sort_keys=True)
            services.append(ServiceSpec(name=name, role=role, host=host.host, port=host.port,
                                        argv=("mindieservice_daemon",), env=env, files={"config.json": text},
                                        health_path="/health", cards=host.cards))
        url = f"http://{services[0].host}:{services[0].port}"
        return Rendered(services=tuple(services), endpoint=url,
                        metrics={s.role: f"http://{s.host}:{s.port}/metrics" for s in services}, engine="mindie")

    def version_probe(self, argv: tuple[str, ...], python: str) -> list[str] | None:
        return [python, "-c", PY_VERSION, "mindie_llm"]


ADAPTER = MindIE()
