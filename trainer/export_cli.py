"""`aerie export CHECKPOINT --to hf OUT`: a trainer checkpoint as a Hugging Face model directory.

Kept out of the CLI module so `aerie` itself stays torch-free: torch is imported only when the
command runs.
"""

from __future__ import annotations

from pathlib import Path

import typer

export_app = typer.Typer(add_completion=False)


@export_app.command("export")
def export(
    checkpoint: str = typer.Argument(..., help="Checkpoint URI: s3://…/step_00000500, file://… or a path."),
    out: Path = typer.Argument(..., help="Output directory (created)."),
    to: str = typer.Option("hf", "--to", help="Format: hf (Hugging Face GPTNeoXForCausalLM / LlamaForCausalLM)."),
    config: Path = typer.Option(..., "--config", help="The trainer config the checkpoint was trained with."),
    set_: list[str] = typer.Option([], "--set", help="Config overrides used in training (key=value)."),
    tokenizer: Path | None = typer.Option(None, help="tokenizer.json to ship (default: the run's own)."),
) -> None:
    """Write config.json, model.safetensors and the tokenizer of a checkpoint, loadable with
    transformers' `AutoModelForCausalLM.from_pretrained(OUT)`."""
    if to != "hf":
        raise typer.BadParameter(f"unknown format {to!r}; supported: hf", param_hint="--to")
    from aerie_checkpoint.manifest import verify
    from trainer.config import load_config
    from trainer.eval_sampler import load_weights, tokenizer_path
    from trainer.export import export_hf
    from trainer.models import build_model, get_preset

    if checkpoint.startswith("s3://") or "://" not in checkpoint:
        check = verify(checkpoint)
        if not check.good:
            typer.echo(f"warning: {checkpoint} is not a good checkpoint: {'; '.join(check.reasons)}", err=True)
    cfg = load_config(str(config), list(set_))
    model_cfg = get_preset(cfg.model.preset, **cfg.model.overrides)
    model = build_model(model_cfg)
    load_weights(model, checkpoint)
    tok = tokenizer or tokenizer_path(cfg)
    path = export_hf(model.state_dict(), model_cfg, out, tokenizer_path=tok if Path(tok).exists() else None)
    typer.echo(
        f"exported {checkpoint} -> {path} ({model_cfg.family}, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters)"
    )
