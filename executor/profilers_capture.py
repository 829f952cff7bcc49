"""Profile capture on a real target: a short profiler window on each engine, analysed where the trace
was written (executor/profilers.py, copied to the host), so only a summary crosses the network."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from core.station import content_hash
from executor import profilers
from executor.engines import ADAPTERS
from executor.templates import Rendered


async def profile_window(transport: Any, rendered: Rendered | None, seconds: float, python: str = "python3") -> dict:
    """The engine adapter's profiler routes (vLLM/SGLang `/start_profile` .. `/stop_profile`); the trace stays on each service's host, where the
    analyser (executor/profilers.py, copied there) reduces it; only its summary JSON comes back."""

    svcs = [s for s in (rendered.services if rendered else ()) if s.profile_dir]
    routes = ADAPTERS[rendered.engine].profile_routes if rendered and rendered.engine in ADAPTERS else None
    if not svcs or routes is None:
        return {"summary": None, "error": "no service of this template writes a profiler trace"}
    start, stop = routes
    source = Path(profilers.__file__).read_text()
    name = f"profilers-{content_hash(source)[:12]}.py"
    since: dict[str, str] = {}
    for s in svcs:
        await transport.put_text(f"{transport.root_for(s.host)}/{name}", source, 0o755, host=s.host)
        res = await transport.run(["date", "+%s.%N"], host=s.host)  # the window starts on the target's clock
        since[s.name] = res.stdout.strip() or "0"
    started = {s.name: (await transport.http(s, "POST", start))[0] for s in svcs}
    await asyncio.sleep(seconds)  # the profiling window itself
    stopped = {s.name: (await transport.http(s, "POST", stop, timeout=600.0))[0] for s in svcs}
    parts, errors = [], {}
    for s in svcs:
        out = f"{s.profile_dir}.summary.json"
        script = f"{transport.root_for(s.host)}/{name}"
        res = await transport.run([python, script, s.profile_dir, out, since[s.name]], timeout=600.0, host=s.host)
        text = (await transport.run(["cat", out], host=s.host)).stdout
        try:
            summary = json.loads(text)
        except ValueError:
            summary = {"files": 0, "error": f"analyser rc={res.rc}: {res.stderr.strip()[-500:]}"}
        if summary.get("files"):
            parts.append(summary)
        else:
            errors[s.name] = summary.get("error")
    merged = profilers.merge(parts) if parts else None
    return {"summary": merged, "source": "torch profiler trace analysed on the target", "start_status": started,
            "stop_status": stopped, **({"errors": errors} if errors else {})}
