"""The static checks: every cause of "good training metrics, poor served acceptance" a config shows.

Each check takes the export and the target and returns findings; none builds a model. The known
causes (issue trackers of SpecForge, z-lab/dflash, vLLM speculators): target-layer ids off by one
or on the last layer, another feature definition, a mask token outside the vocabulary, a random or
untied LM head, RoPE or sliding-window settings that differ, shapes of another target, and a block
size the engine is told wrongly.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftsmith.check.config import CheckConfig, Finding, Severity
from draftsmith.check.inputs import EMBED_NAMES, HEAD_NAMES, ExportView, TargetView
from draftsmith.core.errors import InputError


def _finding(check: str, field: str, found: Any, expected: Any, fix: str, severity: Severity = "error") -> Finding:
    return Finding(check=check, field=field, found=str(found), expected=str(expected), fix=fix, severity=severity)


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return list(value)
    return None


def check_layers(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    from draftsmith.model.config import default_target_layer_ids

    layers = int(target.config.num_hidden_layers)
    found: list[Finding] = []
    declared = export.raw.get("num_target_layers")
    if declared != layers:
        found.append(_finding("layers", "num_target_layers", declared, f"{layers} (the target's decoder layers)",
                              "the drafter was made for another target; retrain it for this one"))
    ids = _int_list(export.value("target_layer_ids"))
    if not ids:
        return found + [_finding("layers", "dflash_config.target_layer_ids", export.value("target_layer_ids"),
                                 "a non-empty list of layer indices", "re-export with draftsmith export")]
    suggestion = default_target_layer_ids(layers, len(ids))
    retrain = f"retrain with --target-layer-ids {','.join(map(str, suggestion))} (draftsmith's default here)"
    outside = [i for i in ids if not 0 <= i < layers]
    if outside:
        found.append(_finding("layers", "dflash_config.target_layer_ids", ids,
                              f"indices in 0..{layers - 1} (the target has {layers} layers); {outside} are outside",
                              f"an aux-layer offset shifted them; {retrain}"))
    elif layers - 1 in ids:
        found.append(_finding(
            "layers", "dflash_config.target_layer_ids", ids, f"below {layers - 1}, the target's last decoder layer",
            "SGLang crashes on the last layer and the reference dflash reads it after the final norm while vLLM "
            f"reads it before (the last hidden state taken one layer late); {retrain}"))
    if len(set(ids)) != len(ids):
        found.append(_finding("layers", "dflash_config.target_layer_ids", ids, "distinct layers",
                              f"repeated layers waste the fc input; {retrain}", "warning"))
    fc = export.shapes.get("fc.weight")
    hidden = int(target.config.hidden_size)
    if fc is not None and fc != (hidden, len(ids) * hidden):
        found.append(_finding("layers", "fc.weight shape", list(fc), [hidden, len(ids) * hidden],
                              f"fc takes {len(ids)} features x hidden {hidden}: target_layer_ids does not match the "
                              "weights; restore the config the drafter was trained with"))
    return found


def check_feature_definition(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    from draftsmith.model.config import FEATURE_DEFINITION

    definition = export.flash.get("feature_definition")
    if definition == FEATURE_DEFINITION:
        return []
    ids = _int_list(export.value("target_layer_ids")) or []
    last = int(target.config.num_hidden_layers) - 1
    if definition is None:
        if last in ids:
            return [_finding("feature", "dflash_config.feature_definition", "missing (trained before it was recorded)",
                             repr(FEATURE_DEFINITION),
                             f"the drafter learned layer {last} after the final norm, engines serve it before; retrain")]
        return [_finding("feature", "dflash_config.feature_definition", "missing", repr(FEATURE_DEFINITION),
                         "no effect below the last layer; re-export with this draftsmith to record it", "note")]
    return [_finding("feature", "dflash_config.feature_definition", repr(definition), repr(FEATURE_DEFINITION),
                     "engines feed each layer's output before the final norm; retrain on that feature")]


def check_mask_token(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    from draftsmith.model.config import DRAFTER_EMBEDDING, MASK_TOKEN
    from draftsmith.model.features import choose_mask_token, mask_token_id

    mask = export.value("mask_token_id")
    vocab = int(target.config.vocab_size)
    if not isinstance(mask, int) or isinstance(mask, bool) or not 0 <= mask < vocab:
        return [_finding("mask", "dflash_config.mask_token_id", mask,
                         f"an id inside the target's embedding table (0..{vocab - 1})",
                         "retrain: draftsmith train chooses one from the target (draftsmith.model.choose_mask_token)")]
    tokenizer = target.tokenizer
    if tokenizer is None:
        return [_finding("mask", "dflash_config.mask_token_id", mask, f"{MASK_TOKEN} of the target tokenizer",
                         "the target has no tokenizer to confirm it; add one", "warning")]
    shown = tokenizer.convert_ids_to_tokens(mask) if mask < len(tokenizer) else None
    recorded = export.flash.get("mask_token", shown) if "mask_token_source" in export.flash else shown
    expected = mask_token_id(tokenizer)
    if expected is not None and expected != mask:
        return [_finding("mask", "dflash_config.mask_token_id", f"{mask} ({shown or 'an untrained row'!r})",
                         f"{expected} ({MASK_TOKEN} in the target tokenizer)",
                         f"set dflash_config.mask_token_id to {expected}, the id the drafter was trained with")]
    if recorded != shown:  # the tokenizer changed under the drafter: its MASK is now another token
        return [_finding("mask", "dflash_config.mask_token", f"{recorded!r} at id {mask} when trained",
                         f"{shown!r} (id {mask} in the target tokenizer)",
                         "the target's tokenizer differs from the training one; serve the target it was trained on")]
    choice = choose_mask_token(tokenizer, vocab)
    file = mask_embedding_findings(export, target, mask)
    if file or export.flash.get("mask_token_source") == DRAFTER_EMBEDDING:
        return file
    if choice.token_id == mask and export.flash.get("mask_token_source", choice.source) == choice.source:
        return []
    if export.flash.get("mask_token_source") == "override" or shown is None or mask in tokenizer.added_tokens_decoder:
        return [_finding("mask", "dflash_config.mask_token_id", f"{mask} ({shown or 'a padding row'!r})",
                         f"{choice.describe() if choice else 'no safe default'} (draftsmith's choice)",
                         "fine when trained with --mask-token-id on purpose", "note")]
    return [_finding("mask", "dflash_config.mask_token_id", f"{mask} ({shown!r}, a real token)",
                     choice.describe() if choice else f"{MASK_TOKEN} or a padded row >= {len(tokenizer)}",
                     "retrain with draftsmith's default mask token (leave --mask-token-id unset)", "warning")]


def mask_embedding_findings(export: ExportView, target: TargetView, mask: int) -> list[Finding]:
    """A drafter-owned mask vector: mask_embedding.pt must exist (vLLM would otherwise feed the target's
    row of the mask id), hold the config's mask id and one vector of the target's hidden size."""
    from draftsmith.model.config import DRAFTER_EMBEDDING
    from draftsmith.model.io import MASK_EMBEDDING_NAME, read_mask_embedding_file

    file = export.path / MASK_EMBEDDING_NAME
    owned = export.flash.get("mask_token_source") == DRAFTER_EMBEDDING
    if not file.is_file():
        return [_finding("mask", MASK_EMBEDDING_NAME, "missing", "the drafter's trained mask embedding",
                         f"re-export: vLLM would embed mask id {mask} with the target's row, not the trained one")] if owned else []
    try:
        token_id, embedding = read_mask_embedding_file(file)
    except InputError as error:
        return [_finding("mask", MASK_EMBEDDING_NAME, error, "torch.save({'mask_token_id', 'embedding'})", "re-export")]
    found = []
    if token_id is not None and token_id != mask:  # vLLM refuses to load the drafter
        found.append(_finding("mask", f"{MASK_EMBEDDING_NAME} mask_token_id", token_id, f"{mask} (dflash_config.mask_token_id)",
                              "re-export: the file belongs to another drafter or the config was edited"))
    hidden = int(target.config.hidden_size)
    if tuple(embedding.shape) != (hidden,):
        found.append(_finding("mask", f"{MASK_EMBEDDING_NAME} embedding shape", list(embedding.shape),
                              f"[{hidden}] (the target's hidden size)", "re-export the drafter trained for this target"))
    if not owned:
        found.append(_finding("mask", "dflash_config.mask_token_source", export.flash.get("mask_token_source"),
                              f"{DRAFTER_EMBEDDING!r} (vLLM replaces id {mask}'s row with the file's vector)",
                              f"remove {MASK_EMBEDDING_NAME}: the drafter was trained on the target's row"))
    return found


def _max_diff(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


def _head_finding(field: str, ours, theirs, what: str) -> Finding | None:
    if theirs is None:
        return _finding("heads", field, f"shipped {list(ours.shape)}", f"absent or equal to the target's {what}",
                        f"the target's {what} is missing from its weights; remove {field} from the export", "warning")
    if tuple(ours.shape) != tuple(theirs.shape):
        return _finding("heads", field, f"shape {list(ours.shape)}", f"the target's {what} {list(theirs.shape)}",
                        f"vLLM uses a drafter's own {what}; remove {field} from model.safetensors")
    diff = _max_diff(ours, theirs)
    if diff > 0:
        return _finding("heads", field, f"different from the target's {what} (max |diff| {diff:.3g})",
                        f"absent, or equal to the target's {what}",
                        f"vLLM and SGLang use a drafter's own {what} when it ships one; remove {field} from "
                        "model.safetensors (draftsmith export writes none)")
    return None


def check_heads(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    found = []
    head, embed = export.tensor(HEAD_NAMES), export.tensor(EMBED_NAMES)
    if head is not None:
        finding = _head_finding("lm_head.weight", head, target.lm_head(),
                                "lm_head" + (" (tied: its embedding table)" if target.tied else ""))
        found += [finding] if finding else []
    if embed is not None:
        finding = _head_finding("embed_tokens.weight", embed, target.embeddings(), "embedding table")
        found += [finding] if finding else []
    tie = bool(export.raw.get("tie_word_embeddings", False))
    if tie != target.tied:
        ships = head is not None or embed is not None
        found.append(_finding(
            "heads", "tie_word_embeddings", str(tie).lower(), f"{str(target.tied).lower()} (the target's)",
            "an engine that ties the drafter's head to its embeddings scores with the embedding table, not the "
            f"target's {'lm_head' if not target.tied else 'tied head'}; set it to the target's value",
            "error" if ships else "warning"))
    return found


def _rope(config) -> dict[str, Any]:
    from draftsmith.model.config import target_rope_parameters

    params = target_rope_parameters(config)
    if "rope_theta" not in params and getattr(config, "rope_theta", None) is not None:
        params["rope_theta"] = config.rope_theta
    params.setdefault("rope_type", "default")
    factor = params.pop("partial_rotary_factor", None) or getattr(config, "partial_rotary_factor", None) or 1.0
    params["partial_rotary_factor"] = float(factor)
    return params


def check_rope(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    try:
        parsed = export.parsed
    except Exception as error:  # transformers' own validators refuse the file (layer counts, types)
        reason = str(error).strip().splitlines()[-1].strip()
        return [_finding("rope", "config.json", "unparseable", "a config transformers can read",
                         f"an engine that loads this export fails the same way: {reason}")]
    ours, theirs = _rope(parsed), _rope(target.config)
    found = []
    for key in sorted(set(ours) | set(theirs)):
        if ours.get(key) != theirs.get(key) and not (
            isinstance(ours.get(key), (int, float)) and isinstance(theirs.get(key), (int, float))
            and float(ours[key]) == float(theirs[key])
        ):
            field = "partial_rotary_factor" if key == "partial_rotary_factor" else f"rope_parameters.{key}"
            found.append(_finding("rope", field, ours.get(key), f"{theirs.get(key)} (the target's)",
                                  "context keys are rotated at other angles than the target's; copy the target's RoPE "
                                  "settings into config.json (train with the target the drafter is served with)"))
    legacy = export.raw.get("rope_theta")
    theta = theirs.get("rope_theta")
    if legacy is not None and theta is not None and float(legacy) != float(theta):
        found.append(_finding("rope", "rope_theta", legacy, f"{theta} (the target's)",
                              "engines on transformers 4.x read this legacy key; set it to the target's theta"))
    if "rope_scaling" in export.raw:
        scaling = export.raw["rope_scaling"] or None
        if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type", "default")) == "default":
            scaling = None
        wanted = {k: v for k, v in theirs.items() if k not in ("rope_theta", "partial_rotary_factor")}
        wanted_legacy = wanted if wanted.get("rope_type", "default") != "default" else None
        if scaling != wanted_legacy:
            found.append(_finding("rope", "rope_scaling", scaling, f"{wanted_legacy} (the target's)",
                                  "engines on transformers 4.x read this legacy key; set it to the target's scaling"))
    return found


def _served_causal(export: ExportView) -> bool | None:
    """Whether vLLM serves the sliding layers causally: `is_causal`, else `dflash_config.causal`, else
    yes (vLLM's DFlash takes a sliding layer without either for a causal one)."""
    for value in (export.raw.get("is_causal"), export.flash.get("causal")):
        if value is not None:
            return bool(value)
    return True


def check_sliding_window(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    from draftsmith.model.config import layer_windows

    raw = export.raw
    layer_types = raw.get("layer_types") or []
    sliding = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    use_swa = bool(export.flash.get("use_swa", False))
    trained = export.flash.get("trained_windows")
    if not sliding and not use_swa and not (isinstance(trained, list) and any(w is not None for w in trained)):
        return []
    window = export.flash.get("swa_window_size", raw.get("sliding_window"))
    found = []
    if (sliding or use_swa) and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        return [_finding("sliding_window", "sliding_window", window,
                         f"the window the drafter was trained with (layers {sliding or 'all'} are sliding)",
                         "restore sliding_window; without it engines refuse the drafter or serve full attention, "
                         "a cliff past the window")]
    if sliding and raw.get("use_sliding_window") is False:
        found.append(_finding("sliding_window", "use_sliding_window", "false", "true",
                              f"transformers drops sliding_window ({window}) when use_sliding_window is false, so "
                              "vLLM, the reference and SGLang serve these layers without a window; set it to true"))
    served = layer_windows(export.parsed) if not found else []
    if (sliding or use_swa) and _served_causal(export):
        found.append(_finding("sliding_window", "is_causal", "unset (vLLM serves sliding DFlash layers causally)",
                              "false (draftsmith trains every draft layer non-causally over its block)",
                              'set "is_causal": false and dflash_config.causal false, as draftsmith export writes them'))
    if not isinstance(trained, list):
        found.append(_finding("sliding_window", "dflash_config.trained_windows", "not recorded",
                              f"the windows the drafter was trained with (the export serves {served or 'sliding layers'})",
                              "trained before draftsmith recorded its windows (or elsewhere): in-process tau does not "
                              "predict this drafter's served tau; retrain with --draft-sliding-window", "warning"))
        return found
    if served and list(trained) != served:
        differ = [i for i, (a, b) in enumerate(zip(trained, served)) if a != b] or "the layer count"
        found.append(_finding("sliding_window", "layer_types / sliding_window",
                              f"served windows {served} (None = full attention)", f"the trained windows {trained}",
                              f"layers {differ} would be served with another attention span than they learned (trains "
                              "well, serves badly); restore layer_types and sliding_window from training, or retrain "
                              "with --draft-sliding-window"))
    return found


# safetensors dtype -> the name configs give it; anything else holds no trainable weights.
_FLOAT_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
_CONFIG_DTYPES = {name: code for code, name in _FLOAT_DTYPES.items()} | {"half": "F16", "float": "F32", "double": "F64"}


def _declared_dtype(config: Any) -> str | None:
    """The safetensors code of a config's `dtype` (or legacy `torch_dtype`), or None when it names none."""
    get = config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)
    value = get("dtype") or get("torch_dtype")
    name = str(value).removeprefix("torch.") if value is not None else None
    return _CONFIG_DTYPES.get(name) if name else None


def _dtype_words(code: str) -> str:
    return _FLOAT_DTYPES.get(code, code)


def check_dtypes(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    """Weights and the mask vector stored as what the config says, in a float type the target can use.

    An integer tensor is a destroyed weight (every value truncated) that engines load without a word;
    a config `dtype` the file does not have makes engines cast on load and the card lie."""
    from draftsmith.model.io import MASK_EMBEDDING_NAME, read_mask_embedding_file

    found = []
    by_dtype: dict[str, list[str]] = {}
    for name, dtype in export.dtypes.items():
        by_dtype.setdefault(dtype, []).append(name)
    for dtype in sorted(set(by_dtype) - set(_FLOAT_DTYPES)):
        names = sorted(by_dtype[dtype])
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        found.append(_finding("dtypes", "model.safetensors dtype", f"{dtype} for {shown}",
                              "a float type (bfloat16, float16 or float32)",
                              "the weights were cast to a non-float type, which truncates every value; re-export "
                              "from the training checkpoint"))
    floats = sorted(set(by_dtype) & set(_FLOAT_DTYPES))
    declared = _declared_dtype(export.raw)
    if floats and declared is None:
        found.append(_finding("dtypes", "dtype", export.raw.get("dtype", export.raw.get("torch_dtype")),
                              f"{_dtype_words(floats[0])} (the weights' dtype)",
                              "set config.json's dtype to the weights' own; engines load in the dtype it names",
                              "warning"))
    elif floats and floats != [declared]:
        found.append(_finding("dtypes", "dtype", f"{_dtype_words(declared)} in config.json",
                              f"{' and '.join(map(_dtype_words, floats))} (what model.safetensors holds)",
                              "config.json was edited or the weights replaced after export; re-export"))
    mask_file = export.path / MASK_EMBEDDING_NAME
    if mask_file.is_file():
        try:
            _, embedding = read_mask_embedding_file(mask_file)
        except InputError:
            embedding = None  # the mask check names an unreadable file
        if embedding is not None and not embedding.is_floating_point():
            found.append(_finding("dtypes", f"{MASK_EMBEDDING_NAME} dtype", str(embedding.dtype).removeprefix("torch."),
                                  f"{_dtype_words(floats[0]) if floats else 'a float type'} (the weights' dtype)",
                                  "the mask vector was cast to an integer type, which truncates it; re-export"))
        elif embedding is not None and floats and str(embedding.dtype).removeprefix("torch.") != _dtype_words(floats[0]):
            found.append(_finding("dtypes", f"{MASK_EMBEDDING_NAME} dtype", str(embedding.dtype).removeprefix("torch."),
                                  f"{_dtype_words(floats[0])} (the weights' dtype)",
                                  "the file belongs to another export of the drafter; re-export", "warning"))
    served = _declared_dtype(target.raw) or _declared_dtype(target.raw.get("text_config") or {})
    if served and floats == ["F16"] and served in ("BF16", "F32"):
        found.append(_finding("dtypes", "dtype", "float16",
                              f"{_dtype_words(served)} or bfloat16 (the target computes in {_dtype_words(served)})",
                              "float16 overflows where the target's bfloat16 features exceed 65,504; export with "
                              "--dtype bfloat16", "warning"))
    return found


_SHAPE_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")


def check_shapes(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    found = []
    theirs = target.config
    for name in _SHAPE_FIELDS:
        mine, wanted = export.raw.get(name), getattr(theirs, name, None)
        if name == "head_dim" and wanted is None:
            wanted = theirs.hidden_size // theirs.num_attention_heads
        if mine != wanted:
            found.append(_finding("shapes", name, mine, f"{wanted} (the target's)",
                                  "the drafter was made for another target; retrain it for this one"))
    eps, wanted_eps = export.raw.get("rms_norm_eps"), getattr(theirs, "rms_norm_eps", None)
    if eps is not None and wanted_eps is not None and float(eps) != float(wanted_eps):
        found.append(_finding("shapes", "rms_norm_eps", eps, wanted_eps, "copy the target's rms_norm_eps", "warning"))
    if found:
        return found
    hidden, heads, kv = export.raw["hidden_size"], export.raw["num_attention_heads"], export.raw["num_key_value_heads"]
    head_dim = export.raw["head_dim"]
    expected = {"q_proj": (heads * head_dim, hidden), "k_proj": (kv * head_dim, hidden),
                "v_proj": (kv * head_dim, hidden), "o_proj": (hidden, heads * head_dim)}
    count = export.raw.get("num_hidden_layers")
    present = {int(m.group(1)) for m in (re.match(r"layers\.(\d+)\.", n) for n in export.shapes) if m}
    if present != set(range(count or 0)):
        found.append(_finding("shapes", "num_hidden_layers", count, f"{len(present)} (layers in model.safetensors)",
                              "restore the config the drafter was trained with"))
    layer_types = export.raw.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) != len(present):
        found.append(_finding("shapes", "layer_types", f"{len(layer_types)} entries",
                              f"{len(present)} (one per layer in model.safetensors)",
                              "engines index layer_types by layer; restore the config the drafter was trained with"))
    for index in sorted(present):
        for proj, shape in expected.items():
            name = f"layers.{index}.self_attn.{proj}.weight"
            if name in export.shapes and export.shapes[name] != shape:
                found.append(_finding("shapes", f"{name} shape", list(export.shapes[name]), list(shape),
                                      "the weights belong to another config; restore it"))
    return found


def _is_dspark(export: ExportView) -> bool:
    return export.variant == "dspark"


# The Markov head types vLLM's qwen3_dspark.py builds; any other is loaded as one of these or refused.
MARKOV_HEAD_TYPES = ("vanilla",)
_DSPARK_ONLY_FIELDS = ("markov_rank", "markov_head_type", "enable_confidence_head", "draft_vocab_size")


def check_variant(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    """The variant `architectures` names (the class an engine builds) against the config and weights:
    a DSpark export relabelled DFlashDraftModel is served without its Markov head, a DFlash one
    labelled DSpark has none to serve, an unknown Markov head type is served as another."""
    from draftsmith.model.config import DSPARK_ARCHITECTURE

    raw = export.raw
    named = raw.get("architectures")
    dspark_weights = sorted(n for n in export.shapes if n.startswith(("markov_head.", "confidence_head.")))
    dspark_fields = [f for f in _DSPARK_ONLY_FIELDS if f in raw]
    labels = f"['DFlashDraftModel'] or ['{DSPARK_ARCHITECTURE}']"
    if export.variant is None:
        wanted = f"['{DSPARK_ARCHITECTURE}'] (the weights hold a Markov head)" if dspark_weights else labels
        return [_finding("variant", "architectures", repr(named), wanted,
                         "engines pick the drafter's class by this field; restore the one it was exported with")]
    found = []
    if not isinstance(named, list):
        found.append(_finding("variant", "architectures", f"{named!r} (a string)", f"a list, [{named!r}]",
                              "transformers and engines read a list of class names; write it as a list", "warning"))
    if export.variant == "dflash" and (dspark_weights or dspark_fields):
        held = (f"model.safetensors holds {', '.join(dspark_weights[:3])}" if dspark_weights
                else f"config.json sets {', '.join(dspark_fields)}")
        found.append(_finding("variant", "architectures", repr(named), f"['{DSPARK_ARCHITECTURE}'] ({held})",
                              "an engine serves DFlashDraftModel without the Markov and confidence heads, drafting "
                              f"with a model it was not trained as; set architectures to ['{DSPARK_ARCHITECTURE}']"))
    if export.variant == "dspark":
        head = raw.get("markov_head_type", "vanilla")
        if head not in MARKOV_HEAD_TYPES:
            found.append(_finding("variant", "markov_head_type", repr(head), " or ".join(map(repr, MARKOV_HEAD_TYPES)),
                                  "no engine and not draftsmith builds another Markov head; restore the type it was "
                                  "trained with"))
        if not any(name.startswith("markov_head.") for name in dspark_weights) and "markov_rank" not in raw:
            found.append(_finding("variant", "architectures", repr(named), "['DFlashDraftModel'] (no Markov head in "
                                  "config.json or model.safetensors)", "a DFlash export was relabelled; restore "
                                  "['DFlashDraftModel']"))
    return found


def check_finite(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    """Every tensor of every weight file (and the mask vector) read whole and checked for NaN and Inf:
    shapes, dtypes and parity on a few logits all pass a drafter with a NaN in a head it rarely uses."""
    from safetensors import safe_open

    from draftsmith.model.io import MASK_EMBEDDING_NAME, nonfinite_description, read_mask_embedding_file

    found = []
    for file in export.files:
        with safe_open(str(file), framework="pt") as handle:
            for name in sorted(handle.keys()):
                if export.dtypes.get(name) not in _FLOAT_DTYPES:
                    continue
                description = nonfinite_description(handle.get_tensor(name))
                if description:
                    found.append(_finding("finite", name, f"non-finite ({description})", "finite values",
                                          "the weights are broken (a diverged run or a damaged copy); re-export from "
                                          "a finite training checkpoint"))
    mask_file = export.path / MASK_EMBEDDING_NAME
    if mask_file.is_file():
        try:
            _, embedding = read_mask_embedding_file(mask_file)
        except InputError:
            embedding = None  # the mask check names an unreadable file
        description = nonfinite_description(embedding) if embedding is not None else None
        if description:
            found.append(_finding("finite", MASK_EMBEDDING_NAME, f"non-finite ({description})", "finite values",
                                  "re-export from a finite training checkpoint"))
    return found


def check_dspark(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    """A DSpark export as vLLM's qwen3_dspark.py loads it: Markov rank and vocabulary sizes against the
    target and the weights, the confidence head's flag against its weights, and no mask_embedding.pt."""
    if not _is_dspark(export):
        return []
    raw, vocab = export.raw, int(getattr(target.config, "vocab_size", 0) or 0)
    rank = raw.get("markov_rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= max(vocab, 1):
        return [_finding("dspark", "markov_rank", rank, f"an integer in 1..{vocab} (the target's vocabulary)",
                         "restore the Markov rank the drafter was trained with")]
    found = []
    draft_vocab = raw.get("draft_vocab_size") or raw.get("vocab_size")
    if draft_vocab != vocab:
        found.append(_finding("dspark", "draft_vocab_size", draft_vocab, f"{vocab} (the target's vocabulary)",
                              "draftsmith trains full-vocabulary DSpark drafters; a smaller draft vocabulary needs its own "
                              "lm_head and d2t tensors, which vLLM refuses to load without"))
    wanted = {"markov_head.markov_w1.weight": (raw.get("vocab_size"), rank), "markov_head.markov_w2.weight": (draft_vocab, rank)}
    with_markov = bool(raw.get("confidence_head_with_markov", False))
    if raw.get("enable_confidence_head", False):
        wanted["confidence_head.proj.weight"] = (1, int(raw.get("hidden_size") or 0) + (rank if with_markov else 0))
        wanted["confidence_head.proj.bias"] = (1,)
    elif any(name.startswith("confidence_head.") for name in export.shapes):
        found.append(_finding("dspark", "enable_confidence_head", raw.get("enable_confidence_head"),
                              "true (model.safetensors holds confidence_head weights)",
                              "vLLM drops the head's weights unless the flag is on; set it as trained"))
    for name, shape in wanted.items():
        if name not in export.shapes:
            found.append(_finding("dspark", name, "missing", list(shape), "re-export the drafter with `draftsmith export`"))
        elif tuple(export.shapes[name]) != tuple(shape):
            found.append(_finding("dspark", f"{name} shape", list(export.shapes[name]), list(shape),
                                  "the weights belong to another config; restore it"))
    if export.flash.get("mask_token_source") == "drafter_embedding":
        found.append(_finding("dspark", "dflash_config.mask_token_source", "drafter_embedding",
                              "a mask id with its own vocabulary row", "vLLM's DSpark ignores mask_embedding.pt and "
                              "feeds the target's row; retrain with a --mask-token-id that has a spare row"))
    return found


# Published DFlash drafters use blocks of 8 to 16; far past this no engine drafts, and a block is
# allocated whole by the parity run (a 10^9 block asked for 512 GB).
MAX_BLOCK_SIZE = 1024


def check_block_size(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    top, nested = export.raw.get("block_size"), export.flash.get("block_size")
    block = nested if nested is not None else top
    if not isinstance(block, int) or isinstance(block, bool) or not 2 <= block <= MAX_BLOCK_SIZE:
        return [_finding("block", "block_size", block, f"an integer in 2..{MAX_BLOCK_SIZE}",
                         "restore the block size it was trained with")]
    if _is_dspark(export):
        return _dspark_block(block, export, config)
    found = []
    if top is not None and nested is not None and top != nested:
        found.append(_finding("block", "block_size", f"{top} (top level) vs {nested} (dflash_config)", "one value",
                              "engines read different fields; set both to the trained block size"))
    readme = export.readme or ""
    card = re.search(r'"num_speculative_tokens":\s*(\d+)', readme)
    if card and int(card.group(1)) != block - 1:
        found.append(_finding(
            "block", "block_size", block, f"{int(card.group(1)) + 1} (the export's README serves "
            f"num_speculative_tokens {card.group(1)})",
            "config.json was edited after export; restore the block size the drafter was trained with"))
    steps = config.num_speculative_tokens
    if steps is not None and steps != block - 1:
        found.append(_finding(
            "block", "vLLM num_speculative_tokens", steps, f"{block - 1} (block_size - 1)",
            f"serve with num_speculative_tokens {block - 1}; vLLM accepts more without complaint but the drafter "
            f"never drafted past position {block - 1}" if steps > block - 1 else
            "fewer verifies less per step; fine if meant", "error" if steps > block - 1 else "warning"))
    drafts = config.sglang_draft_tokens
    if drafts is not None and drafts != block:
        found.append(_finding(
            "block", "SGLang --speculative-num-draft-tokens", drafts, f"{block} (block_size)",
            f"serve with --speculative-num-draft-tokens {block}", "error" if drafts > block else "warning"))
    return found


def _dspark_block(block: int, export: ExportView, config: CheckConfig) -> list[Finding]:
    """DSpark drafts from the anchor: a block of B queries drafts B tokens, num_speculative_tokens = B."""
    found = []
    card = re.search(r'"num_speculative_tokens":\s*(\d+)', export.readme or "")
    if card and int(card.group(1)) != block:
        found.append(_finding("block", "block_size", block, f"{card.group(1)} (the export's README serves "
                              f"num_speculative_tokens {card.group(1)})",
                              "config.json was edited after export; restore the block size the drafter was trained with"))
    steps = config.num_speculative_tokens
    if steps is not None and steps != block:
        found.append(_finding(
            "block", "vLLM num_speculative_tokens", steps, f"{block} (block_size: DSpark drafts from the anchor)",
            f"serve with num_speculative_tokens {block}; the drafter never drafted past position {block}" if steps > block
            else "fewer verifies less per step; fine if meant", "error" if steps > block else "warning"))
    if config.sglang_draft_tokens is not None:
        found.append(_finding("block", "SGLang --speculative-num-draft-tokens", config.sglang_draft_tokens,
                              "not applicable", "SGLang serves no DSpark drafter; serve it with vLLM's dspark method",
                              "warning"))
    return found


def template_sha256(text: str) -> str:
    """The template hash tokenize records: sha256 of the chat template's UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _serving_template(target: TargetView, config: CheckConfig) -> tuple[str | None, str]:
    if config.chat_template is not None:
        try:
            return config.chat_template.read_text(encoding="utf-8"), str(config.chat_template)
        except (OSError, UnicodeDecodeError) as error:
            raise InputError(f"{config.chat_template}: cannot read the chat template ({error})") from None
    tokenizer = target.tokenizer
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if isinstance(template, dict):  # the rule tokenize hashes by: "default", else the first one
        template = template.get("default", next(iter(template.values()), None))
    return template, "the target tokenizer's"


def check_template(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    record = export.flash.get("template")
    if not isinstance(record, dict):
        return [_finding("template", "dflash_config.template", "not recorded", '{"sha256", "kwargs"} of training',
                         "retrain with this draftsmith (tokenize records it, train and export carry it)", "note")]
    found = []
    text, source = _serving_template(target, config)
    if text is not None and record.get("sha256") and template_sha256(text) != record["sha256"]:
        found.append(_finding("template", "chat template sha256", f"{template_sha256(text)[:12]}... ({source})",
                              f"{str(record['sha256'])[:12]}... (the template the drafter was trained on)",
                              "serve with the training template (the engine's --chat-template) or retrain", "warning"))
    trained = record.get("kwargs") or {}
    serving = config.template_kwargs or {}
    for key in sorted(set(trained) | set(serving)):
        if trained.get(key) != serving.get(key):
            why = (" (thinking on in training and off in serving, or the reverse: acceptance 25% vs 60% seen)"
                   if key == "enable_thinking" else "")
            found.append(_finding("template", f"chat_template_kwargs.{key}",
                                  f"{serving.get(key, 'unset')} when serving", f"{trained.get(key, 'unset')} (training)",
                                  f"send chat_template_kwargs {{{key!r}: {trained.get(key)!r}}}{why}", "warning"))
    return found


CHECKS: dict[str, Callable[[ExportView, TargetView, CheckConfig], list[Finding]]] = {
    "variant": check_variant,
    "finite": check_finite,
    "layers": check_layers,
    "feature": check_feature_definition,
    "mask": check_mask_token,
    "heads": check_heads,
    "rope": check_rope,
    "sliding_window": check_sliding_window,
    "shapes": check_shapes,
    "block": check_block_size,
    "dspark": check_dspark,
    "dtypes": check_dtypes,
    "template": check_template,
}


def static_findings(export: ExportView, target: TargetView, config: CheckConfig) -> list[Finding]:
    findings: list[Finding] = []
    for check in CHECKS.values():
        findings += check(export, target, config)
    return findings

