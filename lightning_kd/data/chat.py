"""Chat data: conversations rendered with the tokenizer's chat template, the answers alone scored.

``data=chat`` reads rows of either form, from ``.jsonl`` files (optionally gzipped,
``data.files``) or from the columns of a ``data.dataset`` (read whole or streamed):

- ``{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": ...}]}``
- ``{"prompt": "...", "completion": "..."}`` (each may also be a list of messages, TRL's
  conversational form; a string prompt is the user's turn, a string completion the assistant's)

Each conversation is rendered and labelled by ``chat_tokens.py``: every token outside an
assistant turn is −100, so the KD, CE and feature terms score the answers alone. A dataset's rows
are rendered once and cached for later runs (``tokenized.py``).

Conversations are split into training and validation by their opening (the turns before the
first answer, system messages aside) before packing, so none straddles the two and a held-out
prompt is never trained on, nor a held-out answer as a longer conversation's first
(``data.dataset.val_split``: its openings are left out of training; streamed: those of the
validation rows held out first).
``pack=true`` joins them into blocks of ``block_size``, ``pack=false`` (the default here) pads
each conversation, truncated to ``block_size``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.batches import Unscored
from lightning_kd.data.chat_formats import ALPACA, SHAREGPT
from lightning_kd.data.chat_tokens import (
    MESSAGES,
    ChatExample,
    conversation_tokens,
    dataset_row_messages,
    encode_chat,
    pack_chats,
    template_text,
)
from lightning_kd.data.conversations import ChatFields, opening_key, row_messages
from lightning_kd.data.dataset_columns import Columns, open_checked
from lightning_kd.data.dataset_source import DatasetSource
from lightning_kd.data.errors import DataError
from lightning_kd.data.held_out import outside, val_files_errors
from lightning_kd.data.loaders import ranks
from lightning_kd.data.packing import warn_cut, warn_tail
from lightning_kd.data.provenance import chat_record, source_record, text_record
from lightning_kd.data.reading import place_name, read_records, warn_repeats
from lightning_kd.data.teacher_answers import teacher_answered
from lightning_kd.data.text import TextDataModule
from lightning_kd.data.tokenized import cache_key, rows, text_key, tokenized
from lightning_kd.losses.logits import IGNORE_INDEX
from lightning_kd.models.digests import tokenizer_digest
from lightning_kd.utils.refusal import refuse


@dataclass(frozen=True)
class Conversation:
    """A row's conversation: where it was read (``file:line``), its messages, its tokens."""

    where: str
    messages: list[dict[str, str]]
    example: ChatExample


