"""Target definitions: where experiments run (sim, local processes, an SSH-reached cluster).

A targets YAML lists hosts with roles (prefill / decode / router / load), cards per node, the
engine and launch template, the target-side run root and SSH options. Every string that ends up
in a command line is checked here, so bad input fails with the field name and the reason.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.datafiles import read_yaml
from core.cards import card
from core.errors import FieldError
from core.ledger import DRIFT_THRESHOLD

Role = Literal["prefill", "decode", "router", "load", "mixed"]
Engine = Literal["sim", "vllm", "vllm-ascend", "sglang", "mindie", "llamacpp"]
SAFE = re.compile(r"^[A-Za-z0-9_./:@+,=%~-]+$")  # no spaces, quotes, $, ;, |, &, <, >, `, (, ), *, ?


def check_safe(field: str, value: str) -> str:
    """Refuse a value that a shell would interpret; names the field and the offending characters."""
    if not value or not SAFE.match(value):
        bad = sorted({c for c in value if not re.match(r"[A-Za-z0-9_./:@+,=%~-]", c)}) or ["(empty)"]
        raise FieldError(field, f"{value!r} has characters not allowed here: {''.join(bad)!r}")
    return value


class Host(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    host: str
    roles: tuple[Role, ...]
    cards: int = Field(1, ge=0)
    port: int = Field(8000, ge=1, le=65535)  # the service port on this host
    devices: str | None = None  # e.g. "0,1,2,3" -> CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES
    ssh_port: int | None = Field(None, ge=1, le=65535)  # this host's sshd port (default: the target's ssh.port)
    run_root: str | None = None  # this host's run root (default: the target's run_root)

    @field_validator("host", "devices", "run_root")
    @classmethod
    def _safe(cls, v: str | None, info: Any) -> str | None:
        return None if v is None else check_safe(info.field_name, v)


class SshOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    user: str | None = None
    port: int = Field(22, ge=1, le=65535)
    known_hosts: str  # host-key verification is always on: a known_hosts file is required
    client_keys: tuple[str, ...] = ()
    keepalive_interval: float = Field(5.0, gt=0)
    keepalive_count_max: int = Field(3, ge=1)
    connect_timeout: float = Field(10.0, gt=0)
    reconnect_attempts: int = Field(5, ge=1, le=50)


class RoleTopology(BaseModel):
    """How one role's engine instances are shaped (docs/topologies.md): `instances` instances of TP x DP ranks
    each, `dp_local` DP ranks per host, so an instance spans dp / dp_local of the role's host entries (taken in
    order, each holding tp x dp_local cards); `ep` the expert-parallel size (1, or TP x DP: the engines shard
    experts over every rank of the instance; None: TP x DP where the station enables expert parallelism)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    instances: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    ep: int | None = Field(None, ge=1)
    dp_local: int | None = Field(None, ge=1)  # DP ranks per host (None: every rank on one host entry)

    @property
    def local(self) -> int:
        return self.dp_local or self.dp

    @property
    def hosts_each(self) -> int:
        return self.dp // self.local


# engines that render an instance spanning several host entries (executor/engines/topology.py)
TOPOLOGY_ENGINES = ("vllm", "vllm-ascend", "sglang")


