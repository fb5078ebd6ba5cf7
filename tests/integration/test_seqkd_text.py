"""Sequence-level KD on text through the command line: a teacher with another tokenizer (a
SentencePiece one with a BOS) continues the training documents, and a byte-tokenizer student
trains on that text alone (experiment=seqkd_text), validated on the corpus's own split."""

from __future__ import annotations

import json
from pathlib import Path

from lightning_kd.generation.text_continuations import document_prefix
from lightning_kd.models.loading import byte_tokenizer
from tests.conftest import sentencepiece_tokenizer
from tests.integration.test_cli import run_in_process
from tests.integration.test_cross_tokenizer_run import save_model

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs.",
    "How vexingly quick daft zebras jump!",
    "Sphinx of black quartz, judge my vow.",
]


def test_a_teacher_with_another_tokenizer_writes_text_a_byte_student_trains_on(
    tmp_path: Path, capsys
) -> None:
    teacher = save_model(tmp_path / "teacher", sentencepiece_tokenizer(), 0)
    student = save_model(tmp_path / "student", byte_tokenizer(), 1)
    corpus = tmp_path / "corpus.jsonl"
    documents = [
        f"Note {i}. " + " ".join(SENTENCES[(i + j) % 4] for j in range(1 + i % 3))
        for i in range(40)
    ]
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in documents))
    models = [f"teacher.path={teacher}", "teacher.config=null", "teacher.dtype=float32"]
    models += [f"student.source={student}", "student.num_layers=2"]
    gen = tmp_path / "gen"
    code, output = run_in_process(
        [
            "generate",
            "debug=smoke",
            *models,
            f"data.files=[{corpus}]",
            "generate.prompts=train_split",
            "generate.prefix_chars=20",
            "generate.max_new_tokens=24",
            f"hydra.run.dir={gen}",
        ],
        capsys,
    )
    assert code in (None, 0), output[-3000:]
    rows = [json.loads(line) for line in (gen / "completions.jsonl").read_text().splitlines()]
    assert 0 < len(rows) < len(documents)  # the held-out documents are no prompts
    for row in rows:
        document = documents[int(row["prompt_line"].rsplit(":", 1)[1]) - 1]
        assert row["text"].startswith(document_prefix(document, 20)) and "<bos>" not in row["text"]
    run = tmp_path / "run"
    code, output = run_in_process(
        [
            "train",
            "experiment=seqkd_text",
            "debug=smoke",
            *models,
            f"data.files=[{gen / 'completions.jsonl'}]",
            f"data.val_files=[{corpus}]",
            "export.gguf=null",
            f"hydra.run.dir={run}",
        ],
        capsys,
    )
    assert code in (None, 0), output[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["after"]["val/bpb"] < summary["before"]["val/bpb"]
