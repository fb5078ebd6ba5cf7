"""The one validation every command runs before any model loads (``launch/entry.py``)."""

from __future__ import annotations

import pytest

from lightning_kd.launch.cache_k_checks import cache_k_errors
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.entry import Length, check_entry
from lightning_kd.launch.model_checks import model_setting_errors
from lightning_kd.launch.train_checks import train_errors
from lightning_kd.utils.refusal import Refused


def test_config_options_and_lengths_are_refused_at_once() -> None:
    cfg = compose_config(["debug=smoke", "data.batch_size=0"])
    models = {"the student": lambda: 32, "the teacher": lambda: 128}
    with pytest.raises(Refused) as refused:
        check_entry(
            cfg,
            command="evaluate",
            options={"--batch-size": 0, "--temperature": float("nan")},
            lengths=[Length("--block-size", 64, models)],
        )
    message = str(refused.value)
    assert message.startswith("4 values are refused:"), message
    assert "data.batch_size=0: must be an integer >= 1; e.g. data.batch_size=4" in message
    assert "--batch-size=0: must be an integer >= 1; e.g. --batch-size=8" in message
    assert "--temperature=nan: must be a finite number > 0; e.g. --temperature=1.0" in message
    assert "--block-size=64 is longer than the student's 32 positions" in message
    assert "the teacher's" not in message  # 64 fits its 128


def test_a_model_that_cannot_say_its_positions_is_reported_with_the_rest() -> None:
    def missing() -> int:
        raise FileNotFoundError("teacher.path=/no/such does not exist")

    with pytest.raises(Refused) as refused:
        check_entry(
            command="soak",
            options={"--steps": 0},
            lengths=[Length("data.block_size", 64, {"the teacher": missing})],
        )
    assert "--steps=0" in str(refused.value)
    assert "teacher.path=/no/such does not exist" in str(refused.value)


def test_a_bad_length_is_not_compared_with_the_positions() -> None:
    def unread() -> int:
        raise AssertionError("positions read for a length that is itself refused")

    with pytest.raises(Refused, match=r"--seq=0: must be an integer >= 2"):
        check_entry(
            command="bench", options={"--seq": 0}, lengths=[Length("--seq", 0, {"x": unread})]
        )


def test_a_cache_k_beyond_a_cached_teachers_vocabulary_is_refused_before_it_loads() -> None:
    """Found by the cache writer, it was a ValueError traceback after the teacher had loaded."""
    cfg = compose_config(["debug=smoke", "cache.k=300"])
    assert cache_k_errors(cfg, "cache") == [
        "cache.k=300 is more than the teacher's 257-token vocabulary (config vocab_size): the "
        "cache keeps its k likeliest tokens; set cache.k=257 or less (the whole distribution)"
    ]
    online = compose_config(["debug=smoke", "cache.k=300", "distill.teacher_cache=null"])
    assert cache_k_errors(online, "train") == []  # no cache is written: k is unused
    wide = "{model_type: llama, vocab_size: 300, hidden_size: 64, num_hidden_layers: 2}"
    entries = f"teachers=[{{name: a, weight: 0.5}}, {{name: b, weight: 0.5, config: {wide}, %s}}]"
    for cache, refused in (("cache: auto", True), ("cache: null", False)):
        overrides = ["debug=smoke", "distill.teacher_cache=null", "cache.k=400", entries % cache]
        errors = cache_k_errors(compose_config(overrides), "train")
        assert errors == (
            [
                "cache.k=400 is more than teachers[1] (b)'s 300-token vocabulary "
                "(config vocab_size): the cache keeps its k likeliest tokens; set "
                "cache.k=300 or less (the whole distribution)"
            ]
            if refused
            else []
        )
    with pytest.raises(Refused, match=r"cache\.k=0: must be an integer >= 1"):
        check_entry(compose_config(["debug=smoke", "cache.k=0"]))
    assert cache_k_errors(compose_config(["debug=smoke", "cache.k=0"]), "cache") == []


def test_cache_k_is_judged_only_where_a_cache_is_written_and_after_the_teachers_own_sizes():
    """An ``auto`` run that the config keeps online writes no cache (its k is unused); a teacher
    whose vocabulary is smaller than its tokenizer is named as such (a smaller cache.k could not
    help), and a vocabulary below 1 as a size."""
    ce_only = compose_config(["debug=smoke", "cache.k=300", "experiment=ce_only"])
    assert cache_k_errors(ce_only, "train") == []
    small = compose_config(["debug=smoke", "teacher.config.vocab_size=100"])
    assert cache_k_errors(small, "train") == [
        "the teacher's vocabulary has 100 rows (config vocab_size) but its tokenizer has 257 "
        "tokens: the two do not belong together (set teacher.config.vocab_size=257 or more, or "
        "the model of that tokenizer)"
    ]
    for size in (0, -5):
        cfg = compose_config(["debug=smoke", f"teacher.config.vocab_size={size}"])
        assert cache_k_errors(cfg, "train") == []
        assert f"teacher.config.vocab_size={size}: must be an integer >= 1" in (
            model_setting_errors(cfg)
        )


def test_a_wrong_type_is_said_once_by_its_rule_not_again_by_hydra() -> None:
    """``distill.temperature=hot`` was refused by its rule and again as Hydra's "Error in call
    to target DistillConfig ... TypeError" (counted as a third value)."""
    cfg = compose_config(["debug=smoke", "distill.temperature=hot"])
    with pytest.raises(Refused) as refused:
        check_entry(cfg, extra=model_setting_errors(cfg))
    message = str(refused.value)
    assert "distill.temperature='hot': must be a finite number >= 0.01" in message
    assert "Error in call to target" not in message and "TypeError" not in message
    # cache.temperature repeats it (${distill.temperature}): refused once, where it was set.
    assert "cache.temperature" not in message and message.count("refused") == 1
    own = compose_config(["debug=smoke", "cache.temperature=-1"])  # set itself: its own line
    with pytest.raises(Refused, match=r"cache.temperature=-1: must be a finite number >= 0.01"):
        check_entry(own)


@pytest.mark.parametrize(
    "override",
    [
        "distill.beta=1.5",
        "distill.skew=-0.1",
        "distill.feature_weight=-1",
        "distill.on_policy_tokens=0",
        "distill.on_policy_warmup=-1",  # was refused only inside a line naming fine settings
        "distill.temperature=0",
    ],
)
def test_one_bad_value_is_refused_once(override) -> None:
    """The rule and the spec's own check both refused it, worded apart, as two values ("2
    values are refused", the second listing settings that were fine; probes 36 and 37)."""
    errors = train_errors(compose_config(["debug=smoke", override], output_dir="/x"))
    assert len(errors) == 1 and errors[0].startswith(f"{override}: must be"), errors