class Relayout(BaseModel):
    """How this target changes its expert layout (e.g. vLLM-Ascend EPLB): detached steps run in order on
    the load host, then the engines restart with `load` appended to their argv. `{stats}` and `{layout}`
    in any argv item become files under the run root, keyed by the station; argv arrives byte-exact."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    collect: tuple[str, ...] = ()  # record expert load (e.g. a short recording run) -> {stats}
    fit: tuple[str, ...] = ()  # compute a static placement from {stats} -> {layout}
    load: tuple[str, ...] = ()  # engine arguments that load {layout} at start-up


class Target(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    kind: Literal["sim", "local", "ssh"]
    engine: Engine = "sim"
    template: str | None = None  # default: the engine's own template
    run_root: str = "/tmp/tuneloop-target"
    hosts: tuple[Host, ...] = ()
    ssh: SshOptions | None = None
    model: str | None = None  # model path or name for real engines
    profile: str = "dsv4-flash-910c-p8d8"  # simulator profile (sim engine)
    # sim target only: the profile the simulator runs instead of `profile` (a name or YAML path), a truth the goal does
    # not name: the goal's `sim_profile` (the planner's prior) rebinds `profile` and leaves this alone (bench
    # --perturb-truth; executor.runner.Executor.bind_sim_profile). None: the simulator runs `profile`.
    truth_profile: str | None = None
    # sim target only: the twin's prior where it is not `profile` (bench --prior derived: a prior derived from the
    # profile's deployment, as a real target's is, while the simulator runs the profile)
    twin_prior: str | None = None
    time_scale: float = Field(50.0, gt=0)  # sim serve: simulated seconds per real second
    tuneloop: tuple[str, ...] | None = None  # how to call tuneloop on the target (default: local python)
    image_digest: str | None = None  # the engine's container image digest: the source identity when given
    python: str = "python3"  # the target's python (runs the profile analyser and the health probe over ssh)
    engine_command: tuple[str, ...] | None = None  # how to call the engine binary (llama.cpp: default llama-server)
    pd_connector: str | None = None  # KV connector override (vLLM / vLLM-Ascend)
    # further keys of each PD instance's KV connector config, e.g. {kv_buffer_device: cpu} where the KV cache
    # lives in host memory (vLLM's CPU platform), or {kv_connector_extra_config: {kv_lease_duration: 120}} (one
    # level of nesting): merged into the rendered --kv-transfer-config, a nested table key by key
    pd_connector_config: dict[str, str | int | float | bool | dict[str, str | int | float | bool]] = {}
    router_command: tuple[str, ...] | None = None  # how to call the PD router / proxy (default: the engine's own)
    # how long the PD router waits for its engine instances to start (vllm-router's and sglang-router's
    # --worker-startup-timeout-secs, 600 s by default there): the executor's own health budget (ExecSettings
    # timeouts_s["health"], 1800 s), since a large MoE loads for longer than 10 minutes and the router then dies
    worker_start_s: int = Field(1800, ge=1)
    extra_args: dict[str, tuple[str, ...]] = {}  # per role, appended verbatim as argv
    relayout: Relayout | None = None  # expert-layout steps; without it a relayout is a plain restart
    # per serving role, its instances' shape (TP x DP x EP, DP ranks per host): an instance may span host entries.
    # Left out: one instance per host entry, sized by the station's parallel knobs (and out of dumps while empty)
    topology: dict[Literal["prefill", "decode", "mixed"], RoleTopology] = Field({}, exclude_if=lambda v: not v)
    env: dict[str, str] = {}
    profiler_seconds: float = Field(5.0, gt=0)
    calibrated_profile: str | None = None  # a simulator profile fitted to this target (`tuneloop sim calibrate`)
    # where there is none, the twin's prior is derived (simulator/derive.py) from the model's config, the card kind
    # (a kind of core/cards.yaml, or cpu: this machine, measured once) and the hosts' layout
    card: str | None = None
    model_config_json: str | None = None  # the model's config.json where `model` is not readable on this host
    drift_threshold: float = Field(DRIFT_THRESHOLD, gt=0)  # relative gap between its prediction and a measured run that flags

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9_.:-]+$", v):
            raise FieldError("name", f"{v!r} may only hold letters, digits and _ . : -")
        return v

    @field_validator("card")
    @classmethod
    def _card(cls, v: str | None) -> str | None:
        if v is None or v == "cpu":
            return v
        return card(v).name  # a kind the table does not know is refused here, not at the twin's first fit

    @field_validator("run_root", "model", "image_digest", "python", "calibrated_profile", "truth_profile",
                     "model_config_json", "twin_prior")
    @classmethod
    def _paths(cls, v: str | None, info: Any) -> str | None:
        return None if v is None else check_safe(info.field_name, v)

    @model_validator(mode="after")
    def _roles(self) -> "Target":
        if self.kind == "ssh" and self.ssh is None:
            raise FieldError("ssh", "an ssh target needs ssh options with a known_hosts file")
        if self.truth_profile is not None and self.kind != "sim":
            raise FieldError("truth_profile", "only a sim target simulates a truth of its own")
        if self.twin_prior is not None and self.kind != "sim":
            raise FieldError("twin_prior", "a real target's twin starts from its calibrated_profile or a derived prior")
        if self.kind != "sim":
            if not self.hosts:
                raise FieldError("hosts", "a local or ssh target needs at least one host")
            if not self.hosts_for("load"):
                raise FieldError("hosts", "no host has the role 'load' (where the load generator runs)")
            if self.engine not in ("sim", "llamacpp") and not self.model:
                raise FieldError("model", f"engine {self.engine!r} needs a model path")
        for k, v in self.env.items():
            check_safe(f"env.{k}", k)
        flat = [(k, v) for k, v in self.pd_connector_config.items() if not isinstance(v, dict)]
        flat += [(f"{k}.{k2}", v2) for k, v in self.pd_connector_config.items() if isinstance(v, dict)
                 for k2, v2 in v.items()]
        for k, v in flat:
            if not re.match(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)?$", k):
                raise FieldError(f"pd_connector_config.{k}", "a connector config key is lower-case letters, digits and _")
            if isinstance(v, str):
                check_safe(f"pd_connector_config.{k}", v)
        for h in self.hosts:  # one address is one machine: its ssh port and run root must agree
            same = [x for x in self.hosts if x.host == h.host]
            if len({(x.ssh_port, x.run_root) for x in same}) > 1:
                raise FieldError("hosts", f"{h.host!r} appears with different ssh_port / run_root")
        for role, shape in self.topology.items():
            self._check_topology(role, shape)
        return self

    def _check_topology(self, role: str, t: RoleTopology) -> None:
        """A role's shape against its host entries: refused naming the field and the reason."""
        field = f"topology.{role}"
        if self.engine not in TOPOLOGY_ENGINES:
            raise FieldError("topology", f"engine {self.engine!r} renders one instance per host entry; an instance "
                             f"spanning hosts is rendered for {', '.join(TOPOLOGY_ENGINES)}")
        if t.dp % t.local:
            raise FieldError(f"{field}.dp_local", f"{t.local} DP ranks per host do not divide DP {t.dp} (each host "
                             "of an instance holds the same number of ranks)")
        if t.ep not in (None, 1, t.tp * t.dp):
            raise FieldError(f"{field}.ep", f"{t.ep}: the engines shard experts over every rank of an instance, so "
                             f"EP is 1 or TP x DP = {t.tp * t.dp}")
        entries = self.hosts_for(role)
        want = t.instances * t.hosts_each
        if len(entries) != want:
            raise FieldError(f"{field}.instances", f"{t.instances} instance(s) of DP {t.dp} at {t.local} rank(s) per "
                             f"host take {want} host entries with the role {role!r}, and the target has "
                             f"{len(entries)}")
        cards = t.tp * t.local
        for h in entries:
            if h.cards != cards:
                raise FieldError(f"{field}.tp", f"TP {t.tp} x {t.local} DP rank(s) per host = {cards} cards, but "
                                 f"host entry {h.host}:{h.port} has {h.cards}")
            ids = [d for d in (h.devices or "").split(",") if d]
            if ids and len(ids) != cards:
                raise FieldError("hosts", f"{h.host}:{h.port} lists {len(ids)} devices for its {cards} cards")
        for i in range(t.instances):
            group = entries[i * t.hosts_each:(i + 1) * t.hosts_each]
            if len({h.host for h in group}) != len(group):
                raise FieldError(f"{field}.dp_local", f"instance {i} of {role} would take two host entries of one "
                                 f"machine ({', '.join(h.host for h in group)}): put its ranks on one entry")

    def topology_of(self, role: str) -> RoleTopology | None:
        return self.topology.get(role)  # type: ignore[call-overload]

    def host_entry(self, host: str | None) -> Host | None:
        """The host definition for an address (None: the load host, where loads and markers live)."""
        if host is None:
            load = self.hosts_for("load")
            return load[0] if load else None
        return next((h for h in self.hosts if h.host == host), None)

    def root_for(self, host: str | None) -> str:
        """The run root on one host (each host may have its own)."""
        h = self.host_entry(host)
        return (h.run_root if h and h.run_root else None) or self.run_root

    def hosts_for(self, role: str) -> list[Host]:
        return [h for h in self.hosts if role in h.roles]

    @property
    def simulated_profile(self) -> str:
        """The profile the simulator runs: the hidden truth where one is set, else `profile`."""
        return self.truth_profile or self.profile

    @property
    def cards(self) -> int:
        """Cards in use by the serving roles (P + D, or mixed)."""
        return sum(h.cards for h in self.hosts if set(h.roles) & {"prefill", "decode", "mixed"})

    @property
    def pd(self) -> bool:
        return bool(self.hosts_for("prefill")) and bool(self.hosts_for("decode"))


def builtin_sim(profile: str = "dsv4-flash-910c-p8d8", run_root: str | None = None) -> Target:
    """The embedded default: the simulator in virtual time, no file needed."""
    return Target(name="sim", kind="sim", engine="sim", profile=profile,
                  run_root=run_root or "/tmp/tuneloop-target")


class TargetsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    targets: list[Target]


def parse_targets(data: Any, source: str = "<targets>") -> dict[str, Target]:
    try:
        parsed = TargetsFile.model_validate(data)
    except ValidationError as e:
        lines = [f"  {'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise ValueError(f"invalid targets file {source}:\n" + "\n".join(lines)) from None
    out: dict[str, Target] = {"sim": builtin_sim()}
    for t in parsed.targets:
        out[t.name] = t
    return out


def load_targets(path: str | Path | None = None) -> dict[str, Target]:
    """Targets from a YAML file, plus the built-in `sim` target (which a file may override)."""
    if path is None:
        return {"sim": builtin_sim()}

    p = Path(path)
    return parse_targets(read_yaml(p, f"targets file {str(p)!r}"), str(p))
