"""Request dependencies as `Annotated` aliases: the service, its store, its settings."""
from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.service import Service
from api.settings import Settings
from state.workqueue import QueueStore


def get_service(request: Request) -> Service:
    return request.app.state.service


def get_store(request: Request) -> QueueStore:
    return request.app.state.service.store


def get_settings(request: Request) -> Settings:
    return request.app.state.service.settings


def get_via(request: Request) -> str:
    """Where a REST decision or instruction came from, for the record: "dashboard" when the dashboard says so
    (its `X-Tuneloop-Client` header; any other value is plain "api"), else "api". A label from a fixed list."""
    return "dashboard" if request.headers.get("x-tuneloop-client", "").strip().lower() == "dashboard" else "api"


ServiceDep = Annotated[Service, Depends(get_service)]
ViaDep = Annotated[str, Depends(get_via)]
StoreDep = Annotated[QueueStore, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
