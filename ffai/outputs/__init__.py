"""Where cues go: the track formats (srt, vtt, json, jsonl, txt, html), the contact sheet and its
thumbnails, and the captions muxed into a copy of the video. Every output is written through a
temporary file renamed into place."""
