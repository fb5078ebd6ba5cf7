"""A setting of another option of its group is said to be that option's."""

from __future__ import annotations

from lightning_kd.launch.config import compose_config
from lightning_kd.launch.keys import unknown_setting_errors
from lightning_kd.launch.other_options import option_taking


def test_a_chat_setting_on_text_data_names_data_chat_not_a_near_text_setting() -> None:
    """``experiment=instruct_onpolicy data=text`` was told "did you mean data.domain_field?"
    for data.completion_field (probe 38)."""
    assert option_taking("data", "completion_field") == "chat"
    assert option_taking("data", "domain_feld") is None
    errors = unknown_setting_errors(compose_config(["experiment=instruct_onpolicy", "data=text"]))
    assert (
        "data.completion_field: TextDataModule takes no setting 'completion_field'; it is a "
        "setting of data=chat: choose data=chat, or drop it"
    ) in errors
    typo = unknown_setting_errors(compose_config(["debug=smoke", "+data.domain_feld=x"]))
    assert any(error.endswith("did you mean data.domain_field?") for error in typo)
