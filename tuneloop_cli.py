"""The `tuneloop` command: one entry point, one sub-command group per concept."""
from __future__ import annotations

import typer

from simulator.cli import app as sim_app

app = typer.Typer(
    name="tuneloop",
    help="Closed-loop performance tuning of LLM inference deployments under a latency limit.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(sim_app, name="sim", help="The embedded simulated PD-disaggregated cluster.")


@app.command()
def demo() -> None:
    """Run the main job on the embedded default target (the simulator), 16K copy scenario."""
    from simulator.cli import run as sim_run

    sim_run(profile="dsv4-flash-910c-p8d8", scenario="copy16k-zero-cache", n=640, concurrency=128,
            request_rate="6", knob=["max_prefill_reqs=1"], seed=0, out=None, arrival="constant", burstiness=1.0,
            warmup=0, fault=[], json_out=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
