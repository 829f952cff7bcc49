"""`tuneloop serve` (API + dashboard + in-process workers) and `tuneloop worker` (extra workers)."""
from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Optional

import typer
from pydantic import ValidationError

from api.settings import Settings, settings_error


def _settings(**overrides: Any) -> Settings:
    try:
        return Settings.from_env(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as e:
        typer.echo(settings_error(e), err=True)
        raise typer.Exit(2) from None
    except ValueError as e:  # a tokens file that cannot be read (named, never its content)
        typer.echo(f"invalid service settings: {e}", err=True)
        raise typer.Exit(2) from None


def serve(host: str = typer.Option("127.0.0.1", "--host"), port: int = typer.Option(8080, "--port"),
          db: Optional[str] = typer.Option(None, "--db", help="store URL (env TUNELOOP_DB; default SQLite)"),
          targets: Optional[Path] = typer.Option(None, "--targets", help="targets YAML (env TUNELOOP_TARGETS)"),
          workers: Optional[int] = typer.Option(None, "--workers", help="worker threads of the worker process (env "
                                                "TUNELOOP_WORKERS; 1); 0: the API only"),
          in_process: Optional[bool] = typer.Option(None, "--in-process/--separate",
                                                    help="API and workers in one process, no supervisor (env "
                                                         "TUNELOOP_IN_PROCESS; default: separate processes)"),
          data_dir: list[Path] = typer.Option([], "--data-dir", exists=True, file_okay=False,
                                              help="a data directory (scenarios/, profiles/) whose files goals may "
                                                   "name, repeatable (env TUNELOOP_DATA_DIRS); a scenario there may "
                                                   "replay a dataset or trace beside it (examples/traffic)"),
          ) -> None:
    """Serve the REST API, the dashboard and the worker loop (SQLite + simulator target by default).

    Two processes under this one, which supervises them: the API (uvicorn on the socket this process holds) and
    the worker (`tuneloop worker`), so the loop's CPU never holds a request up and either one killed is started
    again while the other goes on. GET answers are cached until the store changes (TUNELOOP_READ_CACHE_S, 1 s at
    most); idle keep-alive connections are kept TUNELOOP_KEEPALIVE_S (75 s); the listen backlog is
    TUNELOOP_BACKLOG (2048).

    Every goal plans with its twin (on by default; TUNELOOP_TWIN=off turns it off)."""
    import uvicorn

    from api.app import create_app
    from api.logfilter import install, uvicorn_log_config
    from api.supervisor import server_options, supervise

    settings = _settings(db_url=db, targets_file=targets, workers=workers, in_process=in_process)
    if data_dir:
        settings = settings.model_copy(update={"data_dirs": settings.data_dirs + tuple(data_dir)})
    if not settings.tokens:
        typer.echo("warning: no API tokens configured (TUNELOOP_TOKENS / TUNELOOP_ADMIN_TOKEN): every call "
                   "except /health and /metrics will answer 401", err=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    install(settings.secrets)
    if not settings.in_process:
        supervise(settings, host, port)
        return
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info",
                log_config=uvicorn_log_config(settings.secrets), **server_options(settings))


def worker(db: Optional[str] = typer.Option(None, "--db", help="store URL, normally PostgreSQL (env TUNELOOP_DB)"),
           targets: Optional[Path] = typer.Option(None, "--targets", help="targets YAML (env TUNELOOP_TARGETS)"),
           target: list[str] = typer.Option([], "--target", help="only claim goals on these targets (repeatable)"),
           name: Optional[str] = typer.Option(None, "--name", help="worker name (env TUNELOOP_WORKER_NAME)"),
           count: int = typer.Option(1, "--count", min=1, max=16, help="worker threads in this process"),
           ) -> None:
    """Claim goals from the shared store and run their loops (one target never runs two experiments at once).

    Every goal plans with its twin (on by default; TUNELOOP_TWIN=off turns it off)."""
    from api.service import Service

    settings = _settings(db_url=db, targets_file=targets, worker_targets=tuple(target) or None, worker_name=name)
    if settings.db_url.startswith("sqlite") and not os.environ.get("TUNELOOP_SUPERVISED"):
        typer.echo("note: several worker processes should share PostgreSQL; SQLite works on one host only", err=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from api.logfilter import install

    install(settings.secrets)
    svc = Service.open(settings)
    from api.chatops import attach

    attach(svc)  # Slack / Feishu cards where the loop asks (docs/chat-apps.md)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    svc.start_workers(count)
    typer.echo(f"worker {settings.worker_name or 'default'} x{count}: claiming goals"
               + (f" on {', '.join(settings.worker_targets)}" if settings.worker_targets else ""), err=True)
    done.wait()
    svc.close()
