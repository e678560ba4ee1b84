"""Checks of a Whisper model directory in CTranslate2's format, before CTranslate2 loads it.

CTranslate2 trusts the directory's files: an alignment head naming a layer the model
lacks, a token id past the vocabulary, or a config.json without Whisper's keys crashed
the process (a segmentation fault) in the first decode, the check at load; a vocabulary
of another size loaded, passed that check, and decoded garbage. Each is refused here
with the file named.

The decoder's shape is read from model.bin's index without its weights: CTranslate2's
serialisation (``ModelSpec._serialize``, binary versions 4 to 6; Whisper came to
CTranslate2 after version 4) is a version, the spec's name and revision, then each
variable's name, rank, dimensions, type and byte count before its bytes, which are
skipped.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

#: the files faster-whisper needs (a vocabulary.json or vocabulary.txt besides)
REQUIRED_FILES = ("model.bin", "config.json", "tokenizer.json")
#: what CTranslate2's Whisper converter writes to config.json, each a list, and what
#: faster-whisper reads of it
WHISPER_CONFIG_KEYS = ("alignment_heads", "lang_ids", "suppress_ids", "suppress_ids_begin")


class ModelDirError(ValueError):
    """The directory cannot be used; the message names the file."""


def check_model_dir(path: Path) -> None:
    """The files are there, their JSON parses, and config.json and the vocabulary fit
    model.bin's decoder."""
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise ModelDirError(f"missing {', '.join(missing)} in {path}")
    config = _read_json(path / "config.json")
    _read_json(path / "tokenizer.json")
    if not isinstance(config, dict):
        raise ModelDirError(f"{path / 'config.json'} is not a JSON object")
    _check_whisper_keys(path / "config.json", config)
    try:
        shape = read_decoder_shape(path / "model.bin")
    except (OSError, ModelDirError) as exc:
        raise ModelDirError(
            f"{path / 'model.bin'} is not a CTranslate2 Whisper model, or it is truncated: {exc}"
        ) from None
    _check_token_ids(path, config, shape)
    if shape is not None:
        _check_alignment_heads(path / "config.json", config["alignment_heads"], shape)


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise ModelDirError(f"{path} is not valid JSON: {exc}") from exc


def _check_whisper_keys(path: Path, config: dict[str, object]) -> None:
    """config.json has Whisper's keys, each a list."""
    missing = [k for k in WHISPER_CONFIG_KEYS if not isinstance(config.get(k), list)]
    if missing:
        raise ModelDirError(
            f"{path} lacks Whisper's {', '.join(missing)}: not a Whisper model "
            "in CTranslate2's format, or the file is damaged"
        )


def _check_token_ids(path: Path, config: dict[str, object], shape: DecoderShape | None) -> None:
    """The vocabulary holds every token id config.json names (languages, suppressed
    tokens), and as many tokens as the decoder scores."""
    ids = [
        token
        for key in ("lang_ids", "suppress_ids", "suppress_ids_begin")
        for token in config[key]  # type: ignore[attr-defined]
    ]
    if not all(isinstance(token, int) and token >= 0 for token in ids):
        bad = next(t for t in ids if not isinstance(t, int) or t < 0)
        raise ModelDirError(f"{path / 'config.json'} names token {bad!r}: not a token id")
    for name in ("vocabulary.json", "vocabulary.txt"):
        vocabulary = path / name
        if not vocabulary.is_file():
            continue
        try:
            text = vocabulary.read_text(encoding="utf-8")
            entries = len(json.loads(text)) if name.endswith(".json") else len(text.splitlines())
        except (OSError, ValueError, TypeError) as exc:
            raise ModelDirError(f"{vocabulary} cannot be read: {exc}") from exc
        if ids and max(ids) >= entries:
            raise ModelDirError(
                f"{vocabulary} has {entries} entries, but config.json names token "
                f"{max(ids)}: the vocabulary is truncated or from another model"
            )
        if shape is not None and entries != shape.outputs:
            raise ModelDirError(
                f"{vocabulary} has {entries} entries, but model.bin's decoder scores "
                f"{shape.outputs} tokens: the vocabulary is from another model"
            )
        return


def _check_alignment_heads(path: Path, heads: list[object], shape: DecoderShape) -> None:
    """Each alignment head is a [layer, head] of the decoder (word times read them)."""
    for pair in heads:
        fits = (
            isinstance(pair, list)
            and len(pair) == 2
            and all(isinstance(n, int) for n in pair)
            and 0 <= pair[0] < shape.layers
            and 0 <= pair[1] < shape.heads
        )
        if not fits:
            raise ModelDirError(
                f"{path} names the alignment head {pair!r}, but model.bin's decoder has "
                f"{shape.layers} layers of {shape.heads} heads: the file is from another "
                "model or damaged"
            )


#: the binary versions whose index this reader knows (CTranslate2 refuses newer ones itself)
KNOWN_VERSIONS = range(4, 7)
#: a variable's fewest bytes in the index: a name's length and one character, its rank,
#: type and byte count
_SMALLEST_VARIABLE = 2 + 1 + 1 + 1 + 4
_LAYER = re.compile(r"^decoder/layer_(\d+)/")


@dataclass(frozen=True)
class DecoderShape:
    layers: int
    heads: int
    #: how many tokens the decoder scores: the vocabulary's size
    outputs: int


def read_decoder_shape(path: Path) -> DecoderShape | None:
    """The decoder's shape, or None for a binary version this reader does not know."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        (version,) = _unpack(f, "<I")
        if version not in KNOWN_VERSIONS:
            return None
        _string(f)  # the spec's name
        _unpack(f, "<I")  # its revision
        (count,) = _unpack(f, "<I")
        if count > size // _SMALLEST_VARIABLE:  # (a damaged count: it ran for minutes)
            raise ModelDirError(f"its index counts {count} variables, more than the file holds")
        layers: set[int] = set()
        heads = outputs = None
        for _ in range(count):
            name = _string(f)
            if not name:  # CTranslate2 names every variable: zeros where the index was
                raise ModelDirError(f"a variable without a name at byte {f.tell()}")
            (rank,) = _unpack(f, "<B")
            shape = _unpack(f, f"<{rank}I")
            _type, num_bytes = _unpack(f, "<BI")
            if f.tell() + num_bytes > size:
                raise ModelDirError(f"{name} runs past the end of the file")
            if name == "decoder/num_heads" and num_bytes <= 8:  # an integer scalar
                heads = int.from_bytes(f.read(num_bytes), "little", signed=True)
                continue
            if name == "decoder/embeddings/weight" and rank == 2:
                outputs = outputs or shape[0]
            elif name == "decoder/projection/weight" and rank == 2:
                outputs = shape[0]  # the output layer, where it is not the embeddings
            elif match := _LAYER.match(name):
                layers.add(int(match[1]))
            f.seek(num_bytes, 1)
    if not layers or heads is None or outputs is None:
        raise ModelDirError("it has no Whisper decoder (its layers, heads or embeddings)")
    return DecoderShape(len(layers), heads, outputs)


def _unpack(f: BinaryIO, fmt: str) -> tuple[int, ...]:
    want = struct.calcsize(fmt)
    data = f.read(want)
    if len(data) != want:
        raise ModelDirError("the file ends inside its index")
    return struct.unpack(fmt, data)


def _string(f: BinaryIO) -> str:
    (length,) = _unpack(f, "<H")
    data = f.read(length)
    if len(data) != length:
        raise ModelDirError("the file ends inside its index")
    return data.rstrip(b"\0").decode("utf-8", "replace")
