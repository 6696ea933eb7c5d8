"""Where an Idefics3 checkpoint's tensors go in :class:`~ffai.engines.smolvlm.model.Idefics3`: one
table of names (``NAMES``), read by the kit's loader (``ffai.kit.loading``).

These are the names of the hub checkpoints (saved by transformers 4.46) and also exactly what
transformers 5.24's ``Idefics3ForConditionalGeneration.save_pretrained`` writes (it has no key
conversion for Idefics3; checked by ``tests/test_smolvlm_config.py``). q/k/v are read into their
rows of one fused weight (``ffai.kit.linears.FusedLinear``), in both towers.
"""

from __future__ import annotations

from ffai.kit.weight_names import WeightNames, decoder_names

VISION = "model.vision_model."
LAYER = f"{VISION}encoder.layers.{{}}."

# checkpoint name -> module name; "{}" is a layer index, "[i]" the i-th part of a fused parameter.
NAMES = WeightNames(
    {
        f"{VISION}embeddings.patch_embedding.weight": "vision.embeddings.patch_embedding.weight",
        f"{VISION}embeddings.patch_embedding.bias": "vision.embeddings.patch_embedding.bias",
        f"{VISION}embeddings.position_embedding.weight": "vision.embeddings.position_embedding.weight",
        **{
            f"{LAYER}self_attn.{name}.{kind}": f"vision.layers.{{}}.self_attn.qkv.{kind}[{i}]"
            for i, name in enumerate(("q_proj", "k_proj", "v_proj"))
            for kind in ("weight", "bias")
        },
        **{
            f"{LAYER}{name}.{kind}": f"vision.layers.{{}}.{name}.{kind}"
            for name in ("layer_norm1", "layer_norm2", "self_attn.out_proj", "mlp.fc1", "mlp.fc2")
            for kind in ("weight", "bias")
        },
        f"{VISION}post_layernorm.weight": "vision.post_layernorm.weight",
        f"{VISION}post_layernorm.bias": "vision.post_layernorm.bias",
        "model.connector.modality_projection.proj.weight": "connector.modality_projection.proj.weight",
        **decoder_names("model.text_model."),
    }
)
