"""`tuneloop sim derive`: print the twin's prior derived for a target (or for a library profile's own deployment),
so a user can read it, correct it and hand it back as the target's `calibrated_profile`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def derive_cmd(
    target: Optional[str] = typer.Option(None, help="a target of --targets: derive its prior (model, card, hosts)"),
    targets: Optional[Path] = typer.Option(None, help="targets YAML file holding --target"),
    profile: Optional[str] = typer.Option(None, help="a profile (name or YAML path) with a `deployment`: derive "
                                                     "from its model and card, and compare with its coefficients"),
    out: Optional[Path] = typer.Option(None, help="write the derived profile here (YAML)"),
    json_out: bool = typer.Option(False, "--json", help="print the derivation as JSON"),
) -> None:
    """Derive a twin prior by roofline from the model's config, the card, the engine and the topology, and print
    every coefficient with its uncertainty and the arithmetic behind it."""
    import yaml

    from core import profiles
    from core.canonical import canon
    from core.errors import FieldError
    from executor.derived import derive_target
    from executor.targets import load_targets
    from executor.transports.sim import derive_for_profile, error_table

    if (target is None) == (profile is None):
        typer.echo("error: give either --target (with --targets) or --profile", err=True)
        raise typer.Exit(2)
    truth = None
    try:
        if profile is not None:
            truth = profiles.load(profile)
            d = derive_for_profile(truth)
        else:
            if targets is None:
                typer.echo("error: --target needs --targets FILE", err=True)
                raise typer.Exit(2)
            known = load_targets(targets)
            if target not in known:
                raise FieldError("target", f"{target!r} is not in {targets} (known: {', '.join(sorted(known))})")
            d = derive_target(known[target])
    except (FieldError, ValueError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    compared = error_table(d.profile, truth) if truth is not None else []
    if out is not None:
        out.write_text(yaml.safe_dump(canon(d.profile.model_dump()), sort_keys=False))
    if json_out:
        typer.echo(json.dumps({"origin": d.origin(), "card": d.card.model_dump(), "profile": canon(d.profile.model_dump()),
                               "rows": [r.__dict__ for r in d.rows],
                               "against": [{"coefficient": k, "derived": v, "profile": t, "ratio": r}
                                           for k, v, t, r in compared]}, indent=1, default=str))
        return
    typer.echo(f"prior {d.origin()}")
    typer.echo(f"card: {d.card.name} ({d.card.source})")
    typer.echo(f"topology: prefill {d.topology.prefill.instances} x {d.topology.prefill.cards_per_instance} cards "
               f"(dp {d.topology.prefill.dp}), decode {d.topology.decode.instances} x "
               f"{d.topology.decode.cards_per_instance} cards (dp {d.topology.decode.dp}, ep {d.topology.ep})"
               + (", mixed (one engine prefills and decodes)" if d.topology.mixed else
                  f", KV over {d.topology.transport}"))
    typer.echo(f"{'coefficient':34s} {'value':>11s} {'±factor':>8s}  how")
    for r in d.rows:
        typer.echo(f"{r.name:34s} {r.value:11.4g} {('x%.1f' % r.factor) if r.factor else '':>8s}  {r.how}")
    if compared:
        typer.echo(f"\nagainst {truth.name}'s own coefficients (derived / profile):")  # type: ignore[union-attr]
        for k, v, t, r in compared:
            typer.echo(f"{k:34s} {v:11.4g} {t:11.4g}  x{r:.2f}{'' if 0.5 <= r <= 2 else '  (outside x2)'}")
    if out is not None:
        typer.echo(f"\nwrote {out} (a target's calibrated_profile: the twin starts from it instead)")
