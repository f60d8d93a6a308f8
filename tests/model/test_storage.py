import json

import pytest

from draftsmith.core.errors import InputError
from draftsmith.model.storage import StorageEstimate, estimate_hidden_state_storage, read_model_shape


def test_the_27b_story_by_hand():
    # 27B-class target: hidden 5120, bf16 (2 bytes), DFlash's 5 captured layers.
    # bytes per token = 5 * 5120 * 2 = 51,200.
    # 914,000 samples x 3,000 tokens (prompt + 2,500-token completion) = 2,742,000,000 tokens
    # -> 2,742,000,000 * 51,200 = 140,390,400,000,000 bytes = 140.4 TB.
    estimate = estimate_hidden_state_storage(5120, 5, 914_000 * 3_000, 914_000)
    assert isinstance(estimate, StorageEstimate)
    assert estimate.bytes_per_token == 51_200
    assert estimate.total_bytes == 140_390_400_000_000
    assert estimate.bytes_per_sample == pytest.approx(3_000 * 51_200)  # 153.6 MB per sample
    assert estimate.recommendation == "online"
    assert "assumed" in estimate.reason

    # The "~90 TB" of the story is what ~2,000 tokens per sample with 5 layers gives
    # (914,000 * 2,000 * 51,200 = 93,593,600,000,000 B = 93.6 TB = 85.1 TiB), or, the same bytes,
    # EAGLE-3-style 4 stored states (3 auxiliary + last) over 2,500 output tokens: 914,000 * 2,500 * 4 * 5120 * 2.
    five_layers = estimate_hidden_state_storage(5120, 5, 914_000 * 2_000, 914_000, disk_bytes=90 * 10**12)
    four_layers = estimate_hidden_state_storage(5120, 4, 914_000 * 2_500, 914_000, disk_bytes=90 * 10**12)
    assert five_layers.total_bytes == four_layers.total_bytes == 93_593_600_000_000
    assert five_layers.recommendation == "online"  # more than the 90 TB disk, let alone 80% of it
    assert "93.6 TB" in five_layers.summary() and "online" in five_layers.summary()


def test_small_job_fits_offline():
    # hidden 128, 4 layers, fp32: 128*4*4 = 2,048 B/token; 1,000 samples x 600 tokens = 1,228,800,000 B.
    estimate = estimate_hidden_state_storage(128, 4, 600_000, 1_000, dtype="float32", disk_bytes=2 * 2**40)
    assert estimate.bytes_per_token == 2_048
    assert estimate.total_bytes == 1_228_800_000
    assert estimate.bytes_per_sample == 1_228_800
    assert estimate.recommendation == "offline"
    assert estimate.reason
    assert "offline" in estimate.summary()


def test_usable_fraction_decides_the_edge():
    # 100 tokens * 1 layer * 10 hidden * 2 B = 2,000 B; a 2,400 B disk has 1,920 usable -> online.
    assert estimate_hidden_state_storage(10, 1, 100, 1, disk_bytes=2_400).recommendation == "online"
    assert estimate_hidden_state_storage(10, 1, 100, 1, disk_bytes=2_500).recommendation == "offline"


@pytest.mark.parametrize("dtype, width", [("bf16", 2), ("float16", 2), ("torch.bfloat16", 2), ("fp32", 4), ("fp8", 1)])
def test_dtypes(dtype, width):
    assert estimate_hidden_state_storage(8, 1, 1, 1, dtype=dtype).bytes_per_token == 8 * width


def test_bad_storage_inputs():
    with pytest.raises(InputError, match="unknown dtype 'int3'"):
        estimate_hidden_state_storage(8, 1, 1, 1, dtype="int3")
    with pytest.raises(InputError, match="hidden_size must be a positive integer"):
        estimate_hidden_state_storage(-8, 1, 1, 1)
    with pytest.raises(InputError, match="total_tokens"):
        estimate_hidden_state_storage(8, 1, -1, 1)


def test_read_model_shape(tmp_path, tiny_target_dir):
    assert read_model_shape(tiny_target_dir / "config.json") == (128, 4)
    assert read_model_shape(tiny_target_dir) == (128, 4)
    nested = tmp_path / "config.json"
    nested.write_text(json.dumps({"model_type": "gemma3", "text_config": {"hidden_size": 5376, "num_hidden_layers": 62}}))
    assert read_model_shape(nested) == (5376, 62)
    nested.write_text(json.dumps({"model_type": "x"}))
    with pytest.raises(InputError, match="no positive integer hidden_size"):
        read_model_shape(nested)
    with pytest.raises(InputError, match="no such model config"):
        read_model_shape(tmp_path / "missing")
