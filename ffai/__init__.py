"""ffai: caption and question images and video with a local vision-language model.

    import ffai
    from ffai.engines.contract import DecodingOptions

    options = ffai.CaptionOptions(fps=2, window=8, decoding=DecodingOptions(max_new_tokens=32))
    for cue in ffai.caption("clip.mp4", options):
        print(cue.start_ms, cue.end_ms, cue.text)

Names load lazily so that ``import ffai`` (and ``ffai --help``) stays fast.
"""

from __future__ import annotations

__all__ = ["caption", "CaptionOptions", "Cue", "FfaiError"]


def __getattr__(name: str):
    if name == "caption":
        from ffai.run.captioner import caption

        return caption
    if name == "CaptionOptions":
        from ffai.run.options import CaptionOptions

        return CaptionOptions
    if name == "Cue":
        from ffai.outputs.cues import Cue

        return Cue
    if name == "FfaiError":
        from ffai.errors import FfaiError

        return FfaiError
    raise AttributeError(f"module 'ffai' has no attribute {name!r}")
