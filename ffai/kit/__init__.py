"""What every engine is built from: the text tower and its KV cache, the token loop and its text
stage, the linears of the opt-in dtypes and the precision plan that picks them, norms, attention
and RoPE helpers, checkpoint loading (safetensors, config JSON, weight-name tables), tokenizer
files and prompts, device choice, and this host's CPU.

An engine holds only its architecture (config fields, vision tower, connector, positions, prompt
template, weight names, preprocessing geometry) and builds the rest from here. Nothing here names
an engine: the kit is the same for every family (tests/test_kit.py checks it).
"""
