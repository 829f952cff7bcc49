"""MindIE Service (Ascend): one config.json per instance (MIES_CONFIG_JSON_PATH) + `mindieservice_daemon`.

The config carries every field MindIE marks required (必填) with its documented default unless a knob sets it
(REQUIRED below, from MindIE-LLM docs/zh/user_guide/user_manual/service_parameter_configuration.md, "配置参数说明
（服务化）"); 0.0.0.0 is refused unless allowAllZeroIpListening is true. MindIE refuses a config.json that group or
others may write or others may read, so it is written 0640. Three ports per instance: the business port (the
target's), the management port (+1, health routes) and the metrics port (+2, Prometheus `/metrics`, served only
with MIES_SERVICE_MONITOR_MODE=1). HTTPS is off (`httpsEnabled: false`): MindIE's TLS material (certificates,
keys, the encrypted key password under its install directory) is the operator's to provide and is not rendered.
PD (`inferMode: "dmi"`) is not rendered: there the model loads only after the MindIE MS Controller assigns each
instance its role from a global rank table, and requests enter through the MS Coordinator (ms_controller.json /
ms_coordinator.json, TLS material, a cluster deployment), none of which a target describes today; a PD MindIE
target is refused with that reason. No prefix-cache flush route: a zero-cache run restarts the daemon.
"""
from __future__ import annotations

import json
from typing import Any

from core.errors import FieldError
from core.station import Station
from executor.engines.base import (PY_VERSION, Adapter, Host, Rendered, ServiceSpec, device_env, instances, knob_flags,
                                   svc_dir)
from executor.targets import Target

# where each config.json section lives (a knob's key is "<section>.<field>"; ModelConfig is a list of one model)
MINDIE_SECTIONS: dict[str, tuple[str | int, ...]] = {
    "LogConfig": ("LogConfig",), "ServerConfig": ("ServerConfig",), "BackendConfig": ("BackendConfig",),
    "ModelDeployConfig": ("BackendConfig", "ModelDeployConfig"),
    "ScheduleConfig": ("BackendConfig", "ScheduleConfig"),
    "ModelConfig": ("BackendConfig", "ModelDeployConfig", "ModelConfig", 0)}
# The fields MindIE marks required (必填) per section: MindIE-LLM docs/zh/user_guide/user_manual/
# service_parameter_configuration.md ("配置参数说明（服务化）", also hiascend.com MindIE docs mindie_service0285).
# Fields required only when a feature is on (the tls* of httpsEnabled, the interNodeTls* of interNodeTLSEnabled)
# are left out: both are rendered off.
REQUIRED: dict[str, tuple[str, ...]] = {
    "LogConfig": ("dynamicLogLevelValidHours",),
    "ServerConfig": ("ipAddress", "port", "allowAllZeroIpListening", "maxLinkNum", "httpsEnabled", "inferMode",
                     "distDPServerEnabled"),
    "BackendConfig": ("backendName", "modelInstanceNumber", "npuDeviceIds", "tokenizerProcessNumber"),
    "ModelDeployConfig": ("maxSeqLen", "maxInputTokenLen"),
    "ModelConfig": ("modelName", "modelWeightPath", "worldSize", "cpuMemSize", "npuMemSize", "backendType"),
    "ScheduleConfig": ("templateType", "templateName", "cacheBlockSize", "maxPrefillBatchSize", "maxPrefillTokens",
                       "prefillTimeMsPerReq", "prefillPolicyType", "decodeTimeMsPerReq", "decodePolicyType",
                       "maxBatchSize", "maxIterTimes", "maxPreemptCount", "supportSelectBatch",
                       "maxQueueDelayMicroseconds"),
}
CONFIG_MODE = 0o640  # MindIE checks its config file's permission: at most 0640
# ServerConfig.maxLinkNum: required, documented default 1000, the most concurrent REST requests MindIE serves (MindIE
# Benchmark's MAX_LINK_NUM note: "当前最大支持1000"); a station's C above it is refused at rendering
MAX_LINK_NUM = 1000
# Readiness: MindIE's Triton-style `GET /v2/health/ready` on the management port (hiascend.com MindIE docs
# mindie_service0079 / mindie_llm0030 "健康检查"; MindIE Motor's own deployer probes readiness there too). The
# native `/health/timed-N` runs a probe inference that may take up to N seconds, longer than one health probe.
HEALTH_PATH = "/v2/health/ready"
# Prometheus: `GET /metrics` on metricsPort, only with MIES_SERVICE_MONITOR_MODE=1 set before the daemon starts
# (hiascend.com MindIE docs mindie_service0103 / mindie_llm0055 "服务管控指标查询接口（普罗格式）")
METRICS_PATH = "/metrics"
MAX_OUTPUT = 4096  # maxIterTimes: the longest output a request may ask for
SCHEDULE_DEFAULTS = {"templateType": "Standard", "templateName": "Standard_LLM", "cacheBlockSize": 128,
                     "maxPrefillBatchSize": 50, "maxPrefillTokens": 8192, "prefillTimeMsPerReq": 150,
                     "prefillPolicyType": 0, "decodeTimeMsPerReq": 50, "decodePolicyType": 0, "maxBatchSize": 200,
                     "maxIterTimes": MAX_OUTPUT, "maxPreemptCount": 0, "supportSelectBatch": False,
                     "maxQueueDelayMicroseconds": 5000}


