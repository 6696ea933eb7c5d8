"""``ffai engines``: the engines that can run, and which kernels each runs here in each dtype."""

from __future__ import annotations

import json
from dataclasses import asdict

import typer
from rich.console import Console
from rich.table import Table

from ffai.cli.options import AsJson
from ffai.kit import host


def engines(as_json: AsJson = False) -> None:
    """List the engines that can run, by name, and which kernels each runs here in each dtype."""
    from ffai.engines import registry

    infos = registry.engine_infos()
    cpu = host.cpu_info()
    # Which dtypes run at least as fast as float32 is the CPU's doing (ffai.kit.host), the same for
    # every engine; float32 is the exact one. Which kernels run them is each engine's own report.
    fast, throughput = list(cpu.fast_dtypes()), cpu.throughput_dtype()
    kernels = {}
    for i in infos:
        report = getattr(registry.get_engine(i.name), "kernels", None)
        kernels[i.name] = {"throughput_dtype": throughput, "dtypes": report(cpu.flags)} if report is not None else None
    if as_json:
        rows = [{**asdict(i), "fast_dtypes": fast, "kernels": kernels[i.name]} for i in infos]
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    table = Table(title="ffai engines")
    # Names and states in the table, one line each; the descriptions beneath it, wrapped to the
    # terminal (in a column they would be one word wide on 80 columns).
    for column in ("name", "task", "status", "default model"):
        table.add_column(column, no_wrap=True)
    for i in infos:
        table.add_row(i.name, i.task, i.status, i.default_model)
    console = Console(highlight=False)
    console.print(table)
    for i in infos:
        console.print(f"{i.name}: {i.description}", markup=False)
    console.print(f"CPU: {cpu.describe()}; fast dtypes here: {', '.join(fast)}", markup=False)
    for name, report in kernels.items():
        if report is None:
            continue
        console.print(
            f"{name} on this CPU: float32 for exact output (archives, evaluation); "
            f"--dtype {report['throughput_dtype']} for throughput",
            markup=False,
        )
        for dtype, groups in report["dtypes"].items():
            for g in groups:
                console.print(f"  {dtype:<8}  {g['layers']}: {g['kernel']} ({g['why']})", markup=False)
