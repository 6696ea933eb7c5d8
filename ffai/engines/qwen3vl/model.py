"""The whole Qwen3-VL model: vision tower -> visual tokens and DeepStack features merged into the text.

Follows transformers 5.24's ``Qwen3VLModel.forward``: image (video) embeddings replace the
``<|image_pad|>`` (``<|video_pad|>``) token embeddings in order (``masked_scatter``); the DeepStack
features of images and videos are joined in prompt order over all visual positions, which the
text tower adds to after its first layers; positions come from ``rope.rope_index``.

A model may hold only some of its parts (``ffai.kit.model_parts``): "vision" makes visual tokens
and DeepStack features from pixels, "text" (the kit's text tower) tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ffai.errors import EngineError
from ffai.kit.generate import Prompt
from ffai.kit.model_parts import PARTS, PartedModel
from ffai.kit.precision import EXACT_ATTENTION, VisionAttention
from ffai.kit.text_tower import TextModel

from .config import ModelConfig
from .rope import rope_index, rope_rows
from .vision import VisionModel


@dataclass(frozen=True)
class Visual:
    """What the vision tower made of the images (or the videos) of one prompt: ``embeds`` and each
    DeepStack feature are (n_tokens, text D), in prompt order; ``grid_thw`` (n, 3) their grids."""

    embeds: torch.Tensor
    deepstack: tuple[torch.Tensor, ...]
    grid_thw: torch.Tensor
    video: bool = False  # the pictures are a video's frame pairs (its tokens are <|video_pad|>)


class Qwen3VL(PartedModel):
    def __init__(
        self, cfg: ModelConfig, parts: tuple[str, ...] | None = PARTS, attention: VisionAttention = EXACT_ATTENTION
    ) -> None:
        super().__init__(parts)
        self.cfg = cfg
        self.visual = VisionModel(cfg.vision, attention) if "vision" in self.parts else None
        self.text = TextModel(cfg.text, cfg.tie_word_embeddings) if "text" in self.parts else None

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype: the norms' (float32 also when linears are bfloat16)."""
        return (self.text.norm.weight if self.text is not None else self.visual.merger.norm.weight).dtype

    @torch.no_grad()
    def encode(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor, video: bool = False) -> Visual:
        """The processor's (N, patch values) ``pixel_values`` (or ``pixel_values_videos``, ``video``)
        and their (n, 3) grids -> :class:`Visual`."""
        self._require("vision")
        vision = self.cfg.vision
        grid_thw = torch.as_tensor(grid_thw, dtype=torch.long).cpu().reshape(-1, 3)
        if pixel_values.dim() != 2 or pixel_values.shape[1] != vision.patch_values:
            raise EngineError(
                f"pixel values of shape {tuple(pixel_values.shape)} are not rows of {vision.patch_values} patch values"
            )
        m = vision.spatial_merge_size
        if bool((grid_thw < 1).any()) or bool((grid_thw[:, 1:] % m).any()):
            raise EngineError(f"grids {grid_thw.tolist()} must be positive, heights and widths multiples of {m}")
        if int(grid_thw.prod(-1).sum()) != pixel_values.shape[0]:
            raise EngineError(
                f"grids {grid_thw.tolist()} hold {int(grid_thw.prod(-1).sum())} patches, pixel values "
                f"{pixel_values.shape[0]}"
            )
        embeds, deepstack = self.visual(pixel_values.to(self.device, self.dtype), grid_thw)
        return Visual(embeds, tuple(deepstack), grid_thw, video)

    def positions(
        self, input_ids: torch.Tensor, images: Visual | None, videos: Visual | None
    ) -> tuple[torch.Tensor, int]:
        """(3, 1, T) rotary positions of one prompt and its rope delta (``rope.rope_index``)."""
        cfg = self.cfg
        return rope_index(
            input_ids,
            None if images is None else images.grid_thw,
            None if videos is None else videos.grid_thw,
            image_token_id=cfg.image_token_id,
            video_token_id=cfg.video_token_id,
            spatial_merge_size=cfg.vision.spatial_merge_size,
        )

    @torch.no_grad()
    def embed(
        self, input_ids: torch.Tensor, images: Visual | None, videos: Visual | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, list[torch.Tensor]] | None]:
        """(B, T) ids -> (B, T, D) embeddings with the visual tokens in place, and the DeepStack
        input of the text tower: (visual mask (B, T), one (n_visual, D) feature per layer), or None."""
        self._require("text")
        ids = input_ids.to(self.device)
        x = self.text.embed(ids)  # (B, T, D)
        masks = {}
        for name, token, visual in (
            ("image", self.cfg.image_token_id, images),
            ("video", self.cfg.video_token_id, videos),
        ):
            mask = ids == token  # (B, T)
            slots, rows = int(mask.sum()), 0 if visual is None else visual.embeds.shape[0]
            if visual is not None and visual.embeds.shape[-1] != x.shape[-1]:
                raise EngineError(
                    f"{name} embeddings have width {visual.embeds.shape[-1]}, the text tower {x.shape[-1]}"
                )
            if slots != rows:
                raise EngineError(
                    f"the prompt has {slots} {name} tokens but the {name}s gave {rows} embeddings; "
                    f"prompt and pixels do not match"
                )
            if rows:
                x = x.masked_scatter(mask[..., None], visual.embeds.to(x.device, x.dtype))
                masks[name] = mask
        if not masks:
            return x, None
        if len(masks) == 1:
            (name,) = masks
            visual = images if name == "image" else videos
            return x, (masks[name], list(visual.deepstack))
        # Both kinds: each layer's features laid out over all visual positions in prompt order.
        both = masks["image"] | masks["video"]
        at_image, at_video = masks["image"][both], masks["video"][both]
        features = []
        for image_feature, video_feature in zip(images.deepstack, videos.deepstack):
            joint = image_feature.new_zeros(int(both.sum()), image_feature.shape[-1])
            joint[at_image] = image_feature
            joint[at_video] = video_feature
            features.append(joint)
        return x, (both, features)

    def prompt(self, encoded) -> Prompt:
        """What the text tower takes for the vision stage's output (``ffai.kit.stages.Encoded``):
        the embeddings with the visual tokens in place, the RoPE rows of the prompt's multimodal
        positions, the delta that places every later token, and the DeepStack features."""
        visual = encoded.visual
        images, videos = (None, visual) if visual is not None and visual.video else (visual, None)
        return self.prompt_of(torch.as_tensor(encoded.input_ids, dtype=torch.long), images, videos)

    @torch.no_grad()
    def prompt_of(self, input_ids: torch.Tensor, images: Visual | None, videos: Visual | None) -> Prompt:
        """One prompt's ids (and the vision tower's outputs for its images or videos) -> :class:`Prompt`."""
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        if ids.dim() > 2 or (ids.dim() == 2 and ids.shape[0] != 1):
            raise EngineError(f"a prompt is one sequence of ids, got input_ids of shape {tuple(ids.shape)}")
        ids = ids.reshape(1, -1)  # (1, T)
        positions, delta = self.positions(ids, images, videos)  # (3, 1, T)
        x, deepstack = self.embed(ids, images, videos)
        rope = rope_rows(positions[:, 0].to(x.device), self.cfg.text, self.cfg.mrope_section, self.text.dtype)
        return Prompt(x, rope, delta, deepstack, ids=ids.reshape(-1))
