"""The running service: settings, store, tokens, notifier, targets and the in-process workers.

Created once per process by `create_app` (api/app.py) or `tuneloop worker` (api/cli.py).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from api.auth import TokenTable
from api.settings import Settings
from api.webhooks import Notifier
from api.worker import Worker
from core.datafiles import use_data_dirs
from executor.targets import load_targets
from state.statefile import register_secrets, url_password
from state.workqueue import QueueStore

log = logging.getLogger("tuneloop.service")


@dataclass
class Service:
    settings: Settings
    store: QueueStore
    tokens: TokenTable
    notifier: Notifier
    targets: dict[str, Any]
    stop_event: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    base: Path = field(default_factory=Path.cwd)  # where relative paths of the settings (runs, reports) resolve
    session: Callable[..., Any] | None = None  # the loop's entry point for workers (None: agent.loop.session.run_session)
    nudge: threading.Event = field(default_factory=threading.Event)  # set by a person's action: workers claim now
    chatops: Any = None  # api.chatops.ChatApps (set by api.chatops.attach): Slack / Feishu clients, replay memory

    def wake(self, goal_id: str, who: str) -> None:
        """A person acted on the goal: mark it ready in the work queue and wake this process's idle workers at once
        (workers of other processes see it at their next poll)."""
        self.store.wake(goal_id, who)
        self.nudge.set()

    @classmethod
    def open(cls, settings: Settings) -> "Service":

        use_data_dirs(settings.data_dirs)
        if settings.db_url.startswith("sqlite:///"):
            Path(settings.db_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        store = QueueStore(settings.db_url)

        register_secrets(*(t.token for t in settings.tokens), *(w.url for w in settings.webhooks), settings.llm_api_key,
                         url_password(settings.db_url), *settings.chat_secrets)  # never in STATE.md, reasons, webhooks
        return cls(settings=settings, store=store, tokens=TokenTable(settings),
                   notifier=Notifier(settings.webhooks), targets=load_targets(settings.targets_file))

    @property
    def reports_dir(self) -> Path:
        return self.base / self.settings.reports_dir

    def start_workers(self, n: int | None = None, name: str | None = None) -> None:

        base = name or self.settings.worker_name or _default_name()
        count = self.settings.workers if n is None else n
        for i in range(count):
            w = Worker(self, f"{base}/{i}" if count > 1 else base)
            t = threading.Thread(target=w.run_forever, name=f"worker-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def close(self) -> None:
        self.stop_event.set()
        self.nudge.set()
        for t in self.threads:
            t.join(timeout=60)
        self.notifier.close()
        self.store.close()


def _default_name() -> str:

    return f"{socket.gethostname()}:{os.getpid()}"
