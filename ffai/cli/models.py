"""``ffai models``: list, download and verify model checkpoints (``ffai.models``)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from ffai.cli.console import State
from ffai.cli.options import AsJson, ModelName
from ffai.errors import FfaiError, UsageError

models_app = typer.Typer(help="List, download and verify model checkpoints.", no_args_is_help=True)


def _human_size(n: int) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _pinning(files: list[dict]) -> str:
    """How many files the manifest pins by sha256, then how many of the others were verified against the hub."""
    rest = [f for f in files if f["pin"] != "sha256"]
    text = f"{len(files) - len(rest)}/{len(files)}"
    if rest:
        text += f", hub {sum(f['verified'] == 'hub' for f in rest)}/{len(rest)}"
    return text


@models_app.command("list")
def models_list(as_json: AsJson = False) -> None:
    """Known models: engine, licence, size, what the manifest pins and where each was found."""
    from ffai import models
    from ffai.models import verification

    rows = []
    for m in models.manifests():
        folder = models.find(m)
        verified = verification.verified_against(m, folder) if folder else {}
        files = [
            {"path": f.path, "size": f.size, "sha256": f.sha256, "sha256_prefix": f.sha256_prefix, "pin": f.pin}
            | {"verified": verified.get(f.path)}
            for f in m.files
        ]
        rows.append(
            {
                "name": m.name,
                "engine": m.engine,
                "license": m.license,
                "size": m.size,
                "size_known": m.size_known,
                "path": str(folder) if folder else None,
                "pinned": sum(f.pin == "sha256" for f in m.files),
                "hub_verified": [f["path"] for f in files if f["pin"] != "sha256" and f["verified"] == "hub"],
                "files": files,
            }
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    caption = (
        "pinned: files the manifest pins by sha256; hub: of the others, those verified against the hub's hash. "
        "Every model decodes greedily by default, even where its generation_config.json asks for sampling "
        "(Qwen3-VL's does): ffai samples only with --temperature and --seed"
    )
    table = Table(title="ffai models", caption=caption)
    for column in ("name", "engine", "licence", "size", "pinned", "found at"):
        # A name cut short cannot be typed back, nor a path copied: those fold, never end in "…".
        table.add_column(
            column,
            no_wrap=column in ("name", "engine", "size"),
            overflow="fold" if column == "found at" else "ellipsis",
            min_width=len("missing") if column == "found at" else None,  # never "missi/ng"
        )
    for r in rows:
        size = _human_size(r["size"]) + ("" if r["size_known"] else " +")
        table.add_row(r["name"], r["engine"], r["license"], size, _pinning(r["files"]), r["path"] or "missing")
    Console(highlight=False).print(table)


def _manifest(name: str | None):
    from ffai import models
    from ffai.engines import registry

    # No name: the default engine's default model (what `ffai caption` uses once it is here).
    name = name or registry.get_engine().info.default_model
    manifest = models.find_manifest(name)
    if manifest is None:
        known = ", ".join(m.name for m in models.manifests())
        raise UsageError(f"no model named {name!r} (known: {known})")
    return manifest


@models_app.command("pull")
def models_pull(
    name: Annotated[
        Optional[str], typer.Argument(help="Model name (see `ffai models list`; default: the default model).")
    ] = None,
) -> None:
    """Download a model into the Hugging Face cache, resuming, each file checked against its pinned sha256 or, where
    the manifest pins none, the hash the hub announces."""
    from rich.progress import BarColumn, DownloadColumn, TextColumn, TransferSpeedColumn
    from rich.progress import Progress as RichProgress

    from ffai.models import hub

    manifest = _manifest(name)
    if not manifest.hf_repo:
        raise UsageError(f"{manifest.name} ships with ffai; there is nothing to download")
    bar = RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=Console(stderr=True),
        disable=not sys.stderr.isatty() or State.quiet,
    )
    tasks: dict[str, int] = {}

    def progress(path: str, done: int, total: int) -> None:
        if path not in tasks:
            tasks[path] = bar.add_task(path, total=total)
        bar.update(tasks[path], completed=done)

    with bar:
        folder = hub.pull(manifest, progress=progress)
    typer.echo(str(folder))


@models_app.command("verify")
def models_verify(name: ModelName) -> None:
    """Re-hash a model's files on disk (against the manifest, or the hub's recorded hash) and record the result."""
    from ffai.models import hub

    results = hub.verify(_manifest(name))
    for r in results:
        typer.echo(f"{r.status:16} {r.against or '-':9} {r.path}")
    bad = [r.path for r in results if r.status != "ok"]
    if bad:
        raise FfaiError(f"{name}: {len(bad)} of {len(results)} files failed verification")
