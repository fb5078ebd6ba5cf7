"""What a text run holds out, and what it may hand a teacher: the seeded split of the examples,
validation from other files (``data.val_files``), and the documents no held-out example touches.

- **The split** (:func:`split_order`): a seeded permutation of the examples, its first
  ``val_fraction`` validation (one at least, never all), the same on every machine.
- **``data.val_files``**: validation is the split a run on those files holds out, training every
  example of ``data.files``; a file in both is refused (:func:`val_files_errors`), a document in
  both left out of training (:func:`without_validation_text`).
- **Untouched documents** (:func:`untouched_documents`): packed, a document spans blocks, and
  one of them may be held out; the documents none of whose blocks is are the ones a teacher may
  continue for a training file (``generate.prompts=train_split`` on ``data=text``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Container, Iterable
from pathlib import Path
from typing import Any

import torch

from lightning_kd.data.dataset_source import DatasetSource
from lightning_kd.data.domains import members
from lightning_kd.data.errors import DataError
from lightning_kd.data.reading import expand_files, prompt_lines
from lightning_kd.models.cache_places import remembered_file_digest
from lightning_kd.utils.refusal import refuse


def seeded_order(items: list, seed: int) -> list:
    """``items`` in the permutation ``seed`` draws (the same on every machine)."""
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed))
    return [items[i] for i in order.tolist()]


def split_order(count: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """The indices of the validation and of the training examples among ``count``: a seeded
    permutation, its first ``val_fraction`` held out (one at least, never all)."""
    order = seeded_order(list(range(count)), seed)
    val_count = min(max(1, round(val_fraction * count)), count - 1)
    return order[:val_count], order[val_count:]


def untouched_documents(
    token_lists: list[list[int]],
    held: set[int],
    block_size: int,
    pack: bool,
    groups: list[list[int]] | None = None,
    counts: list[int] | None = None,
) -> list[int]:
    """The indices of the documents (``token_lists``, in reading order) no held-out example
    (``held``) holds a token of. ``groups`` (``data.domains``): the documents' indices made into
    examples group by group, ``counts`` examples each, each group's after the one before."""
    if groups is None or counts is None:
        return group_untouched(token_lists, held, block_size, pack)
    kept, offset = [], 0
    for group, count in zip(groups, counts, strict=True):
        local = {index - offset for index in held if offset <= index < offset + count}
        found = group_untouched([token_lists[i] for i in group], local, block_size, pack)
        kept += [group[i] for i in found]
        offset += count
    return sorted(kept)


def untouched_of(data: Any, documents: list[tuple[str, str]], labelled: list) -> list:
    """``documents`` (``labelled``: as ``data``, a text data module, reads them) no example of
    the split ``data`` makes of them holds a token of, in reading order."""
    tokens = [ids for _, ids in labelled]
    groups = members(data.domains, [label for label, _ in labelled])
    counts = [len(data.examples([tokens[i] for i in group], needed=0)) for group in groups]
    held, _ = split_order(sum(counts), data.val_fraction, data.split_seed)
    kept = untouched_documents(tokens, set(held), data.block_size, data.pack, groups, counts)
    return [documents[index] for index in kept]


