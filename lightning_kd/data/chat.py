"""Chat data: conversations rendered with the tokenizer's chat template, the answers alone scored.

``data=chat`` reads ``.jsonl`` rows (optionally gzipped) of either form:

- ``{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": ...}]}``
- ``{"prompt": "...", "completion": "..."}`` (each may also be a list of messages, TRL's
  conversational form; a string prompt is the user's turn, a string completion the assistant's)

Each conversation is rendered with the tokenizer's chat template (or ``data.chat_template``) and
every token outside an assistant turn is labelled −100. The KD, CE and feature terms all score the
positions that predict a label, so the prompt, the system turn and the template's role headers
count nowhere. An assistant turn's tokens are found by rendering the conversation up to that turn
with the generation prompt, then through it: the characters between the two renderings are the
answer (with whatever the template closes a turn with, e.g. ``<|im_end|>``), whatever template.

Conversations are split into training and validation before packing, so none straddles the two;
``pack=true`` joins them into blocks of ``block_size``, ``pack=false`` (the default here) pads each
conversation, truncated to ``block_size``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.conversations import ChatFields, prompt_key, row_messages
from lightning_kd.data.reading import read_records
from lightning_kd.data.teacher_answers import teacher_answered
from lightning_kd.data.text import TextDataModule, Unscored
from lightning_kd.losses.logits import IGNORE_INDEX


@dataclass(frozen=True)
class ChatExample:
    """A conversation's tokens and labels (the token inside an assistant turn, else −100)."""

    tokens: Tensor
    labels: Tensor

    def __len__(self) -> int:
        return len(self.tokens)

    def cut(self, start: int, stop: int) -> ChatExample:
        return ChatExample(self.tokens[start:stop], self.labels[start:stop])

    @property
    def scored(self) -> int:
        """Positions that predict a label (the first token predicts nothing)."""
        return int((self.labels[1:] != IGNORE_INDEX).sum())


@dataclass(frozen=True)
class Conversation:
    """A row's conversation: where it was read (``file:line``), its messages, its tokens."""

    where: str
    messages: list[dict[str, str]]
    example: ChatExample


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompts: list[list[dict]]) -> list[Tensor]:
    """Each prompt rendered with the chat template and the generation prompt, as token ids
    (what a model is asked to continue)."""
    texts = [
        tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
        for m in prompts
    ]
    return [torch.tensor(t) for t in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def render(tokenizer: PreTrainedTokenizerBase, messages: list[dict], where: str, **kw) -> str:
    """The chat template applied to ``messages`` (text), its errors pointed at the row."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **kw)
    except Exception as err:  # jinja2's TemplateError, or the template's own raise_exception
        roles = [message["role"] for message in messages]
        raise ValueError(
            f"{where}: the chat template cannot render roles {roles} ({err}); fix the row, or "
            "set data.chat_template to a template that takes them"
        ) from None


def assistant_spans(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict], where: str
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of each assistant turn in it."""
    text, spans = render(tokenizer, messages, where), []
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:turn], where, add_generation_prompt=True)
        through = render(tokenizer, messages[: turn + 1], where)
        if not (through.startswith(before) and text.startswith(through)):
            raise ValueError(
                f"{where}: the chat template does not render this conversation's turns as "
                f"prefixes of one another (turn {turn}), so the answer's tokens cannot be told "
                "from the prompt's; set data.chat_template to a template that does"
            )
        spans.append((len(before), len(through)))
    return text, spans


def encode_chat(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict], where: str
) -> ChatExample:
    """Tokens of the rendered conversation; labels are the tokens that start inside an answer."""
    text, spans = assistant_spans(tokenizer, messages, where)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    tokens = torch.tensor(encoded["input_ids"], dtype=torch.long)
    starts = torch.tensor([start for start, _ in encoded["offset_mapping"]], dtype=torch.long)
    answer = torch.zeros_like(tokens, dtype=torch.bool)
    for first, last in spans:
        answer |= (starts >= first) & (starts < last)
    return ChatExample(tokens, tokens.masked_fill(~answer, IGNORE_INDEX))