class ChatDataModule(TextDataModule):
    """Chat-formatted data with only the assistant's tokens scored (see the module doc)."""

    SIZE_FIX = "raise data.block_size (a conversation whose answer starts past it is left out)"

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        files: list[str] | None = None,
        messages_field: str = "messages",
        prompt_field: str = "prompt",
        completion_field: str = "completion",
        chat_template: str | None = None,
        pack: bool = False,
        teacher_answers: str | None = None,
        **text: Any,
    ) -> None:
        if files is None and not DatasetSource.of(text.get("dataset")).given:
            raise DataError(
                "data=chat reads conversations from your .jsonl files: set data.files=[chats.jsonl]"
                " (rows with 'messages', or 'prompt' and 'completion'), or from a dataset: set "
                "data.dataset.path"
            )
        refuse(val_files_errors(text.get("val_files"), DatasetSource(), False, chat=True))
        if teacher_answers is not None and text.get("streaming"):
            raise DataError(
                "data.teacher_answers with data.streaming=true: the answers are matched to the "
                "training prompts, which a stream never holds at once; set data.streaming=false"
            )
        super().__init__(tokenizer, files, pack=pack, **text)
        if not tokenizer.is_fast:
            raise DataError("data=chat needs a fast tokenizer (token offsets find the answers)")
        if chat_template is not None:
            tokenizer.chat_template = template_text(chat_template)
        if tokenizer.chat_template is None:
            raise DataError(
                f"the tokenizer ({type(tokenizer).__name__}) has no chat template; set "
                "data.chat_template to one (plain: User:/Assistant: lines, as for a base model "
                "or debug=smoke's tiny teacher; a Jinja string; a file), or use data=text"
            )
        self.fields = ChatFields(messages_field, prompt_field, completion_field)
        self.teacher_answers = None if teacher_answers is None else Path(teacher_answers)
        self.template_setting = chat_template  # recorded by name (data/provenance.py)

    def provenance(self) -> dict[str, Any]:
        """The text module's record, the teacher's answers and the template with it."""
        return text_record(self) | chat_record(self)

    @classmethod
    def dataset_columns(cls, settings: Mapping[str, Any]) -> Columns:
        """A ``messages`` column, or ``prompt`` and ``completion`` ones (as ``settings`` name
        them)."""
        messages = settings.get("messages_field", "messages")
        pair = (
            settings.get("prompt_field", "prompt"),
            settings.get("completion_field", "completion"),
        )
        setting = "data.messages_field (or data.prompt_field and data.completion_field)"
        shapes = ((messages,), pair, ALPACA, (SHAREGPT,))  # chat_formats.py's, read whole
        return Columns(shapes, f"{setting} to the columns holding the conversation")

    def columns(self) -> Columns:
        fields = self.fields
        names = {"messages_field": fields.messages, "prompt_field": fields.prompt}
        return self.dataset_columns(names | {"completion_field": fields.completion})

    def read_splits(self) -> None:
        """Read, render and split the conversations, then pack or truncate each split
        (streamed: only the validation conversations are read here)."""
        if self.stream is not None:
            self.val_examples = self.stream.validation(self.columns(), *ranks(self.trainer))
            return
        train, val = self.split()
        train = self.limit(train)
        if self.teacher_answers is not None:
            train = self.answered_by_teacher(train)
        self.val_examples = self.layout([c.example for c in val], "val")
        self.train_examples = self.layout([c.example for c in train], "train")

    def split(self) -> tuple[list[Conversation], list[Conversation]]:
        """The training and the validation conversations. Split by opening (``opening_key``):
        conversations that share the prompt of any answer fall on one side, so a held-out
        prompt is never trained on."""
        if self.dataset.val_split is not None:
            val = self.read_chats(self.dataset.val_split)
            held = {opening_key(chat.messages) for chat in val}
            read = self.read_chats(self.dataset.split)
            train = outside(((opening_key(c.messages), c) for c in read), held, self.dataset, True)
            return self.shuffled(train), val
        chats = self.read_chats(self.dataset.split)
        groups: dict[str, list[Conversation]] = {}
        for chat in chats:
            groups.setdefault(opening_key(chat.messages), []).append(chat)
        if len(groups) < 2:
            read = self.dataset.describe(self.dataset.split) if self.dataset.given else None
            read = read or ", ".join(str(path) for path in self.files)
            rows = "no row" if not chats else f"{len(groups)} distinct prompt"
            raise DataError(
                f"{read} holds {rows}; two distinct prompts are needed, one for training and "
                "one for validation: add conversations"
            )
        ordered = list(groups.values())
        order = torch.randperm(
            len(ordered), generator=torch.Generator().manual_seed(self.split_seed)
        )
        val_count = min(max(1, round(self.val_fraction * len(ordered))), len(ordered) - 1)
        val = [chat for i in order[:val_count].tolist() for chat in ordered[i]]
        train = [chat for i in order[val_count:].tolist() for chat in ordered[i]]
        return train, val

    def answered_by_teacher(self, chats: list[Conversation]) -> list[Conversation]:
        """``chats`` with their last answer the teacher's, from ``data.teacher_answers``."""
        answered = teacher_answered([c.messages for c in chats], self.teacher_answers)
        return [
            Conversation(c.where, m, encode_chat(self.tokenizer, m, c.where))
            for c, m in zip(chats, answered, strict=True)
        ]

    def read_chats(self, split: str) -> list[Conversation]:
        """Every row of every file (or of the dataset's ``split``), encoded; repeated
        conversations once (none in both splits)."""
        chats, seen, repeats = [], {}, []
        read = self.dataset_chats(split) if self.dataset.given else self.file_chats()
        for chat in read:
            key = tuple(chat.example.tokens.tolist())
            if key in seen:  # counted, as text's are: 2 of 3 rows went unsaid (probe 46)
                repeats.append(f"{chat.where} repeats {seen[key]}")
                continue
            seen[key] = chat.where
            chats.append(chat)
        warn_repeats(len(repeats), len(chats) + len(repeats), repeats, "conversation")
        return chats

    def file_chats(self) -> Iterator[Conversation]:
        """The conversations of ``data.files``, row by row (``file:line`` each)."""
        for path in self.files:
            for number, record in read_records(path):
                where = f"{place_name(path)}:{number}"  # generate's prompt_line, too
                messages = row_messages(record, where, self.fields)
                yield Conversation(where, messages, encode_chat(self.tokenizer, messages, where))

    def dataset_chats(self, split: str) -> Iterator[Conversation]:
        """The conversations of ``data.dataset``'s ``split``: rendered once into the cache
        (``tokenized.py``), read back from it after."""
        dataset = open_checked(self.dataset, split, False, self.columns())
        where, tokenizer = self.dataset.describe(split), self.tokenizer
        parts = {"kind": "chat", "fields": list(vars(self.fields).values()), "rows": MESSAGES}
        parts |= {"template": tokenizer.chat_template, "tokenizer": tokenizer_digest(tokenizer)}
        parts["source"] = source_record(self.dataset)
        options = {"tokenizer": tokenizer, "fields": self.fields, "where": where}
        key = cache_key(dataset, parts)
        desc = f"rendering {where}"
        mapped = tokenized(dataset, conversation_tokens, options, key, desc, self.dataset)
        for index, row in enumerate(rows(mapped)):
            example = ChatExample(torch.tensor(row["tokens"]), torch.tensor(row["labels"]))
            yield Conversation(f"{where} row {index}", json.loads(row[MESSAGES]), example)

    def stream_row(self, row: dict, where: str) -> tuple[str, ChatExample]:
        """A streamed row's key (its opening's digest) and rendered conversation."""
        messages = dataset_row_messages(row, where, self.fields)
        return text_key(opening_key(messages)), encode_chat(self.tokenizer, messages, where)

    def keep(self, example: ChatExample) -> bool:
        """A streamed example is kept when it holds an answer token."""
        return example.scored > 0

    def layout(self, chats: list[ChatExample], split: str) -> list[ChatExample]:
        """Packed blocks or truncated conversations, those left without a scored token dropped."""
        if self.pack:
            examples = pack_chats(chats, self.block_size)
            if not examples:
                raise DataError(
                    f"the {split} conversations ({sum(len(c) for c in chats)} tokens) fill no "
                    f"block of data.block_size={self.block_size}: lower it, add conversations, "
                    "or set data.pack=false"
                )
            total = sum(len(chat) for chat in chats)
            dropped = total - len(examples) * self.block_size
            warn_tail(split, "conversations", dropped, total, self.block_size)
        else:
            examples = [chat.cut(0, self.block_size) for chat in chats]
            warn_cut(
                split,
                "conversation",
                [chat.scored for chat in chats],
                [example.scored for example in examples],
                self.block_size,
                "answer ",
            )
        kept = [example for example in examples if example.scored > 0]
        if len(kept) < len(examples):
            warnings.warn(
                f"data: {len(examples) - len(kept)} {split} example(s) of {len(examples)} have "
                f"no answer token within data.block_size={self.block_size} and are left out",
                stacklevel=2,
            )
        if not kept:
            raise DataError(
                f"no {split} example keeps an answer token within data.block_size="
                f"{self.block_size}: raise data.block_size, or add conversations"
            )
        return kept

    def collate(self, examples: list) -> dict[str, Tensor]:
        """As :meth:`TextDataModule.collate`, with each conversation's own labels."""
        indexed = bool(examples) and isinstance(examples[0], tuple)
        items = [example for _, example in examples] if indexed else list(examples)
        chats = [item.tokens if isinstance(item, Unscored) else item for item in items]
        as_text = [
            Unscored(chat.tokens) if isinstance(item, Unscored) else chat.tokens
            for item, chat in zip(items, chats, strict=True)
        ]
        if indexed:
            as_text = [(index, text) for (index, _), text in zip(examples, as_text, strict=True)]
        batch = super().collate(as_text)
        labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
        for row, (item, chat) in enumerate(zip(items, chats, strict=True)):
            if not isinstance(item, Unscored):
                labels[row, : len(chat)] = chat.labels
        return batch | {"labels": labels}
