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


ServiceDep = Annotated[Service, Depends(get_service)]
StoreDep = Annotated[QueueStore, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
