"""The README and docs/ checked against the code that produces what they state.

Documentation that states a figure drifts when the code changes; these tests tie the README's
and the docs' statements (the bench's inputs, the CLI's commands and options, the demo run's
output) to the code itself, keep the README a newcomer's page (short; the manual lives in docs/)
and keep every relative link between the pages pointing at a file and heading that exist."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
import typer.main

from ffai.bench import cases
from ffai.cli import app
from ffai.engines.smolvlm.bench.checkpoints import REFERENCE_DIR as SMOLVLM_FILES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")
CAPTION_DOC = (DOCS / "caption.md").read_text(encoding="utf-8")
BENCHMARKS_DOC = (DOCS / "benchmarks.md").read_text(encoding="utf-8")

README_MAX_LINES = 300


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _prose(markdown: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    without_fences = re.sub(r"(?ms)^```.*?^```[ \t]*$", "", markdown)
    return re.sub(r"`[^`\n]*`", "", without_fences)


def _code_blocks(markdown: str) -> list[str]:
    return re.findall(r"(?ms)^```[^\n]*\n(.*?)^```[ \t]*$", markdown)


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = unicodedata.normalize("NFC", heading.strip().lower())
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def _anchors(markdown: str) -> set[str]:
    anchors: set[str] = set()
    counts: dict[str, int] = {}
    fences = re.sub(r"(?ms)^```.*?^```[ \t]*$", "", markdown)
    for heading in re.findall(r"(?m)^#{1,6}[ \t]+(.+?)[ \t#]*$", fences):
        slug = _slug(heading)
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(markdown: str) -> list[str]:
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _prose(markdown))


def test_still_case_tile_count_matches_the_processor():
    """docs/benchmarks.md describes the bench's cases; the still's tiles are what the processor makes."""
    from ffai.engines.smolvlm.preprocess import ProcessorConfig, preprocess_images

    pattern = r"`still` \((\d+)×(\d+): (\d+)×(\d+) tiles \+ the global image = (\d+)\)"
    m = re.search(pattern, BENCHMARKS_DOC)
    assert m, "docs/benchmarks.md no longer states the still case's tiles in the checked form"
    width, height, cols, rows, total = map(int, m.groups())
    assert (width, height) == cases.STILL_SIZE
    processor = ProcessorConfig.from_dir(SMOLVLM_FILES)
    batch = preprocess_images([cases.synthetic_image(2, cases.STILL_SIZE)], processor, split=True)
    assert batch.grids == [(rows, cols)]
    assert batch.tiles.shape[0] == rows * cols + 1 == total


def _command(path: list[str]):
    """A command of the CLI by its path (typer's own click: its groups have ``commands``)."""
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


def _command_paths(command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The paths of the CLI's leaf commands: ("caption",), ("models", "pull"), ..."""
    subcommands = getattr(command, "commands", None)
    if subcommands:
        return [p for name, sub in subcommands.items() for p in _command_paths(sub, (*path, name))]
    return [path]


def test_every_caption_option_is_in_the_caption_reference():
    """Each option of `ffai caption` appears (one of its spellings, in backticks) in docs/caption.md."""
    missing = []
    for param in _command(["caption"]).params:
        spellings = [*param.opts, *param.secondary_opts]
        documented = (re.search(rf"`{re.escape(s)}[ `=/]", CAPTION_DOC) or f"`{s}`" in CAPTION_DOC for s in spellings)
        if not any(documented):
            missing.append("/".join(spellings))
    assert not missing, f"options of `ffai caption` docs/caption.md does not document: {missing}"


def test_every_command_has_an_example_in_the_readme():
    """Each command and subcommand of `ffai` is run in one of the README's code blocks."""
    code = "\n".join(_code_blocks(README))
    paths = _command_paths(typer.main.get_command(app))
    assert ("caption",) in paths
    missing = [
        " ".join(path)
        for path in paths
        if not re.search(rf"(?m)^(?:.*\|\s*)?ffai {re.escape(' '.join(path))}(?:\s|$)", code)
    ]
    assert not missing, f"commands with no example in the README: {missing}"


def test_every_track_format_is_named_in_the_readme_and_the_reference():
    from ffai.outputs.tracks import FORMATS

    for name, text in (("README.md", README), ("docs/caption.md", CAPTION_DOC)):
        missing = [fmt for fmt in FORMATS if f"`{fmt}`" not in text]
        assert not missing, f"{name} does not name the formats {missing}"


def test_readme_demo_track_is_the_demo_clips_scenes():
    """The README's demo.srt is the bundled clip's scenes, one 3 s cue each (the model's actual
    output on the clip is checked by tests/test_demo_model.py)."""
    from ffai.bench import demo_scenes

    assert "ffai caption -i examples/demo_clip.mp4 --fps 2 --window 6 -o demo.srt" in README
    block = next(b for b in _code_blocks(README) if "-->" in b)
    cue = r"(\d+)\n(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})\n(.+)"
    shown = []
    for m in re.finditer(cue, block):
        h1, m1, s1, ms1, h2, m2, s2, ms2 = map(int, m.groups()[1:9])
        start = (h1 * 3600 + m1 * 60 + s1) + ms1 / 1000
        end = (h2 * 3600 + m2 * 60 + s2) + ms2 / 1000
        shown.append((int(m.group(1)), start, end, m.group(10)))
    seconds = demo_scenes.CLIP_SECONDS_PER_SCENE
    expected = [
        (k + 1, k * seconds, (k + 1) * seconds, demo_scenes.caption(scene))
        for k, scene in enumerate(demo_scenes.CLIP_SCENES)
    ]
    assert shown == expected


def test_readme_fallback_warning_is_the_one_ffai_prints(tmp_path, monkeypatch):
    from ffai import models

    monkeypatch.delenv("FFAI_MODEL", raising=False)
    monkeypatch.setenv("FFAI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    name, note = models.default_model("smolvlm", "smolvlm2-256m-video-instruct")
    assert name == "smolvlm-demo" and note
    assert f"ffai: warning: {note}\n" in README


def test_readme_is_a_short_page():
    lines = README.count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the manual belongs in docs/"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / link.split("#")[0]).resolve() for link in _links(README) if "://" not in link}
    orphans = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not orphans, f"docs pages the README's Documentation list does not link: {orphans}"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_at_existing_files_and_headings(page: Path):
    text = page.read_text(encoding="utf-8")
    broken = []
    for link in _links(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto: ...
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        relative = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        if not path.exists():
            broken.append(f"{link}: no file {relative}")
            continue
        if anchor and path.suffix == ".md" and anchor not in _anchors(path.read_text(encoding="utf-8")):
            broken.append(f"{link}: no heading #{anchor} in {relative}")
    assert not broken, f"broken links in {page.relative_to(ROOT)}: {broken}"


ENTRY_POINT_GROUPS = {"ffai.engines"}  # named like modules in the docs, but not modules


def _all_text() -> str:
    return "\n".join(page.read_text(encoding="utf-8") for page in _pages())


def test_cited_repository_paths_exist():
    """Files and folders the README and docs cite in backticks (`ffai/media/`, `scripts/…`) exist."""
    cited = set(re.findall(r"`((?:ffai|examples|scripts|tests|docs|\.ci)/[\w./-]*)`", _all_text()))
    missing = sorted(path for path in cited if not (ROOT / path).exists())
    assert not missing, f"paths the docs cite that do not exist: {missing}"


def test_cited_python_names_resolve():
    """Dotted names the README and docs cite (`ffai.outputs.tracks.fold_line_breaks`) import and resolve."""
    import importlib

    missing = []
    for name in sorted(set(re.findall(r"`(ffai(?:_smolvlm)?\.[\w.]+)`", _all_text())) - ENTRY_POINT_GROUPS):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ImportError:
                continue
        try:
            for attribute in parts[i:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            missing.append(name)
    assert not missing, f"names the docs cite that the code does not have: {missing}"
