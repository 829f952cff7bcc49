"""Fault injection for testing the loop: each fault reproduces one way a real run goes wrong."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

STATS_FAILURE_MARKER = "fault_stats_failure"


class SimLaunchError(RuntimeError):
    """The simulated engine failed to start (launch_failure)."""


class SimHealthError(RuntimeError):
    """The simulated engine started but never became healthy (never_healthy)."""


class Faults(BaseModel):
    model_config = ConfigDict(frozen=True)
    launch_failure: bool = False
    never_healthy: bool = False
    crash_at: float | None = Field(None, ge=0, le=1)  # fraction of formal requests sent before the crash
    truncate: float = Field(0.0, ge=0, le=1)  # fraction of formal outputs cut short (finish_reason stop)
    cache_miss: float = Field(0.0, ge=0, le=1)  # fraction of formal requests denied any prefix hit
    stats_failure: bool = False  # first summarize of the run dir fails (marker file)

    @classmethod
    def parse(cls, items: list[str] | None) -> "Faults":
        """Parse ["crash_at=0.5", "stats_failure", ...]; a bad item names itself and the reason."""
        flags = {"launch_failure", "never_healthy", "stats_failure"}
        fractions = {"crash_at", "truncate", "cache_miss"}
        values: dict[str, object] = {}
        for raw in items or []:
            name, _, val = raw.strip().partition("=")
            if name in flags:
                if val:
                    raise ValueError(f"fault {name}: takes no value, got {val!r}")
                values[name] = True
            elif name in fractions:
                try:
                    x = float(val)
                except ValueError:
                    raise ValueError(f"fault {name}: expected {name}=<fraction in [0,1]>, got {raw!r}") from None
                if not 0.0 <= x <= 1.0:
                    raise ValueError(f"fault {name}: fraction must be in [0, 1], got {x}")
                values[name] = x
            else:
                raise ValueError(f"fault {raw!r}: unknown; known: {sorted(flags | fractions)}")
        return cls.model_validate(values)

    def as_list(self) -> list[str]:
        out = [n for n in ("launch_failure", "never_healthy", "stats_failure") if getattr(self, n)]
        if self.crash_at is not None:
            out.append(f"crash_at={self.crash_at:g}")
        out += [f"{n}={getattr(self, n):g}" for n in ("truncate", "cache_miss") if getattr(self, n)]
        return out

    def check_launch(self) -> None:
        if self.launch_failure:
            raise SimLaunchError("simulated engine failed to launch (fault launch_failure)")
