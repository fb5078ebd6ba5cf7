"""lightning-kd evaluate --prompts: answers to held-out prompts judged by the teacher,
each score equal to a direct computation."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

from lightning_kd.cli.evaluate import main
from lightning_kd.evaluation.prompts import (
    Sampling,
    completion_nll,
    fresh_prefix,
    greedy_answers,
    repeated_ngrams,
    rouge_l,
    sampled,
)
from tests.conftest import TINY_LLAMA
from tests.unit.data.test_chat import CHATML, chat_tokenizer


def saved(tmp_path, name: str, seed: int):
    """A tiny Llama whose greedy completions vary with the prompt (untied, wide init: a random
    tied model only repeats the prompt's last token), saved with the chat tokenizer."""
    torch.manual_seed(seed)
    config = dict(TINY_LLAMA, tie_word_embeddings=False, initializer_range=0.5, eos_token_id=256)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(config.pop("model_type"), **config)
    )
    model.save_pretrained(tmp_path / name)
    chat_tokenizer().save_pretrained(tmp_path / name)  # with the chat template
    return model.eval()


def write_prompts(path, count: int):
    rows = [{"prompt": f"Say {i}."} for i in range(count - 1)]
    rows.append(
        {"messages": [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "x"}]}
    )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_completion_nll_equals_a_direct_sum_over_the_completion_tokens(tmp_path) -> None:
    model = saved(tmp_path, "m", 0).double()
    prompts = [torch.tensor([60, 61, 62]), torch.tensor([70])]
    completions = [torch.tensor([5, 6]), torch.tensor([7, 8, 9, 10])]
    total, count = completion_nll(model, prompts, completions, batch_size=2)  # right-padded
    direct = 0.0
    for prompt, completion in zip(prompts, completions, strict=True):
        ids = torch.cat([prompt, completion])[None]
        with torch.no_grad():
            logp = F.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
        rows = torch.arange(len(prompt) - 1, ids.shape[1] - 1)
        direct -= logp[rows, ids[0, rows + 1]].sum().item()
    assert count == 6 and total == pytest.approx(direct, rel=1e-10)


def test_the_teacher_and_a_copy_of_it_score_alike_and_the_scores_hold(tmp_path) -> None:
    saved(tmp_path, "teacher", 0)
    saved(tmp_path, "copy", 0)
    other = saved(tmp_path, "other", 1)
    prompts = write_prompts(tmp_path / "p.jsonl", 5)
    out = tmp_path / "scores.json"
    argv = ["--prompts", str(prompts), "--teacher", str(tmp_path / "teacher")]
    argv += ["--max-new-tokens", "6", "--batch-size", "2", "--out", str(out), "--"]
    rows = main([*argv, str(tmp_path / "copy"), str(tmp_path / "other")])
    teacher, copy, second = rows
    assert [r["model"] for r in rows] == [
        "teacher",
        str(tmp_path / "copy"),
        str(tmp_path / "other"),
    ]
    assert teacher["rouge_l"] == 1.0 and len(teacher["completions"]) == 5
    assert len(set(teacher["completions"])) >= 3 and teacher["tokens"] == 6
    # The teacher scoring its own completions: its NLL of them is its perplexity on them.
    assert teacher["ppl_on_teacher"] == pytest.approx(math.exp(teacher["teacher_nll"]), rel=1e-6)
    keys = ("teacher_nll", "fresh_nll", "fresh_tokens", "rouge_l", "ppl_on_teacher", "repeated")
    for key in (*keys, "tokens", "ended"):
        assert copy[key] == pytest.approx(teacher[key], rel=1e-6)
    assert 0 < second["tokens"] <= 6 and 0 <= second["rouge_l"] <= 1
    assert 0 < second["fresh_tokens"] <= second["tokens"] and second["fresh_nll"] > 0
    assert second["rouge_l"] == pytest.approx(
        sum(rouge_l(second["completions"], teacher["completions"])) / 5
    )
    assert second["ppl_on_teacher"] != pytest.approx(teacher["ppl_on_teacher"])
    assert second["teacher_nll"] > teacher["teacher_nll"]  # greedy is the teacher's likeliest
    record = json.loads(out.read_text())
    assert record["rows"] == json.loads(json.dumps(rows))
    # What the numbers depend on: the judge, the answers' cap; greedy (no samples).
    judge = str(tmp_path / "teacher")
    settings = {"prompts": str(prompts), "teacher": judge, "max_new_tokens": 6, "batch_size": 2}
    assert record == settings | {"samples": None, "rows": record["rows"]}
    del other


