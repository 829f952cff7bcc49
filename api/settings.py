"""The service's one settings object. `Settings.from_env()` is the only place that reads the environment.

Tokens are secrets: they are held as SecretStr, compared in constant time, and never printed
(repr, logs, responses and STATE.md show only the principal's name and role).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from core.datafiles import read_yaml

Role = Literal["viewer", "approver", "admin"]
# settings of the chat apps read from TUNELOOP_<NAME UPPER-CASED>
CHAT_ENV = ("slack_signing_secret", "slack_bot_token", "slack_channel", "slack_api_url", "feishu_verification_token",
            "feishu_encrypt_key", "feishu_app_id", "feishu_app_secret", "feishu_chat_id", "feishu_domain")
ROLE_RANK: dict[str, int] = {"viewer": 0, "approver": 1, "admin": 2}
WebhookFormat = Literal["json", "slack", "feishu"]


class TokenEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(min_length=1, max_length=80, pattern=r"^[A-Za-z0-9_.@-]+$")
    role: Role
    token: SecretStr

    @field_validator("token")
    @classmethod
    def _long_enough(cls, v: SecretStr) -> SecretStr:
        if len(v.get_secret_value()) < 12:
            raise ValueError("a token needs at least 12 characters")
        return v


class Webhook(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    url: SecretStr  # Slack / Feishu incoming-webhook URLs are secrets themselves
    format: WebhookFormat = "json"
    secret: SecretStr | None = None  # signs every delivery (api/webhooks.py: X-Tuneloop-Signature)


ChatPlatform = Literal["slack", "feishu"]


class ChatUser(BaseModel):
    """A Slack or Feishu/Lark user and the tuneloop principal they act as (api/chatops: unknown users are refused)."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    platform: ChatPlatform
    user: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")  # Slack U…, Feishu ou_… / user id
    name: str = Field(min_length=1, max_length=80, pattern=r"^[A-Za-z0-9_.@-]+$")
    role: Role


