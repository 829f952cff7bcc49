"""docker-compose.yml wiring (Docker cannot run here): the services, the health-checked PostgreSQL,
required secrets as ${VAR:?}, and environment names the service's settings actually read."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from api.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def test_compose_services_healthchecks_and_required_secrets():
    text = (ROOT / "docker-compose.yml").read_text()
    doc = yaml.safe_load(text)
    svc = doc["services"]
    assert {"postgres", "api", "worker", "simtarget", "sshd"} <= set(svc)
    assert "pg_isready" in " ".join(svc["postgres"]["healthcheck"]["test"])
    for name in ("api", "worker"):
        assert svc[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    for secret in ("POSTGRES_PASSWORD", "TUNELOOP_ADMIN_TOKEN", "TUNELOOP_TOKENS", "SSH_TEST_PUBLIC_KEY"):
        assert re.search(r"\$\{" + secret + r":\?", text), f"{secret} must be required with ${{VAR:?}}"
    for s in svc.values():
        for k, v in (s.get("environment") or {}).items():
            if re.search(r"TOKEN|PASSWORD|KEY", k) and k != "PASSWORD_ACCESS":
                assert str(v).startswith("${"), f"{k} must come from the environment, not the file"


def test_compose_environment_is_what_settings_read():
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name in ("api", "worker"):
        env = {k: re.sub(r"\$\{([A-Z_]+):[?-][^}]*\}", lambda m: {"TUNELOOP_TOKENS": "bob:viewer:bob-token-123456",
                                                                   "TUNELOOP_WEBHOOK_FORMAT": "json"}.get(m.group(1), "x" * 16),
                         str(v)) for k, v in doc["services"][name]["environment"].items()}
        env = {k: v for k, v in env.items() if not (k == "TUNELOOP_WEBHOOK_URL" and v == "x" * 16)}
        s = Settings.from_env(env)
        assert s.db_url.startswith("postgresql+psycopg://tuneloop:") and s.db_url.endswith("@postgres:5432/tuneloop")
        assert {(t.name, t.role) for t in s.tokens} == {("bob", "viewer"), ("admin", "admin")}
        assert str(s.runs_root) == "/data/runs" and str(s.targets_file) == "/config/targets.yaml"
        assert str(s.reports_dir) == "/data/reports"
    assert "reports:/data/reports" in doc["services"]["api"]["volumes"]  # reports outlive the container
