"""Checkpoint tensor names and module parameter names, mapped by one table per engine (after
gpt-fast's ``convert_hf_checkpoint``): data, no torch, so an engine's table imports cheaply."""

from __future__ import annotations

import re

# The text tower's module names (ffai.kit.text_tower), the same in every engine's model.
EMBEDDINGS = "text.embed_tokens.weight"
HEAD = "text.lm_head"


class WeightNames:
    """Checkpoint tensor names <-> module parameter names, by one table of templates.

    In a template ``{}`` is a layer index and a trailing ``*`` any rest of the name; a module
    template ending in ``[i]`` is the i-th part of a fused parameter (its i-th block of rows).
    Biases a config turns off are simply absent from the module, so a checkpoint that has them
    fails the "every tensor used" check."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = dict(table)
        self._to_module = [(_pattern(ckpt), module) for ckpt, module in self.table.items()]
        self._to_checkpoint = [(_pattern(module), ckpt) for ckpt, module in self.table.items()]

    def module_name(self, checkpoint_name: str) -> str | None:
        """The parameter a checkpoint tensor fills, or None if the table has no entry for it."""
        return _rename(checkpoint_name, self._to_module)

    def checkpoint_name(self, module_param: str) -> str | None:
        return _rename(module_param, self._to_checkpoint)


def decoder_names(prefix: str, head: str = "lm_head.weight") -> dict[str, str]:
    """The text tower's part of a weight-name table (``ffai.kit.text_tower``, under ``text.``) for a
    checkpoint that keeps a Llama-style tower's tensors under ``prefix`` and its LM head as
    ``head``: q/k/v and gate/up as parts of one fused weight each."""
    layer = f"{prefix}layers.{{}}."
    ours = "text.layers.{}."
    table = {
        f"{prefix}embed_tokens.weight": EMBEDDINGS,
        f"{prefix}norm.weight": "text.norm.weight",
        head: f"{HEAD}.weight",
    }
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        for kind in ("weight", "bias"):
            table[f"{layer}self_attn.{name}.{kind}"] = f"{ours}self_attn.qkv.{kind}[{i}]"
    for i, name in enumerate(("gate_proj", "up_proj")):
        for kind in ("weight", "bias"):
            table[f"{layer}mlp.{name}.{kind}"] = f"{ours}mlp.gate_up.{kind}[{i}]"
    for name in ("self_attn.o_proj.weight", "self_attn.o_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias"):
        table[f"{layer}{name}"] = f"{ours}{name}"
    for name in ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"):
        table[f"{layer}{name}.weight"] = f"{ours}{name}.weight"
    return table


def _pattern(template: str) -> re.Pattern:
    body = re.escape(template).replace(r"\{\}", r"(\d+)")
    if body.endswith(r"\*"):
        body = body[:-2] + "(.*)"
    return re.compile(body + "$")


def _rename(name: str, table: list) -> str | None:
    for pattern, target in table:
        m = pattern.match(name)
        if m:
            # The groups fill the target's "{}" and trailing "*" in the order they stand.
            pieces = re.split(r"(\{\}|\*$)", target)
            groups = iter(m.groups())
            return "".join(next(groups) if piece in ("{}", "*") else piece for piece in pieces)
    return None
