"""The ``teachers`` list is checked with the config, before the data is read or a model loads."""

from __future__ import annotations

from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.entry import teacher_length

TWO = "teachers=[{name: a, weight: 0.5}, {name: b, weight: 0.5, path: gemma3_270m%s}]"


def errors(*overrides: str) -> list[str]:
    return [e for e in config_errors(compose_config(["debug=smoke", *overrides])) if "teach" in e]


def test_a_list_that_reads_passes_and_one_that_does_not_is_named() -> None:
    assert errors(TWO % "") == []
    assert errors("teachers={name: a, weight: 1.0}") == [
        "teachers={'name': 'a', 'weight': 1.0}: give a list of entries, e.g. teachers=[{name: "
        "smollm2, weight: 0.5}, {name: gemma, weight: 0.5, path: gemma3_270m}]"
    ]
    # The main entry's cache is refused whatever it is, auto included (auto once went online
    # unchecked, or wrote the whole cache before the refusal).
    (error,) = errors("teachers=[{name: a, weight: 1.0, cache: auto}]")
    assert error.startswith("teachers[0].cache: this entry is the teacher group's model")


def test_a_name_that_would_break_a_metric_or_a_table_row_is_refused() -> None:
    """'a|b' split the summary's table rows (probe 27); a dot stays (qwen2.5)."""
    assert errors("teachers=[{name: a, weight: 0.5}, {name: qwen2.5, weight: 0.5, path: x}]") == []
    (error,) = errors("teachers=[{name: a, weight: 0.5}, {name: 'a|b', weight: 0.5, path: x}]")
    assert error.startswith("teachers: names ['a|b'] hold other characters than letters")


def test_the_domains_an_entry_teaches_are_the_datas() -> None:
    domains = "data.domains={prose: [a.txt], code: [b.txt]}"
    assert errors(TWO % ", domains: [code]", domains) == []
    assert errors(TWO % ", domains: [cod]", domains) == [
        "teachers[1] (b).domains names 'cod', which data.domains does not have; did you mean "
        "'code'? the data's domains: prose, code"
    ]
    only = (
        "teachers=[{name: a, weight: 0.5, domains: [code]}, "
        "{name: b, weight: 0.5, path: x, domains: [code]}]"
    )
    assert errors(only, domains) == [
        "data.domains ['prose'] are taught by no teacher (their rows would train on CE alone): "
        "add them to a teacher's domains, or drop them from data.domains and their files from "
        "data.files"
    ]
    assert errors(TWO % ", domains: [code]") == [
        "teachers: an entry names domains, and the data has none: set data.domains "
        "({name: [files]}, each of data.files in one) or drop the entries' domains"
    ]


def test_teachers_by_domain_with_on_policy_kd_are_refused_before_anything_loads() -> None:
    """It was a ValueError traceback once both teachers had loaded."""
    domains = "data.domains={prose: [a.txt], code: [b.txt]}"
    assert errors(TWO % ", domains: [code]", domains, "distill.on_policy=0.5") == [
        "teachers by domain and distill.on_policy: the student's completions carry no domain, "
        "so no teacher would be known to teach them; set distill.on_policy=0 or drop the "
        "entries' domains"
    ]
    assert errors(TWO % "", domains, "distill.on_policy=0.5") == []


def test_several_teachers_without_the_chunked_loss_are_refused_before_anything_loads() -> None:
    """It was found once the models loaded (8 s in; a traceback from each DDP rank)."""
    assert errors(TWO % "", "distill.chunked=false") == [
        "teachers: several teachers need the chunked loss; drop distill.chunked=false"
    ]


def test_an_entrys_bad_teacher_key_is_named_for_the_entry() -> None:
    """An entry's dtype or quantize that TeacherSpec refuses was a ValueError traceback naming
    teacher.dtype, the teacher group's key, which the user had not set."""
    assert errors(TWO % ", quantize: int4") == [
        "teachers[1].quantize='int4' is not supported; choose one of ['int8'] (weight-only, "
        "torchao) or null for a full-precision teacher"
    ]
    assert errors(TWO % ", dtype: float65") == [
        "teachers[1].dtype='float65' is not a dtype here; choose one of ['auto', 'bfloat16', "
        "'float16', 'float32', 'float64']"
    ]


def test_an_entrys_own_config_is_checked_for_the_entry() -> None:
    """An entry's config is its model's whole config (not merged with the teacher group's):
    one without model_type was refused as teacher.config once the DDP processes had started."""
    own = "teachers=[{name: a, weight: 0.5}, {name: b, weight: 0.5, config: %s}]"
    assert errors(own % "{num_hidden_layers: 3}") == [
        "teachers[1].config needs model_type: an entry's config is its model's whole config, not "
        "changes to teacher.config (e.g. {model_type: llama, num_hidden_layers: 3, ...})"
    ]
    assert errors(own % "{model_type: lama}") == [
        "teachers[1].config.model_type='lama' is not a transformers model type; did you mean llama?"
    ]
    small = "{model_type: llama, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2, "
    small += "num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 256}"
    assert errors(own % small) == []


def test_the_block_is_checked_against_each_entrys_positions() -> None:
    """A block beyond a learned-position entry's positions was an IndexError in the first step."""
    gpt2 = "{model_type: gpt2, n_embd: 32, n_layer: 2, n_head: 4, n_positions: %d, vocab_size: 257}"
    entries = "teachers=[{name: a, weight: 0.5}, {name: s, weight: 0.5, config: %s}]"
    cfg = compose_config(["debug=smoke", entries % (gpt2 % 16), "data.block_size=32"])
    assert teacher_length(cfg, "data.block_size").errors() == [
        "data.block_size=32 is longer than teachers[1] (s)'s 16 positions (config "
        "max_position_embeddings); set data.block_size=16 or less"
    ]
    cfg = compose_config(["debug=smoke", entries % (gpt2 % 64), "data.block_size=32"])
    assert teacher_length(cfg, "data.block_size").errors() == []