def pack_chats(examples: list[ChatExample], block_size: int) -> list[ChatExample]:
    """Conversations joined end to end and cut into blocks of ``block_size`` (tail dropped)."""
    if not examples:
        return []
    joined = ChatExample(
        torch.cat([e.tokens for e in examples]), torch.cat([e.labels for e in examples])
    )
    count = len(joined) // block_size
    return [joined.cut(i * block_size, (i + 1) * block_size) for i in range(count)]


def template_text(value: str, key: str = "data.chat_template") -> str:
    """A chat template setting (``key``): a Jinja template itself, or the file holding one."""
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{key}={value!r} is neither a Jinja template nor a file")
    return path.read_text()


class ChatDataModule(TextDataModule):
    """Chat-formatted data with only the assistant's tokens scored (see the module doc)."""

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
        if files is None:
            raise ValueError(
                "data=chat reads conversations from your .jsonl files: set data.files=[chats.jsonl]"
                " (rows with 'messages', or 'prompt' and 'completion')"
            )
        super().__init__(tokenizer, files, pack=pack, **text)
        if not tokenizer.is_fast:
            raise ValueError("data=chat needs a fast tokenizer (token offsets find the answers)")
        if chat_template is not None:
            tokenizer.chat_template = template_text(chat_template)
        if tokenizer.chat_template is None:
            raise ValueError(
                f"the tokenizer ({type(tokenizer).__name__}) has no chat template; set "
                "data.chat_template to one (a Jinja string or a file), or use data=text"
            )
        self.fields = ChatFields(messages_field, prompt_field, completion_field)
        self.teacher_answers = None if teacher_answers is None else Path(teacher_answers)

    def setup(self, stage: str | None = None) -> None:
        """Read, render and split the conversations, then pack or truncate each split."""
        if self.train_examples:
            return
        train, val = self.split()
        train = self.limit(train)
        if self.teacher_answers is not None:
            train = self.answered_by_teacher(train)
        self.val_examples = self.layout([c.example for c in val], "val")
        self.train_examples = self.layout([c.example for c in train], "train")

    def split(self) -> tuple[list[Conversation], list[Conversation]]:
        """The training and the validation conversations. Split by prompt: conversations that
        share a prompt fall on one side, so a held-out prompt is never trained on."""
        chats = self.read_chats()
        groups: dict[str, list[Conversation]] = {}
        for chat in chats:
            groups.setdefault(prompt_key(chat.messages), []).append(chat)
        if len(groups) < 2:
            raise ValueError(
                f"{len(groups)} distinct prompt(s) in {[str(p) for p in self.files]}; one is "
                "needed for training and one for validation"
            )
        ordered = list(groups.values())
        order = torch.randperm(len(ordered), generator=torch.Generator().manual_seed(self.seed))
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

    def read_chats(self) -> list[Conversation]:
        """Every row of every file, encoded; repeated conversations once (none in both splits)."""
        chats, seen = [], set()
        for path in self.files:
            for number, record in read_records(path):
                where = f"{path}:{number}"
                messages = row_messages(record, where, self.fields)
                example = encode_chat(self.tokenizer, messages, where)
                key = tuple(example.tokens.tolist())
                if key not in seen:
                    seen.add(key)
                    chats.append(Conversation(where, messages, example))
        return chats

    def layout(self, chats: list[ChatExample], split: str) -> list[ChatExample]:
        """Packed blocks or truncated conversations, those left without a scored token dropped."""
        if self.pack:
            examples = pack_chats(chats, self.block_size)
            if not examples:
                raise ValueError(
                    f"the {split} conversations ({sum(len(c) for c in chats)} tokens) fill no "
                    f"block of data.block_size={self.block_size}: lower it, add conversations, "
                    "or set data.pack=false"
                )
        else:
            examples = [chat.cut(0, self.block_size) for chat in chats]
        kept = [example for example in examples if example.scored > 0]
        if len(kept) < len(examples):
            warnings.warn(
                f"data: {len(examples) - len(kept)} {split} example(s) of {len(examples)} have "
                f"no answer token within data.block_size={self.block_size} and are left out",
                stacklevel=2,
            )
        if not kept:
            raise ValueError(
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
