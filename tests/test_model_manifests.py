"""The model manifests (``models/*.toml``) against what is known of each hub repository.

``../shared/reference/<name>/`` (beside the checkout, where it exists) holds byte-exact copies of
each repository's small files and a ``SOURCES.md`` with the size and sha256 of every file known,
the weights included, and the revision: every file there, and every size and sha256 its tables
give, must be what the manifest pins, and no file with a known sha256 may be left unpinned.
Where that folder is missing (a plain clone), those tests skip and the checks below that need
nothing but the repository still run.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from ffai import models
from ffai.engines import registry
from ffai.models import verification

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = next((p for p in (ROOT.parent / "shared" / "reference", ROOT / "shared" / "reference") if p.is_dir()), None)
HUB_MODELS = sorted(m.name for m in models.manifests() if m.hf_repo)

# "| `file` | bytes | `sha256` |" table rows (bytes with or without thousands' commas, cells plain
# or bold), "file  sha256 <hex>  size <n>" and LFS pointer lines, "**`file`**: expected **<n>
# bytes**, sha256 `<hex>`" for a missing file, and "the `file` LFS pointer ... `oid sha256:<hex>`,
# `size <n>`". The revision: "HF revision: **`<hex>`**", or "checkpoint `repo`, revision `<hex>`".
_ROW = re.compile(r"^\| `([^`]+)` \| (?:\*\*)?([\d,]+)(?:\*\*)? \| (?:\*\*)?`([0-9a-f]{64})`(?:\*\*)? \|", re.M)
_WEIGHTS = re.compile(r"^(\S+)\s+(?:oid )?sha256[ :]([0-9a-f]{64})\s+size (\d+)", re.M)
_MISSING = re.compile(r"\*\*`([^`]+)`\*\*: expected \*\*(\d+) bytes\*\*, sha256\s+`([0-9a-f]{64})`")
_POINTER = re.compile(r"the `([^`]+)` LFS pointer[^`]*`oid sha256:([0-9a-f]{64})`, `size (\d+)`")
_REVISION = re.compile(r"HF revision[^`]*\*\*`([0-9a-f]{40})`\*\*|, revision\s+`([0-9a-f]{40})`")


def _reference(name: str) -> Path:
    if REFERENCE is None or not (REFERENCE / name).is_dir():
        pytest.skip(f"no ../shared/reference/{name} beside this checkout")
    return REFERENCE / name


def _sources(folder: Path) -> dict[str, tuple[int, str]]:
    """Every (size, sha256) SOURCES.md states, by file name."""
    text = (folder / "SOURCES.md").read_text(encoding="utf-8")
    known = {path: (int(size.replace(",", "")), sha) for path, size, sha in _ROW.findall(text)}
    known |= {path: (int(size), sha) for path, sha, size in _WEIGHTS.findall(text)}
    known |= {path: (int(size), sha) for path, size, sha in _MISSING.findall(text)}
    known |= {path: (int(size), sha) for path, sha, size in _POINTER.findall(text)}
    return known


@pytest.mark.parametrize("name", HUB_MODELS)
def test_reference_files_are_what_the_manifest_pins(name):
    folder = _reference(name)
    manifest = models.find_manifest(name)
    pins = {f.path: f for f in manifest.files}
    copies = sorted(p.name for p in folder.iterdir() if p.name != "SOURCES.md")
    assert copies, folder
    for path in copies:
        data = (folder / path).read_bytes()
        assert path in pins, f"{name}: the reference has {path}, the manifest does not"
        assert (pins[path].size, pins[path].sha256) == (len(data), hashlib.sha256(data).hexdigest()), path


@pytest.mark.parametrize("name", HUB_MODELS)
def test_sources_sizes_hashes_and_revision_are_the_manifests(name):
    folder = _reference(name)
    manifest = models.find_manifest(name)
    text = (folder / "SOURCES.md").read_text(encoding="utf-8")
    pins = {f.path: f for f in manifest.files}
    known = _sources(folder)
    assert known, f"{name}: no size or sha256 read from SOURCES.md"
    for path, (size, sha) in known.items():
        if path in ("README.md", ".gitattributes"):  # the model card and git's settings: not files a model needs
            continue
        assert path in pins, f"{name}: SOURCES.md knows {path}, the manifest does not list it"
        assert (pins[path].size, pins[path].sha256) == (size, sha), f"{name}: {path}"
    # A file SOURCES.md gives no full sha256 for is left to the hub's hash, with what is known.
    for f in manifest.files:
        if f.path not in known:
            assert f.sha256 is None, f"{name}: {f.path} is pinned, but SOURCES.md does not give its sha256"
            if f.sha256_prefix:
                assert f"`{f.sha256_prefix}" in text and f"{f.size} bytes" in text, f.path
    revision = _REVISION.search(text)
    assert manifest.revision == ((revision[1] or revision[2]) if revision else "main")


_BLOB = re.compile(r"^\| `([^`]+)` \| \d+ \| `[0-9a-f]{64}` \| `([0-9a-f]{40})` \|", re.M)


@pytest.mark.parametrize("name", HUB_MODELS)
def test_the_hubs_etag_of_a_small_file_is_the_git_blob_sha1_pull_checks(name):
    """SOURCES.md gives each small file's git blob id, which is the hub's ETag for it (an
    HF-derived lock file recorded those ETags): pull checks a download against it this way."""
    folder = _reference(name)
    blobs = _BLOB.findall((folder / "SOURCES.md").read_text(encoding="utf-8"))
    assert blobs
    for path, blob in blobs:
        assert verification.digests(folder / path).matches(blob), path
        assert verification.hub_hash(f'W/"{blob}"') == blob


def test_the_reference_covers_every_hub_manifest():
    if REFERENCE is None:
        pytest.skip("no ../shared/reference beside this checkout")
    assert [n for n in HUB_MODELS if not (REFERENCE / n).is_dir()] == []


# The real models' small files each engine's bench ships (ffai/engines/*/bench/files/<model>).
SHIPPED = {
    p.name: p for p in sorted((ROOT / "ffai" / "engines").glob("*/bench/files/*")) if models.find_manifest(p.name)
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_shipped_reference_files_are_what_the_manifest_pins(name):
    """The bench's copies of the real models' files ship with the package: checked everywhere, CI included."""
    folder = SHIPPED[name]
    pins = {f.path: f for f in models.find_manifest(name).files}
    copies = sorted(p.name for p in folder.iterdir() if p.name != "SOURCES.md")
    assert copies
    for path in copies:
        data = (folder / path).read_bytes()
        assert path in pins, f"{name}: the bench's files have {path}, the manifest does not"
        assert (pins[path].size, pins[path].sha256) == (len(data), hashlib.sha256(data).hexdigest()), path


@pytest.mark.parametrize("manifest", models.manifests(), ids=lambda m: m.name)
def test_manifest_is_well_formed(manifest):
    assert (models.bundled_dir() / f"{manifest.name}.toml").is_file()
    paths = [f.path for f in manifest.files]
    assert len(paths) == len(set(paths)) and "config.json" in paths
    if manifest.hf_repo:
        # A commit where one is known, so a moved branch never changes what is pinned.
        assert re.fullmatch(r"[0-9a-f]{40}", manifest.revision) or manifest.revision == "main"
    for name in manifest.fallbacks:
        stand_in = models.find_manifest(name)
        assert stand_in is not None and stand_in.engine == manifest.engine and stand_in.hf_repo, name


def test_seven_hub_models_and_the_default_has_a_manifest():
    assert HUB_MODELS == [
        "qwen3-vl-2b-instruct",
        "qwen3-vl-4b-instruct",
        "smolvlm-256m-instruct",
        "smolvlm-500m-instruct",
        "smolvlm2-2.2b-instruct",
        "smolvlm2-256m-video-instruct",
        "smolvlm2-500m-video-instruct",
    ]
    default = models.find_manifest(registry.get_engine().info.default_model)
    assert default.name == "smolvlm2-256m-video-instruct" and default.fallbacks == ("smolvlm-256m-instruct",)


@pytest.mark.parametrize(
    "entry, message",
    [
        ('path = "a"\nsha265 = "00"', "unknown key 'sha265'"),
        ('path = "a"\nsha256 = "ABC"', "is not 64 lowercase hex digits"),
        ('path = "a"\nsha256_prefix = "dcc8"', "is not 8 to 63 lowercase hex digits"),
        ('path = "a"\nsize = -1', "is not a byte count"),
    ],
)
def test_a_malformed_manifest_is_refused_in_one_line(tmp_path, entry, message):
    toml = tmp_path / "bad.toml"
    head = 'name = "bad"\nengine = "smolvlm"\nhf_repo = "o/n"\nrevision = "main"\nlicense = "x"\ndescription = "x"\n'
    toml.write_text(head + "\n[[files]]\n" + entry + "\n", encoding="utf-8")
    with pytest.raises(models.ModelError, match=re.escape(message)) as info:
        models.Manifest.from_toml(toml)
    assert "\n" not in str(info.value) and str(toml) in str(info.value)