def group_untouched(
    token_lists: list[list[int]], held: set[int], block_size: int, pack: bool
) -> list[int]:
    """:func:`untouched_documents` of documents made into examples together: packed (joined
    with a separator, cut into ``block_size`` blocks), none of the blocks a document spans is
    held; unpacked, its own example (of two tokens or more) is not."""
    if not pack:
        examples = [index for index, ids in enumerate(token_lists) if len(ids) >= 2]
        return [index for number, index in enumerate(examples) if number not in held]
    kept, start = [], 0
    for index, ids in enumerate(token_lists):
        blocks = range(start // block_size, (start + len(ids) - 1) // block_size + 1)
        if ids and held.isdisjoint(blocks):
            kept.append(index)
        start += len(ids) + 1  # and its separator
    return kept


def without_validation_text(train: list[str], validation: list[str]) -> list[str]:
    """``train`` without the documents ``validation`` holds too, whitespace aside (a ``.txt``
    file's text ends in a newline its ``.jsonl`` row has not: it stayed in training, probe 46),
    with a warning saying how many."""
    seen = {words(text) for text in validation}
    kept = [text for text in train if words(text) not in seen]
    if len(kept) < len(train):
        warnings.warn(
            f"data: left {len(train) - len(kept)} document(s) of data.files out of training: "
            "data.val_files holds the same text (whitespace aside)",
            stacklevel=2,
        )
    return kept


def outside(found: Iterable[tuple[str, Any]], held: Container[str], source, chat=False) -> list:
    """The items of ``found`` (``(key, item)`` of ``source``'s training split) whose key
    ``held`` (its ``val_split``'s) has not, with a warning counting those left out (``chat``:
    conversations, keyed by opening). ``data.dataset.val_split`` left them out unsaid, where
    ``data.val_files`` said it (probe 46)."""
    kept, left = [], 0
    for key, item in found:
        left += key in held
        if key not in held:
            kept.append(item)
    if left:
        noun, holds = ("conversation(s)", "their openings") if chat else ("document(s)", "them")
        warnings.warn(
            f"data: left {left} {noun} of data.dataset.split={source.split!r} out of "
            f"training: data.dataset.val_split={source.val_split!r} holds {holds} too",
            stacklevel=2,
        )
    return kept


def words(text: str) -> str:
    """``text`` with each run of whitespace one space, none at its ends."""
    return " ".join(text.split())


def val_files_errors(
    val_files: Any, dataset: DatasetSource, streaming: bool, chat: bool = False
) -> list[str]:
    """``data.val_files`` settings that cannot be (``chat``: with ``data=chat``), each with its
    fix."""
    if val_files is None:
        return []
    if not val_files:
        return ["data.val_files is empty; list files (data.val_files=[python_reference]), or null"]
    if chat:
        return [
            f"data.val_files={list(val_files)!r} with data=chat: chat data is validated on the "
            "conversations it holds out of its own; set data.val_files=null"
        ]
    if dataset.given or streaming:
        return [
            f"data.val_files={list(val_files)!r} with data.dataset: a dataset is validated on "
            "its data.dataset.val_split (or a split of it); drop one"
        ]
    return []


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file, or two files of identical bytes."""
    if a.resolve() == b.resolve():
        return True
    digest = remembered_file_digest
    return a.stat().st_size == b.stat().st_size and digest(a) == digest(b)


def shared_files_errors(files: list[Path], val_files: list[Path]) -> list[str]:
    """A file in both ``data.files`` and ``data.val_files``: its held-out text would be trained
    on (every example of ``data.files`` is)."""
    shared = [path for path in val_files if any(same_file(path, other) for other in files)]
    return [
        f"data.val_files names {path}, which data.files names too: a run with data.val_files "
        "trains on every document of data.files, its validation text included; drop it from "
        "data.files (or set data.val_files=null to hold validation out of data.files)"
        for path in shared
    ]


def checked_val_files(
    val_files: Any, files: list[Path], dataset: DatasetSource, streaming: bool
) -> list[Path] | None:
    """The files ``data.val_files`` names (None: unset), refused where they cannot be: with a
    dataset or a stream, empty, or naming a file of ``files`` (``data.files``)."""
    refuse(val_files_errors(val_files, dataset, streaming))
    if val_files is None:
        return None
    found = expand_files(val_files, "data.val_files")
    refuse(shared_files_errors(files, found))
    return found


def documents_errors(dataset: DatasetSource, val_files: list[Path] | None) -> list[str]:
    """Why the training documents cannot be told apart (they are read from ``data.files``)."""
    if not (dataset.given or val_files is not None):
        return []
    which = "data.dataset" if dataset.given else "data.val_files"
    return [
        f"the training documents of data=text (those of data.files no validation block holds a "
        f"token of) are told apart only without {which}: drop {which} here (the split then "
        "holds out part of data.files, whose other documents are prompts), or write the "
        "documents one a row to a .jsonl named in data.files"
    ]


def leaked_prompt_errors(
    files: list[Path], val_places: set[str], untouched: Callable[[], list[tuple[str, str]]]
) -> list[str]:
    """Why rows of ``files`` that continue documents (``generate``'s ``prompt_line``) would
    train on validation text: documents of ``data.val_files`` (``val_places``) that this run's
    split holds out (not among ``untouched()``'s), which another split let ``generate`` continue."""
    if not (prompts := prompt_lines(files)):
        return []
    leaked = sorted(prompts & (val_places - {place for place, _ in untouched()}))
    if not leaked:
        return []
    named = ", ".join(leaked[:3]) + (", ..." if len(leaked) > 3 else "")
    return [
        f"{len(leaked)} document(s) the rows of data.files continue are held out by this run's "
        f"split of data.val_files ({named}): the rows were generated under other data settings "
        "(data.split_seed, data.val_fraction, data.block_size, data.pack or the student's "
        "tokenizer), and would train on validation text; train with the settings they were "
        "generated with, or generate them again with this run's "
        "(lightning-kd generate generate.prompts=train_split)"
    ]


def check_sizes(block_size: int, val_fraction: float, max_train_examples: int | None) -> None:
    """Refuse sizes no split or block can have."""
    if block_size < 2:
        raise DataError(f"data.block_size={block_size}; a block needs at least 2 tokens")
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"data.val_fraction={val_fraction} must lie strictly between 0 and 1")
    if max_train_examples is not None and max_train_examples < 1:
        raise DataError(
            f"data.max_train_examples={max_train_examples}; use a count ≥ 1, or null for all"
        )
