"""Which installed engine serves which drafter on which target family: asked of the engines themselves."""

from __future__ import annotations

import pytest

from draftsmith.model.engine_install import EngineNotInstalled, llama_server_binary, vllm_python
from draftsmith.model.engine_support import _converter_classes, engine_support, llama_cpp_support, vllm_support


def _needs(locate) -> None:
    try:
        locate()
    except EngineNotInstalled as error:
        pytest.skip(str(error))


def test_vllm_names_a_gemma3_target_it_cannot_serve_and_a_qwen3_one_it_can():
    _needs(vllm_python)
    gemma = vllm_support(["Gemma3ForCausalLM"], "dflash")
    assert gemma.status == "no" and "EAGLE3 interface" in gemma.detail, gemma
    assert gemma.engine.startswith("vLLM 0.")
    for kind in ("dflash", "dspark"):
        qwen = vllm_support(["Qwen3ForCausalLM"], kind)
        assert qwen.status == "yes", qwen
    unknown = vllm_support(["NoSuchModelForCausalLM"], "dflash")
    assert unknown.status == "no" and "has no NoSuchModelForCausalLM" in unknown.detail


def test_llama_cpp_reads_its_spec_types_converter_and_graphs():
    _needs(llama_server_binary)
    from draftsmith.model.engine_install import llama_convert_script

    converter = _converter_classes(llama_convert_script().parent)
    assert converter["Qwen3ForCausalLM"] == "qwen3" and converter["Gemma3ForCausalLM"] == "gemma3"
    assert "DFlashDraftModel" in converter
    assert llama_cpp_support(["Qwen3ForCausalLM"], "dflash").status == "yes"
    gemma = llama_cpp_support(["Gemma3ForCausalLM"], "dflash")
    assert gemma.status == "no" and "layer inputs" in gemma.detail, gemma


def test_an_engine_not_installed_is_unknown_with_its_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_ENGINES_DIR", str(tmp_path))
    for name in ("DRAFTSMITH_VLLM_PYTHON", "DRAFTSMITH_LLAMA_SERVER", "DRAFTSMITH_LLAMA_CONVERT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no llama-server on PATH either
    supports = engine_support(["Qwen3ForCausalLM"], "dflash")
    assert [s.status for s in supports] == ["unknown", "unknown"]
    assert "engines/install_vllm.sh" in supports[0].line() and "engines/build_llama_server.sh" in supports[1].line()
