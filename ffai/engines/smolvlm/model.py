"""The whole Idefics3 model: vision tower -> connector -> image embeddings merged into the text.

Follows transformers' ``Idefics3Model.get_image_features`` (drop all-zero padding tiles, patch
mask from the pixel mask) and ``Idefics3Model.inputs_merger`` (image embeddings replace the
``<image>`` token embeddings in order).

A model may hold only some of its parts (``ffai.kit.model_parts``): "vision" (vision tower +
connector) makes image embeddings, "text" (the kit's text tower) tokens.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ffai.errors import EngineError
from ffai.kit.generate import Prompt
from ffai.kit.model_parts import PARTS, PartedModel
from ffai.kit.precision import EXACT_ATTENTION, VisionAttention
from ffai.kit.text_tower import TextModel

from .config import ModelConfig
from .connector import Connector
from .vision import VisionTransformer, patch_mask


class Idefics3(PartedModel):
    def __init__(
        self,
        cfg: ModelConfig,
        parts: tuple[str, ...] | None = PARTS,
        attention: VisionAttention = EXACT_ATTENTION,
        text_prefill: torch.dtype | None = None,
    ) -> None:
        super().__init__(parts)
        self.cfg = cfg
        self.vision = VisionTransformer(cfg.vision, attention) if "vision" in self.parts else None
        self.connector = Connector(cfg) if "vision" in self.parts else None
        self.text = TextModel(cfg.text, cfg.tie_word_embeddings, text_prefill) if "text" in self.parts else None

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @torch.no_grad()
    def encode_images(
        self,
        pixel_values: torch.Tensor,
        pixel_attention_mask: torch.Tensor | None,
        normalise: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """(n_tiles, C, H, W) tiles + (n_tiles, H, W) pixel mask -> (n_real, image_seq_len, text D).

        Leading dims beyond one tile axis (e.g. the processor's (B, n, C, H, W)) are flattened.
        Without ``normalise`` the tiles are the tower's float input (the reference processor's
        ``pixel_values``), and tiles that are entirely 0.0 are padding tiles, dropped as in the
        reference. With it they are what it maps to that input (``preprocess.normalise`` of
        uint8 tiles), one tile at a time, so only one tile's floats exist at once; none is
        padding (an all-black uint8 tile is a real one). Either way a tile goes to the model's
        device and dtype on its own, as the tower takes it.
        """
        self._require("vision")
        pixels = pixel_values.flatten(0, -4)  # (N, C, H, W), where it was given
        if pixel_attention_mask is None:
            mask = torch.ones(pixels.shape[0], *pixels.shape[2:], dtype=torch.bool, device=self.device)
        else:
            mask = pixel_attention_mask.to(self.device).flatten(0, -3)  # (N, H, W)
        self._check_tiles(pixels, mask)
        if normalise is None:
            real = pixels.flatten(1).any(dim=1)  # (N,) padding tiles are all zeros (no bool copy of the pixels)
            if not bool(real.all()):  # indexing copies: a 13-tile still's 41 MB of pixels, for nothing
                pixels, mask = pixels[real], mask[real.to(mask.device)]
        device, dtype = self.device, self.dtype

        def tile_input(tile: torch.Tensor) -> torch.Tensor:
            return (tile if normalise is None else normalise(tile)).to(device, dtype)

        features = self.vision(pixels, patch_mask(mask, self.cfg.vision.patch_size), tile_input)
        return self.connector(features)  # (N, image_seq_len, Dt)

    def _check_tiles(self, pixels: torch.Tensor, mask: torch.Tensor) -> None:
        vision = self.cfg.vision
        n, c, h, w = pixels.shape
        side = vision.patches_per_side
        if c != vision.num_channels or h // vision.patch_size != side or w // vision.patch_size != side:
            raise EngineError(
                f"image tiles of shape {tuple(pixels.shape)} do not match the model's "
                f"{vision.num_channels}x{vision.image_size}x{vision.image_size} tiles"
            )
        if tuple(mask.shape) != (n, h, w):
            raise EngineError(f"pixel mask of shape {tuple(mask.shape)} does not match tiles {tuple(pixels.shape)}")

    @torch.no_grad()
    def embed(self, input_ids: torch.Tensor, image_embeds: torch.Tensor | None) -> torch.Tensor:
        """(B, T) ids -> (B, T, D); image embeddings fill the ``<image>`` positions in order."""
        self._require("text")
        input_ids = input_ids.to(self.device)
        x = self.text.embed_tokens(input_ids)  # (B, T, D)
        is_image = input_ids == self.cfg.image_token_id  # (B, T)
        n_slots = int(is_image.sum())
        n_embeds = 0 if image_embeds is None else image_embeds.shape[0] * image_embeds.shape[1]
        if image_embeds is not None and image_embeds.shape[-1] != x.shape[-1]:
            raise EngineError(f"image embeddings have width {image_embeds.shape[-1]}, the text tower {x.shape[-1]}")
        if n_slots != n_embeds:
            raise EngineError(
                f"the prompt has {n_slots} image tokens but the images gave {n_embeds} embeddings "
                f"({self.cfg.image_seq_len} per tile); prompt and images do not match"
            )
        if n_slots == 0:
            return x
        flat = image_embeds.to(x.device, x.dtype).reshape(-1, x.shape[-1])  # (n_tiles*image_seq_len, D)
        return x.masked_scatter(is_image[..., None], flat)

    def prompt(self, encoded) -> Prompt:
        """What the text tower takes for the vision stage's output (``ffai.kit.stages.Encoded``)."""
        return self.prompt_of(encoded.input_ids, encoded.visual)

    @torch.no_grad()
    def prompt_of(self, input_ids: torch.Tensor | Sequence[int], image_embeds: torch.Tensor | None) -> Prompt:
        """One prompt's ids and its tiles' image embeddings -> :class:`Prompt`: the embeddings with
        the tiles' in place, at plain positions."""
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        if ids.dim() > 2 or (ids.dim() == 2 and ids.shape[0] != 1):
            raise EngineError(f"a prompt is one sequence of ids, got input_ids of shape {tuple(ids.shape)}")
        return Prompt(self.embed(ids.reshape(1, -1), image_embeds), ids=ids.reshape(-1))  # (1, T, D)
