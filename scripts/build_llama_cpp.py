"""A random-weight Q8_0 GGUF at SmolVLM-256M's text tower shapes (SmolLM2-135M's, vocab 49 280, an
untied LM head), for llama.cpp's ``llama-bench`` (built by scripts/build_llama_cpp.sh) to decode the
same shapes ffai's int8 step does; a benchmark peer only, ffai never reads it.

    python scripts/build_llama_cpp.py OUT.gguf

Written with the ``gguf`` package of the same llama.cpp source (build_llama_cpp.sh installs it) (no weights to convert: the
tests' checkpoints are random too). The vocabulary is placeholder tokens: ``llama-bench`` times the
model's graph, not its tokenizer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# SmolVLM-256M-Instruct's text_config
LAYERS, HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 30, 576, 1536, 9, 3, 49280
HEAD_DIM, ROPE_THETA, RMS_EPS, CONTEXT = 64, 100000.0, 1e-5, 8192


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    try:
        import gguf
    except ImportError:
        print(
            "error: no gguf package; scripts/build_llama_cpp.sh installs the one its llama.cpp ships", file=sys.stderr
        )
        return 1
    import numpy as np

    rng = np.random.default_rng(0)
    q8 = gguf.GGMLQuantizationType.Q8_0
    writer = gguf.GGUFWriter(str(args.out), "llama")
    writer.add_name("random SmolVLM-256M text tower")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    # A SentencePiece-style vocabulary: specials, the 256 byte tokens llama.cpp looks up, placeholders.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    tokens += [f"t{i}" for i in range(VOCAB - len(tokens))]
    types += [gguf.TokenType.NORMAL] * (VOCAB - len(types))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * VOCAB)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def matrix(name: str, rows: int, cols: int) -> None:  # (out, in), as the checkpoint holds it
        w = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)
        writer.add_tensor(name, gguf.quants.quantize(w, q8), raw_dtype=q8)

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(HIDDEN, dtype=np.float32))

    matrix("token_embd.weight", VOCAB, HIDDEN)
    for i in range(LAYERS):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
        matrix(f"blk.{i}.attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        matrix(f"blk.{i}.attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        matrix(f"blk.{i}.attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        matrix(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        matrix(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    norm("output_norm.weight")
    matrix("output.weight", VOCAB, HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