def test_sampled_completions_are_judged_alike_for_a_copy_and_vary_with_the_seed(tmp_path) -> None:
    saved(tmp_path, "teacher", 0)
    saved(tmp_path, "copy", 0)
    prompts = write_prompts(tmp_path / "p.jsonl", 3)
    judge = ["--prompts", str(prompts), "--teacher", str(tmp_path / "teacher")]
    judge += ["--max-new-tokens", "5", "--batch-size", "4", "--samples", "2"]
    teacher, copy = main([*judge, "--", str(tmp_path / "copy")])
    assert len(teacher["sampled_completions"]) == 6  # 3 prompts x 2 samples
    # The same random stream for every model: the teacher's copy draws the same answers.
    assert copy["sampled_completions"] == teacher["sampled_completions"]
    for key in ("sampled_nll", "sampled_fresh_nll", "sampled_repeated", "sampled_tokens"):
        assert copy[key] == pytest.approx(teacher[key], rel=1e-6)
    # Sampling at temperature 1 is not the greedy answer, and the greedy columns are unchanged.
    assert teacher["sampled_nll"] > teacher["teacher_nll"] > 0
    out = tmp_path / "hot.json"
    hot_argv = [*judge, "--temperature", "3", "--seed", "1", "--out", str(out)]
    (hot,) = main([*hot_argv, "--", str(tmp_path / "copy")])[1:]
    # --out records the sampling its sampled_* columns depend on (it held the prompts alone).
    settings = {"max_new_tokens": 5, "batch_size": 4, "samples": 2, "temperature": 3.0, "seed": 1}
    assert json.loads(out.read_text()).items() >= settings.items()
    assert hot["sampled_completions"] != copy["sampled_completions"]
    assert hot["teacher_nll"] == pytest.approx(copy["teacher_nll"], rel=1e-6)
    assert hot["sampled_nll"] > copy["sampled_nll"]  # hotter samples: less likely to the teacher


def test_sampled_nll_is_the_teacher_nll_of_the_sampled_answers(tmp_path) -> None:
    teacher = saved(tmp_path, "teacher", 0).double()
    tokenizer = chat_tokenizer()
    prompts = [torch.tensor([60, 61, 62]), torch.tensor([70, 71])]
    sampling = Sampling(2, temperature=1.5, seed=3)
    scores = sampled(teacher, teacher, tokenizer, prompts, 4, 3, sampling)
    answers = greedy_answers(
        teacher, tokenizer, [p for p in prompts for _ in range(2)], 4, 3, sampling
    )
    assert scores["sampled_completions"] == answers.texts  # reseeded: the same draws
    total, count = completion_nll(
        teacher, [p for p in prompts for _ in range(2)], answers.tokens, 2
    )
    assert scores["sampled_nll"] == pytest.approx(total / count, rel=1e-9)
    assert scores["sampled_tokens"] == pytest.approx(count / 4)


def test_the_fresh_prefix_stops_before_the_first_repeated_4gram() -> None:
    def prefix(values):
        return fresh_prefix(torch.tensor(values)).tolist()

    assert prefix([1, 2, 3, 4, 5]) == [1, 2, 3, 4, 5]  # nothing repeats
    assert prefix([1, 2, 3, 4, 1, 2, 3, 4, 9]) == [1, 2, 3, 4, 1, 2, 3]  # (1,2,3,4) again at 4
    assert prefix([7] * 10) == [7, 7, 7, 7]  # the second (7,7,7,7) ends at the fifth token
    assert prefix([1, 2]) == [1, 2]


