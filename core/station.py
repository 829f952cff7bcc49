"""A station: one complete, reproducible configuration, frozen by a content hash.

The hash covers the server knobs, load knobs, engine, data version and source identity, so
"go back to the best station" means re-deploying exactly these bytes. The cost class of the
difference between two stations decides whether deploy may reuse the warm service.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from core.canonical import canon, digest
from core.knobs import COST_ORDER, Catalog, catalog, drafts_nothing

LOAD_KNOBS = ("concurrency", "request_rate")


class Station(BaseModel):
    model_config = ConfigDict(frozen=True)
    engine: str
    knobs: dict[str, Any]  # validated, complete (catalog defaults filled in for the engine)
    scenario: str
    data_version: str
    source_identity: str
    target: str

    @property
    def server_knobs(self) -> dict[str, Any]:
        return {k: v for k, v in self.knobs.items() if k not in LOAD_KNOBS}

    @property
    def hash(self) -> str:
        return content_hash(self.model_dump(mode="python"))

    @property
    def server_hash(self) -> str:
        """Identity of the running service: what a restart would change (load knobs excluded)."""
        return content_hash({"engine": self.engine, "knobs": self.server_knobs,
                             "source": self.source_identity, "target": self.target})


def content_hash(obj: Any) -> str:
    """The station hash: the digest of the frozen station's canonical JSON (core/canonical.py)."""
    return digest(obj)


def full_knobs(knobs: dict[str, Any], engine: str, cat: Catalog | None = None) -> dict[str, Any]:
    """Validate against the catalog for this engine and fill in its defaults (raises KnobError): a draft method with
    a draft width of 0 too (core.knobs.drafts_nothing), which vLLM refuses at start."""
    cat = cat or catalog()
    given = cat.validate(dict(knobs), engine=engine)
    full = cat.defaults(engine) | given
    why = drafts_nothing(full, cat)
    if why is not None:
        raise why
    return full


def change_cost(old: dict[str, Any] | None, new: dict[str, Any], cat: Catalog | None = None) -> str | None:
    """The largest cost class among changed knobs; None when nothing changed; 'restart' from nothing."""
    cat = cat or catalog()
    if old is None:
        return "restart"
    worst: str | None = None
    for name in sorted(set(old) | set(new)):
        if canon(old.get(name)) == canon(new.get(name)):
            continue
        cls = cat.get(name).cost_class if name in cat else "restart"
        if worst is None or COST_ORDER[cls] > COST_ORDER[worst]:
            worst = cls
    return worst


def needs_restart(cost: str | None) -> bool:
    return cost is not None and cost != "hot"