def world_size(host: Host) -> int:
    """The instance's NPU count: its cards. `npuDeviceIds` and `worldSize` both come from it (a host that names its
    devices must name as many as its cards), so MindIE never runs a world of 8 on device list [[0]]."""
    cards = max(host.cards, 1)
    if host.devices is not None and len(host.devices.split(",")) != cards:
        raise FieldError("hosts", f"{host.host}:{host.port} names devices {host.devices!r} "
                         f"({len(host.devices.split(','))}) but has {cards} card(s); MindIE's npuDeviceIds and "
                         "worldSize must agree")
    return cards


def mindie_config(target: Target, station: Station, role: str, host: Host) -> dict[str, Any]:
    concurrency = station.knobs.get("concurrency")
    if concurrency is not None and int(concurrency) > MAX_LINK_NUM:
        raise FieldError("concurrency", f"{concurrency} clients exceed MindIE's ServerConfig.maxLinkNum, at most "
                         f"{MAX_LINK_NUM} concurrent requests (mindie_service0285); requests above it are refused")
    world = world_size(host)
    model: dict[str, Any] = {"modelInstanceType": "Standard", "modelName": str(target.model).rstrip("/").split("/")[-1],
                             "modelWeightPath": target.model, "worldSize": world, "cpuMemSize": 5,
                             "npuMemSize": -1, "backendType": "atb", "trustRemoteCode": False}
    cfg: dict[str, Any] = {
        "Version": "1.0.0",
        "LogConfig": {"dynamicLogLevel": "", "dynamicLogLevelValidHours": 2, "dynamicLogLevelValidTime": ""},
        # managementIpAddress is rendered: its documented default is 127.0.0.2 (else ipAddress, mindie_service0285),
        # unreachable from the executor's host; the management port serves the health probe
        "ServerConfig": {"ipAddress": "0.0.0.0", "managementIpAddress": "0.0.0.0", "allowAllZeroIpListening": True,
                         "port": host.port,
                         "managementPort": management_port(host), "metricsPort": metrics_port(host),
                         "maxLinkNum": MAX_LINK_NUM, "httpsEnabled": False, "inferMode": "standard",
                         "interCommTLSEnabled": False, "distDPServerEnabled": False},
        "BackendConfig": {"backendName": "mindieservice_llm_engine", "modelInstanceNumber": 1,
                          "npuDeviceIds": [list(range(world))],  # logical ids after ASCEND_RT_VISIBLE_DEVICES
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


def management_port(host: Host) -> int:
    """ServerConfig.managementPort: MindIE's health routes answer here, not on the business port."""
    return host.port + 1


def metrics_port(host: Host) -> int:
    """ServerConfig.metricsPort: MindIE's Prometheus `/metrics` answers here, not on the business port."""
    return host.port + 2


class MindIE(Adapter):
    name = "mindie"
    knob_key = "mindie"
    pinned = "MindIE 2.x (mindie_llm; config.json Version 1.0.0)"
    flush_path = None  # no flush route: a zero-cache run restarts the daemon
    # MindIE-LLM's Prometheus exporter (prometheus_metrics.cpp InitPrometheusMetrics; each with a model_name label)
    metrics = {
        "running": ("num_requests_running",),
        "waiting": ("num_requests_waiting",),
        "kv_usage": ("npu_cache_usage_perc",),  # NPU KV blocks in use over all, 0-1
        "requests": ("request_success_total",),
    }

    def render(self, target: Target, station: Station, faults: tuple[str, ...] = (),
               expected_requests: int | None = None) -> Rendered:
        if target.pd:
            raise FieldError("hosts", "MindIE PD needs MindIE MS (a Controller that assigns P/D roles from a global "
                             "rank table, a Coordinator in front); tuneloop renders single MindIE instances only")
        services: list[ServiceSpec] = []
        metrics: dict[str, str] = {}
        for role, i, host in instances(target):
            name = f"{role}-{i}"
            conf = f"{svc_dir(target, name, host.host)}/config.json"
            # the metrics port serves /metrics only with the monitor mode on: set last, the scrape depends on it
            env = device_env(target, host, "ASCEND_RT_VISIBLE_DEVICES") | {"MIES_CONFIG_JSON_PATH": conf,
                                                                          "MIES_SERVICE_MONITOR_MODE": "1"}
            text = json.dumps(mindie_config(target, station, role, host), indent=2, sort_keys=True)
            services.append(ServiceSpec(name=name, role=role, host=host.host, port=host.port,
                                        argv=("mindieservice_daemon",), env=env, files={"config.json": text},
                                        file_modes={"config.json": CONFIG_MODE}, health_path=HEALTH_PATH,
                                        health_port=management_port(host), cards=host.cards))
            metrics[name] = f"http://{host.host}:{metrics_port(host)}{METRICS_PATH}"
        url = f"http://{services[0].host}:{services[0].port}"
        return Rendered(services=tuple(services), endpoint=url, metrics=metrics, engine="mindie")

    def version_probe(self, argv: tuple[str, ...], python: str) -> list[str] | None:
        return [python, "-c", PY_VERSION, "mindie_llm"]


ADAPTER = MindIE()