def test_rouge_l_is_the_longest_common_subsequence_f1() -> None:
    assert rouge_l(["the cat sat", "a b"], ["the cat sat", "c d"]) == [1.0, 0.0]
    # LCS "the cat" of 3 and 4 words: precision 2/3, recall 2/4.
    assert rouge_l(["the cat sat"], ["the big cat ran"])[0] == pytest.approx(
        2 * (2 / 3) * 0.5 / (2 / 3 + 0.5)
    )


def test_repeated_ngrams_is_the_share_of_4grams_seen_before() -> None:
    assert repeated_ngrams([1, 2, 3, 4, 5]) == 0.0
    assert repeated_ngrams([7] * 10) == pytest.approx(6 / 7)  # 7 four-grams, one distinct
    assert repeated_ngrams([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(1 / 5)  # (1,2,3,4) again
    assert repeated_ngrams([1, 2]) == 0.0


def test_bad_prompt_evaluations_are_named(tmp_path, capsys) -> None:
    saved(tmp_path, "teacher", 0)
    prompts = write_prompts(tmp_path / "p.jsonl", 2)
    with pytest.raises(SystemExit):
        main(["--prompts", str(prompts), "--", str(tmp_path / "teacher")])
    assert "--prompts needs --teacher" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--prompts", str(prompts), "--files", "x.txt", "--", str(tmp_path / "teacher")])
    with pytest.raises(ValueError, match=r"--samples has no effect with --files: it goes with"):
        main(["--files", "x.txt", "--samples", "2", "--", str(tmp_path / "teacher")])
    with pytest.raises(ValueError, match=r"--samples=0: must be an integer >= 1"):
        main(
            [
                *["--prompts", str(prompts), "--teacher", str(tmp_path / "teacher")],
                "--samples",
                "0",
                "--",
                "x",
            ]
        )
    with pytest.raises(ValueError, match=r"--temperature=0.0: must be a finite number > 0"):
        main(
            [
                "--prompts",
                str(prompts),
                "--teacher",
                "t",
                "--samples",
                "1",
                "--temperature",
                "0",
                "--",
                "x",
            ]
        )
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    # Answers of 16 tokens: within the tiny models' 128 positions.
    judge = ["--teacher", str(tmp_path / "teacher"), "--max-new-tokens", "16"]
    with pytest.raises(ValueError, match=r"holds no prompt rows"):
        main(["--prompts", str(empty), *judge, "--", str(tmp_path / "teacher")])
    saved(tmp_path, "other", 1)
    other = chat_tokenizer()
    other.add_tokens(["<other>"])  # one token more: another vocabulary
    other.save_pretrained(tmp_path / "other")
    # Refused before any weights load (a traceback once the teacher had loaded), with the fix.
    with pytest.raises(ValueError, match=r"other has another tokenizer than --teacher .*--files"):
        main(["--prompts", str(prompts), *judge, "--", str(tmp_path / "other")])
    assert CHATML  # the template the saved tokenizers carry


def test_an_answer_that_ends_in_text_is_cut_there_and_counted_as_ended(tmp_path) -> None:
    """A template that closes answers with text, no token (plain's newline and next "User:",
    markers read as text): greedy answers ran on to the token limit, scored and counted as
    unended (probe 44); they are cut after the closing text, and have ended."""
    teacher = saved(tmp_path, "teacher", 0)
    prompts = [torch.tensor([60, 61, 62]), torch.tensor([70, 71])]
    free = greedy_answers(teacher, chat_tokenizer(None), prompts, 6, 2)
    assert free.ended == 0
    closing = free.texts[0][2:4]  # one byte a token: the answer's third and fourth tokens
    assert closing not in free.texts[0][:3]
    template = "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}"
    tokenizer = chat_tokenizer(
        template + "{% raw %}" + closing + "{% endraw %}{% endif %}{% endfor %}"
    )
    answers = greedy_answers(teacher, tokenizer, prompts, 6, 2)
    assert answers.texts[0] == free.texts[0][:4]
    assert answers.ends[0] and torch.equal(answers.tokens[0], free.tokens[0][:4])
