"""Runs INSIDE the vLLM venv (no draftsmith there): loads a DSpark export with vLLM's own
`Qwen3DSparkForCausalLM` on the CPU and drafts one block from given backbone hidden states.

    python dspark_vllm_probe.py TARGET_DIR EXPORT_DIR INPUTS.pt OUT.pt

INPUTS.pt: {"hidden": [N, H] backbone hidden states of the N block queries, "anchor": int,
"lm_head": [V, H] the target's lm_head weight}. OUT.pt: {"loaded": sorted names vLLM's loader
filled, "params": {name: tensor} of the DSpark heads as loaded, "logits": [N, V] the
Markov-corrected logits of the greedy left-to-right walk, "tokens": [N], "confidence": [N] or None}.
The walk is `DSparkSpeculator._sample_sequential`'s greedy path, written with the model's own
methods (`compute_draft_logits`, `markov_embed`, `markov_bias`, `compute_confidence`): the
speculator itself runs only inside vLLM's GPU model runner.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch


def main(target: str, export: str, inputs_path: str, out_path: str) -> None:
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM

    raw = json.load(open(os.path.join(export, "config.json")))
    # vLLM's CPU build refuses a "dspark" config (Model Runner V1: "does not support dspark speculative
    # decoding"; V2: "requires Triton"). The model class needs only the draft's hf_config (every key of
    # the export's config.json) and the target's config, so the engine config is made as for DFlash
    # (the same backbone) from a copy of config.json that declares the DFlash architecture.
    as_dflash = tempfile.mkdtemp()
    json.dump({**raw, "architectures": ["DFlashDraftModel"]}, open(os.path.join(as_dflash, "config.json"), "w"))
    args = EngineArgs(model=target, dtype="float32", enforce_eager=True, max_model_len=512,
                      speculative_config={"method": "dflash", "model": as_dflash, "num_speculative_tokens": raw["block_size"]})
    vllm_config = args.create_engine_config()
    hf_config = vllm_config.speculative_config.draft_model_config.hf_config
    print("draft config: markov_rank", getattr(hf_config, "markov_rank", None), "confidence head",
          getattr(hf_config, "enable_confidence_head", None), flush=True)
    torch.set_default_dtype(torch.float32)
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"file://{tempfile.mktemp()}", backend="gloo")
        ensure_model_parallel_initialized(1, 1)
        model = Qwen3DSparkForCausalLM(vllm_config=vllm_config, prefix="")
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        weights = load_file(os.path.join(export, "model.safetensors"))
        loaded = model.load_weights(iter(weights.items()))
    params = dict(model.named_parameters())
    # What the export did not fill: every DSpark parameter vLLM keeps must have changed from its init
    # (the lm_head is the target's, shared at serving time by load_dspark_model, not the drafter's).
    untouched = sorted(name for name, p in params.items()
                       if not name.startswith("lm_head") and torch.equal(before[name], p.detach()) and p.numel() > 1)
    print("untouched parameters:", untouched, flush=True)
    inputs = torch.load(inputs_path)
    with torch.no_grad():
        params["lm_head.weight"][: inputs["lm_head"].shape[0]].copy_(inputs["lm_head"])  # vLLM pads the vocab rows
    heads = {name: p.detach().clone() for name, p in params.items() if "markov_head" in name or "confidence_head" in name}
    # As vLLM's loader does after load_weights (on the CPU: the GEMM layout of each linear layer).
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    with set_current_vllm_config(vllm_config):
        process_weights_after_loading(model, vllm_config.model_config, torch.device("cpu"))
    with torch.no_grad():
        hidden = inputs["hidden"].float()
        base = model.compute_draft_logits(hidden)
        previous = torch.tensor([int(inputs["anchor"])])
        logits, tokens, embeds = [], [], []
        for i in range(hidden.shape[0]):
            embed = model.markov_embed(previous)
            step = base[i : i + 1] + model.markov_bias(embed)
            logits.append(step[0])
            embeds.append(embed[0])
            previous = step.argmax(-1)
            tokens.append(int(previous))
        confidence = None
        if model.model.confidence_head is not None:
            confidence = model.compute_confidence(hidden, torch.stack(embeds))
    torch.save({"loaded": sorted(loaded) if loaded is not None else None, "untouched": untouched, "params": heads,
                "logits": torch.stack(logits), "tokens": tokens, "confidence": confidence}, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:5])