def _api_origin(v: str, what: str) -> str:
    """An API base URL that carries a bot token or app secret: https, or http only to this machine (a test)."""
    u = urlsplit(v)
    local = u.scheme == "http" and (u.hostname or "") in ("127.0.0.1", "localhost", "::1")
    if not (u.scheme == "https" or local) or not u.netloc or "@" in u.netloc or u.query or u.fragment:
        raise ValueError(f"{what} must be an https URL (http only to localhost), without credentials or query")
    return v


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    db_url: str = "sqlite:///.tuneloop/tuneloop.db"
    runs_root: Path = Path(".tuneloop/runs")
    targets_file: Path | None = None
    tokens: tuple[TokenEntry, ...] = ()
    webhooks: tuple[Webhook, ...] = ()
    workers: int = Field(1, ge=0, le=16)  # in-process worker threads of `tuneloop serve`
    worker_targets: tuple[str, ...] = ()  # empty: any target
    worker_name: str | None = None
    claim_ttl_s: float = Field(30.0, gt=0)
    poll_s: float = Field(0.5, gt=0)
    loop_attempts: int = Field(3, ge=1, le=10)  # tries of a goal's loop when it raises a transient error
    retry_wait_s: float = Field(1.0, ge=0, le=60)  # first back-off between those tries (doubles, max 30 s)
    reports_root: Path | None = None  # None: <runs_root>/../reports
    llm_base_url: str | None = None
    llm_model: str = "tuneloop-planner"
    llm_api_key: SecretStr | None = None
    data_dirs: tuple[Path, ...] = ()  # more data directories (scenarios/, profiles/) a goal may name files in
    max_body_bytes: int = Field(1 << 20, ge=1024, le=1 << 30)  # request bodies beyond this get 413 unread
    read_cache_s: float = Field(1.0, ge=0, le=60)  # a cached GET answer's longest life (api/readcache.py); 0: off
    keepalive_s: float = Field(75.0, gt=0, le=3600)  # idle keep-alive connections: longer than clients keep theirs
    backlog: int = Field(2048, ge=64, le=65535)  # connections the kernel queues while the API is busy or restarting
    in_process: bool = False  # `tuneloop serve`: API and workers in one process (no supervisor)
    # chat apps (api/chatops, docs/chat-apps.md): interactive approvals in Slack and Feishu/Lark
    slack_signing_secret: SecretStr | None = None  # verifies every callback; without it Slack callbacks get 403
    slack_bot_token: SecretStr | None = None  # xoxb-…: posts cards (chat.postMessage), opens the reject modal
    slack_channel: str | None = Field(None, max_length=80, pattern=r"^[A-Za-z0-9_#-]+$")  # where cards go
    slack_api_url: str = "https://slack.com/api/"
    feishu_verification_token: SecretStr | None = None  # the token in every event / callback
    feishu_encrypt_key: SecretStr | None = None  # encrypted bodies and X-Lark-Signature; strongly advised
    feishu_app_id: str | None = Field(None, max_length=80, pattern=r"^[A-Za-z0-9_-]+$")
    feishu_app_secret: SecretStr | None = None
    feishu_chat_id: str | None = Field(None, max_length=80, pattern=r"^[A-Za-z0-9_-]+$")  # oc_…: where cards go
    feishu_domain: str = "https://open.feishu.cn"  # Lark (international): https://open.larksuite.com
    chat_users: tuple[ChatUser, ...] = ()

    @field_validator("slack_api_url")
    @classmethod
    def _slack_url(cls, v: str) -> str:
        return _api_origin(v if v.endswith("/") else v + "/", "slack_api_url")

    @field_validator("feishu_domain")
    @classmethod
    def _feishu_domain(cls, v: str) -> str:
        v = _api_origin(v.rstrip("/"), "feishu_domain")
        if urlsplit(v).path:
            raise ValueError("feishu_domain must be an origin such as https://open.feishu.cn (no path)")
        return v

    @field_validator("chat_users")
    @classmethod
    def _one_mapping_per_user(cls, v: tuple[ChatUser, ...]) -> tuple[ChatUser, ...]:
        keys = [(u.platform, u.user) for u in v]
        dup = sorted({f"{p}:{u}" for p, u in keys if keys.count((p, u)) > 1})
        if dup:
            raise ValueError(f"a chat user is mapped twice: {', '.join(dup)}")
        return v

    @field_validator("tokens")
    @classmethod
    def _unique(cls, v: tuple[TokenEntry, ...]) -> tuple[TokenEntry, ...]:
        secrets = [t.token.get_secret_value() for t in v]
        if len(set(secrets)) != len(secrets):
            raise ValueError("two principals share one token")
        return v

    @field_validator("data_dirs")
    @classmethod
    def _dirs_exist(cls, v: tuple[Path, ...]) -> tuple[Path, ...]:
        missing = [str(d) for d in v if not Path(d).is_dir()]
        if missing:
            raise ValueError(f"not a directory: {missing}")
        return v

    @property
    def secrets(self) -> list[str]:
        """Every secret value of these settings (the log filter masks each one, api/logfilter.py)."""
        out = [t.token.get_secret_value() for t in self.tokens] + [w.url.get_secret_value() for w in self.webhooks]
        out += [w.secret.get_secret_value() for w in self.webhooks if w.secret is not None]
        if self.llm_api_key is not None:
            out.append(self.llm_api_key.get_secret_value())
        out += [x.get_secret_value() for x in self.chat_secrets]
        return [x for x in out if x]

    @property
    def chat_secrets(self) -> list[SecretStr]:
        """The chat apps' secrets that are set (signing secret, bot token, verification token, keys)."""
        return [x for x in (self.slack_signing_secret, self.slack_bot_token, self.feishu_verification_token,
                            self.feishu_encrypt_key, self.feishu_app_secret) if x is not None]

    @property
    def reports_dir(self) -> Path:
        """Where `GET /goals/{id}/report` writes (one folder per goal): beside the runs, not the CWD."""
        return self.reports_root if self.reports_root is not None else self.runs_root.parent / "reports"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: object) -> "Settings":
        """TUNELOOP_DB, TUNELOOP_RUNS_ROOT, TUNELOOP_TARGETS, TUNELOOP_TOKENS ("name:role:token,..."),
        TUNELOOP_TOKENS_FILE (YAML list of {name, role, token}), TUNELOOP_ADMIN_TOKEN,
        TUNELOOP_WEBHOOK_URL + TUNELOOP_WEBHOOK_FORMAT, TUNELOOP_WORKERS, TUNELOOP_WORKER_TARGETS,
        TUNELOOP_WORKER_NAME, TUNELOOP_CLAIM_TTL_S, TUNELOOP_POLL_S, TUNELOOP_LOOP_ATTEMPTS,
        TUNELOOP_RETRY_WAIT_S, TUNELOOP_REPORTS_ROOT, TUNELOOP_LLM_BASE_URL/MODEL/API_KEY,
        TUNELOOP_DATA_DIRS (separated by ':'), TUNELOOP_MAX_BODY_BYTES, TUNELOOP_WEBHOOK_SECRET,
        TUNELOOP_READ_CACHE_S, TUNELOOP_KEEPALIVE_S, TUNELOOP_BACKLOG, TUNELOOP_IN_PROCESS; the chat apps:
        TUNELOOP_SLACK_SIGNING_SECRET/BOT_TOKEN/CHANNEL/API_URL, TUNELOOP_FEISHU_VERIFICATION_TOKEN/ENCRYPT_KEY/
        APP_ID/APP_SECRET/CHAT_ID/DOMAIN, TUNELOOP_CHAT_USERS ("platform:user:name:role,...") and
        TUNELOOP_CHAT_USERS_FILE (YAML or JSON list of {platform, user, name, role})."""
        e = os.environ if env is None else env
        data: dict[str, object] = {}
        simple = {"TUNELOOP_DB": "db_url", "TUNELOOP_RUNS_ROOT": "runs_root", "TUNELOOP_TARGETS": "targets_file",
                  "TUNELOOP_WORKERS": "workers", "TUNELOOP_WORKER_NAME": "worker_name",
                  "TUNELOOP_CLAIM_TTL_S": "claim_ttl_s", "TUNELOOP_POLL_S": "poll_s",
                  "TUNELOOP_LOOP_ATTEMPTS": "loop_attempts", "TUNELOOP_RETRY_WAIT_S": "retry_wait_s",
                  "TUNELOOP_REPORTS_ROOT": "reports_root",
                  "TUNELOOP_LLM_BASE_URL": "llm_base_url", "TUNELOOP_LLM_MODEL": "llm_model",
                  "TUNELOOP_LLM_API_KEY": "llm_api_key", "TUNELOOP_MAX_BODY_BYTES": "max_body_bytes",
                  "TUNELOOP_READ_CACHE_S": "read_cache_s", "TUNELOOP_KEEPALIVE_S": "keepalive_s",
                  "TUNELOOP_BACKLOG": "backlog", "TUNELOOP_IN_PROCESS": "in_process",
                  **{f"TUNELOOP_{k.upper()}": k for k in CHAT_ENV}}
        for var, key in simple.items():
            if e.get(var):
                data[key] = e[var]
        if e.get("TUNELOOP_DATA_DIRS"):
            data["data_dirs"] = tuple(d for d in e["TUNELOOP_DATA_DIRS"].split(os.pathsep) if d.strip())
        if e.get("TUNELOOP_WORKER_TARGETS"):
            data["worker_targets"] = tuple(t.strip() for t in e["TUNELOOP_WORKER_TARGETS"].split(",") if t.strip())
        tokens: list[dict[str, str]] = []
        if e.get("TUNELOOP_TOKENS_FILE"):
            tokens += read_yaml(Path(e["TUNELOOP_TOKENS_FILE"]), "TUNELOOP_TOKENS_FILE") or []
        for item in filter(None, (x.strip() for x in e.get("TUNELOOP_TOKENS", "").split(","))):
            name, _, rest = item.partition(":")
            role, _, token = rest.partition(":")
            tokens.append({"name": name, "role": role, "token": token})
        if e.get("TUNELOOP_ADMIN_TOKEN"):
            tokens.append({"name": "admin", "role": "admin", "token": e["TUNELOOP_ADMIN_TOKEN"]})
        if tokens:
            data["tokens"] = tokens
        users: list[dict[str, str]] = []
        if e.get("TUNELOOP_CHAT_USERS_FILE"):
            users += read_yaml(Path(e["TUNELOOP_CHAT_USERS_FILE"]), "TUNELOOP_CHAT_USERS_FILE") or []
        for item in filter(None, (x.strip() for x in e.get("TUNELOOP_CHAT_USERS", "").split(","))):
            platform, user, name, role = (item.split(":", 3) + ["", "", ""])[:4]
            users.append({"platform": platform, "user": user, "name": name, "role": role})
        if users:
            data["chat_users"] = users
        if e.get("TUNELOOP_WEBHOOK_URL"):
            data["webhooks"] = [{"url": u.strip(), "format": e.get("TUNELOOP_WEBHOOK_FORMAT", "json"),
                                 "secret": e.get("TUNELOOP_WEBHOOK_SECRET") or None}
                                for u in e["TUNELOOP_WEBHOOK_URL"].split(",") if u.strip()]
        return cls.model_validate(data | overrides)


def settings_error(e: ValidationError) -> str:
    """A refusal that names each field and reason, never the offending value (it may be a secret)."""
    return "invalid service settings:\n" + "\n".join(
        f"  {'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors(include_input=False))


def dumps_public(s: Settings) -> str:
    """Settings as JSON with every secret masked (for /health and logs)."""
    return json.dumps(s.model_dump(mode="json", exclude={"tokens", "webhooks", "llm_api_key", *CHAT_ENV, "chat_users"})
                      | {"principals": [f"{t.name}:{t.role}" for t in s.tokens],
                         "webhooks": [w.format for w in s.webhooks],
                         "chat_apps": [p for p, on in (("slack", s.slack_signing_secret), ("feishu",
                                       s.feishu_verification_token or s.feishu_encrypt_key)) if on],
                         "chat_users": [f"{u.platform}:{u.name}:{u.role}" for u in s.chat_users]}, default=str)
