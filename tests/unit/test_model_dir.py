"""model.bin's index read without its weights, and the directory checks built on it."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from asr_server.engine.model_dir import (
    DecoderShape,
    ModelDirError,
    check_model_dir,
    read_decoder_shape,
)
from tests.unit.test_models import tiny_dir


def test_the_decoder_shape_of_tiny_en() -> None:
    # tiny: 4 decoder layers of 6 heads; English-only Whisper scores 51,864 tokens
    assert read_decoder_shape(tiny_dir() / "model.bin") == DecoderShape(4, 6, 51_864)


def test_a_truncated_model_bin_is_refused_naming_it(tmp_path: Path) -> None:
    local = tmp_path / "my-model"
    local.mkdir()
    for f in tiny_dir().iterdir():
        (local / f.name).symlink_to(f)
    check_model_dir(local)
    (local / "model.bin").unlink()
    with open(tiny_dir() / "model.bin", "rb") as f:
        (local / "model.bin").write_bytes(f.read(2_000_000))  # ends inside a weight
    with pytest.raises(ModelDirError, match=r"model\.bin is not a CTranslate2 Whisper model, or"):
        check_model_dir(local)
    (local / "model.bin").write_bytes(b"\x06\x00\x00\x00\x05")  # ends inside the index
    with pytest.raises(ModelDirError, match=r"truncated: the file ends inside its index"):
        check_model_dir(local)


def test_a_model_bin_of_a_version_it_does_not_know_is_left_to_ctranslate2(
    tmp_path: Path,
) -> None:
    """CTranslate2 refuses a version it does not know itself, with its own error."""
    path = tmp_path / "model.bin"
    path.write_bytes(struct.pack("<I", 99) + b"\0" * 64)
    assert read_decoder_shape(path) is None


def test_another_models_index_has_no_whisper_decoder(tmp_path: Path) -> None:
    """A version-6 file of a spec without a decoder (as CTranslate2 writes other models)."""
    name = b"encoder/num_heads\0"
    body = struct.pack("<H", len(name)) + name + struct.pack("<BBI", 0, 2, 2) + b"\x06\x00"
    spec = b"EncoderSpec\0"
    path = tmp_path / "model.bin"
    path.write_bytes(
        struct.pack("<I", 6) + struct.pack("<H", len(spec)) + spec + struct.pack("<II", 1, 1) + body
    )
    with pytest.raises(ModelDirError, match="no Whisper decoder"):
        read_decoder_shape(path)


def test_a_damaged_count_fails_at_once(tmp_path: Path) -> None:
    """A huge count with zeros after it was read as millions of empty variables: half a
    minute for 80 MB, minutes for a large model."""
    spec = b"WhisperSpec\0"
    header = struct.pack("<I", 6) + struct.pack("<H", len(spec)) + spec + struct.pack("<I", 3)
    path = tmp_path / "model.bin"
    path.write_bytes(header + struct.pack("<I", 4_000_000_000) + bytes(8_000_000))
    with pytest.raises(ModelDirError, match="counts 4000000000 variables, more than the file"):
        read_decoder_shape(path)
    path.write_bytes(header + struct.pack("<I", 800_000) + bytes(8_000_000))
    with pytest.raises(ModelDirError, match="a variable without a name at byte 28"):
        read_decoder_shape(path)
