"""The contact sheet (``-f html``): one self-contained page that shows, for every cue, small
pictures of the frames the model saw and what it said.

What is here: the page's markup. The pictures are the cues' thumbnails (``ffai.outputs.thumbnails``
makes them where a window's frames are; they come here on the cues). ``ffai.outputs.tracks.HtmlFormat``
writes the page like the other tracks (rebuilt whole and renamed into place after every cue, as json
is); ``ffai.outputs.sheet_build`` makes it again from a JSON track and its source, without a model.

The page has no external asset and reaches no network: thumbnails are JPEG data URIs, the
style and the script are inline and named by their hashes in a Content-Security-Policy, so no
other script (an injected one included) would run even if escaping failed. Every text from
outside (captions, paths, prompts, model names) goes through ``html.escape``. A local video
source is referred to by a path relative to the page; without it the page still reads.

Size: each cue adds its thumbnails (bounded per cue, ``ffai.outputs.thumbnails``) and its text:
a 10-minute clip at ``--fps 2 --window 8`` (150 cues) stays near 4 MB whatever it shows.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import urllib.parse
from pathlib import Path
from typing import Sequence

from ffai.outputs.cues import Cue, Thumbnail, TrackHeader, format_timestamp

_STYLE = """
:root { color-scheme: light dark; --bg: #fafafa; --fg: #1d1d1f; --muted: #5f6368; --card: #fff;
  --line: #d8d8dc; --accent: #0b62d6; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #141416; --fg: #ececf0; --muted: #a0a4ab; --card: #1f1f23; --line: #3a3a40; --accent: #6ea8ff; }
}
* { box-sizing: border-box; }
[hidden] { display: none !important; }
body { margin: 0; padding: 1rem 1.25rem 3rem; background: var(--bg); color: var(--fg);
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
h1 { font-size: 1.35rem; margin: 0 0 .5rem; overflow-wrap: anywhere; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .1rem 1rem; margin: 0 0 1rem;
  font-size: .9rem; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; overflow-wrap: anywhere; white-space: pre-wrap; }
#player { position: sticky; top: 0; z-index: 1; background: var(--bg); padding: .5rem 0; }
#player video { display: block; width: min(100%, 640px); height: auto; max-height: 40vh; background: #000; }
.tools { display: flex; gap: 1rem; align-items: center; margin: .5rem 0 1rem; }
.tools input { font: inherit; padding: .3rem .5rem; min-width: 16rem; color: var(--fg); background: var(--card);
  border: 1px solid var(--line); border-radius: 4px; }
.tools output { color: var(--muted); font-size: .9rem; }
main { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 30rem), 1fr)); gap: .75rem; }
article.cue { background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: .6rem .75rem;
  cursor: pointer; }
article.cue:focus-visible, article.cue.current { outline: 2px solid var(--accent); outline-offset: 1px; }
article.cue h2 { font-size: .85rem; font-weight: 600; margin: 0 0 .4rem; color: var(--muted);
  font-variant-numeric: tabular-nums; }
.frames { display: grid; grid-template-columns: repeat(4, 1fr); gap: 4px; }
.frames img { display: block; width: 100%; height: auto; border-radius: 3px; }
.still .frames { grid-template-columns: minmax(0, 480px); }
p.text { margin: .5rem 0 0; white-space: pre-wrap; overflow-wrap: anywhere; }
p.empty { color: var(--muted); }
@media print {
  body { background: #fff; color: #000; padding: 0; }
  #player, .tools { display: none !important; }
  main { display: block; }
  article.cue { break-inside: avoid; border-color: #999; margin: 0 0 .5rem; }
}
"""

_SCRIPT = """
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var video = document.querySelector("#player video");
  var cards = Array.prototype.slice.call(document.querySelectorAll("article.cue"));
  var filter = document.getElementById("filter");
  var shown = document.getElementById("shown");
  function seek(card) {
    if (video) { video.currentTime = parseFloat(card.getAttribute("data-start")); }
  }
  cards.forEach(function (card) {
    card.addEventListener("click", function () { seek(card); });
    card.addEventListener("keydown", function (event) {
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); seek(card); }
    });
  });
  if (video) {
    video.addEventListener("error", function () { document.getElementById("player").hidden = true; });
    video.addEventListener("timeupdate", function () {
      var t = video.currentTime;
      cards.forEach(function (card) {
        var on = t >= parseFloat(card.getAttribute("data-start")) && t < parseFloat(card.getAttribute("data-end"));
        card.classList.toggle("current", on);
      });
    });
  }
  if (filter) {
    filter.addEventListener("input", function () {
      var query = filter.value.trim().toLowerCase();
      var count = 0;
      cards.forEach(function (card) {
        var hit = !query || card.querySelector("p.text").textContent.toLowerCase().indexOf(query) !== -1;
        card.hidden = !hit;
        count += hit ? 1 : 0;
      });
      shown.textContent = query ? count + " of " + cards.length + " cues" : cards.length + " cues";
    });
  }
});
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


# Only the page's own style and script (by hash: no inline attribute, no other element runs or
# applies), data: images, and media from where the page is ('self': the relative video, which
# Chromium matches for a file:// page too). No connections, frames, fonts, forms or base URL.
CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; img-src data:; media-src 'self'; style-src {_csp_hash(_STYLE)}; "
    f"script-src {_csp_hash(_SCRIPT)}; base-uri 'none'; form-action 'none'"
)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def video_source(source_path: str, page: str | None) -> str | None:
    """The page's relative URL of a local video source (``page`` None or ``-``: the page is
    read from the working directory), or None when the source is not a local file."""
    if not os.path.isfile(source_path):
        return None
    folder = os.getcwd() if page in (None, "-") else os.path.dirname(os.path.abspath(page))
    relative = os.path.relpath(os.path.abspath(source_path), folder)
    return urllib.parse.quote(Path(relative).as_posix())


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.3f}"


def _facts(header: TrackHeader) -> list[tuple[str, str]]:
    h = header
    facts = [("source", h.source_path)]
    if h.duration is not None:
        facts.append(("duration", format_timestamp(round(h.duration * 1000))))
    if h.width and h.height:
        facts.append(("resolution", f"{h.width}×{h.height}"))
    facts += [("engine", h.engine), ("model", h.model)]
    if h.fps is not None:
        facts.append(("sampling", f"{h.fps:g} frames per second, {h.window} per window (one cue)"))
    facts.append(("prompt", h.prompt if h.prompt is not None else "(the engine's caption prompt)"))
    decoding = []
    if h.temperature is not None:
        decoding.append("greedy" if h.temperature == 0 else f"temperature {h.temperature:g}")
        if h.temperature and h.top_p is not None and h.top_p < 1:
            decoding.append(f"top-p {h.top_p:g}")
        if h.temperature and h.top_k:
            decoding.append(f"top-k {h.top_k}")
    if h.repetition_penalty is not None:
        decoding.append(f"repetition penalty {h.repetition_penalty:g}")
    if h.stop:
        decoding.append("stop at " + ", ".join(json.dumps(stop, ensure_ascii=False) for stop in h.stop))
    decoding.append(f"at most {h.max_new_tokens} new tokens")
    if h.seed is not None:
        decoding.append(f"seed {h.seed}")
    facts.append(("decoding", ", ".join(decoding)))
    if h.created:
        facts.append(("made", h.created))
    return facts


def _one_newline(text: str) -> str:
    """Line breaks as the browser reads them anyway (HTML turns CR LF and CR into LF), so the
    page's bytes say what it shows; ``white-space: pre-wrap`` shows every line as it is."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _img(thumb: Thumbnail) -> str:
    data = base64.b64encode(thumb.jpeg).decode("ascii")
    return (
        f'<img src="data:image/jpeg;base64,{data}" width="{thumb.width}" height="{thumb.height}" '
        f'alt="frame at {format_timestamp(thumb.time_ms)}">'
    )


def card(cue: Cue, still: bool) -> str:
    """One cue's card: its time range (a still has none), its thumbnails, its text."""
    if still:
        heading = "still"
    else:
        heading = (
            f'<time datetime="PT{_seconds(cue.start_ms)}S">{format_timestamp(cue.start_ms)}</time> – '
            f'<time datetime="PT{_seconds(cue.end_ms)}S">{format_timestamp(cue.end_ms)}</time>'
        )
    frames = f'<div class="frames">{"".join(_img(t) for t in cue.thumbnails)}</div>\n' if cue.thumbnails else ""
    return (
        f'<article class="cue{" still" if still else ""}" id="cue-{cue.index}" data-start="{_seconds(cue.start_ms)}" '
        f'data-end="{_seconds(cue.end_ms)}" tabindex="0">\n'
        f'<h2><span class="index">#{cue.index}</span> {heading}</h2>\n'
        f"{frames}"
        f'<p class="text">{_e(_one_newline(cue.text))}</p>\n'
        "</article>\n"
    )


def page(header: TrackHeader, cues: Sequence[Cue], video: str | None) -> str:
    """The whole page for ``cues`` (``video``: the relative URL of the source, or None)."""
    still = header.fps is None
    name = os.path.basename(header.source_path) or header.source_path
    facts = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>\n" for k, v in _facts(header))
    player = (
        f'<div id="player"><video controls preload="metadata" src="{_e(video)}"></video></div>\n'
        if video and not still
        else ""
    )
    count = f"{len(cues)} cue{'' if len(cues) == 1 else 's'}"
    tools = (
        '<p class="tools"><input type="search" id="filter" placeholder="Filter captions" '
        f'aria-label="Filter captions" autocomplete="off"><output id="shown">{count}</output></p>\n'
        if not still
        else ""
    )
    cards = "".join(card(cue, still) for cue in cues) or '<p class="empty">No cues.</p>\n'
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_e(CONTENT_SECURITY_POLICY)}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="generator" content="ffai">\n'
        f"<title>{_e(name)} — ffai contact sheet</title>\n"
        f"<style>{_STYLE}</style>\n<script>{_SCRIPT}</script>\n"
        "</head>\n<body>\n"
        f'<header>\n<h1>{_e(name)}</h1>\n<dl class="facts">\n{facts}</dl>\n</header>\n'
        f"{player}{tools}"
        f'<main id="cues">\n{cards}</main>\n'
        "</body>\n</html>\n"
    )
