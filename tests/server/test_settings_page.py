"""docs/settings.md is generated from the settings (server/settings.py): the committed page
is the generated one, and every setting has its flag, variable and default there."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from gclm.server.settings import ServerSettings, add_arguments, settings_page

PAGE = Path(__file__).parents[2] / "docs" / "settings.md"


def test_the_committed_page_is_the_generated_one() -> None:
    assert PAGE.read_text() == settings_page(), (
        "docs/settings.md is out of date: run `python -m gclm.server.settings > docs/settings.md`"
    )


def test_every_setting_has_a_row_and_a_flag() -> None:
    page = settings_page()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {a.dest: a for a in parser._actions if a.dest != "help"}
    for f in fields(ServerSettings):
        flag = "--" + f.name.replace("_", "-")
        assert f"| `{flag}` | `GCLM_{f.name.upper()}` |" in page
        assert flags[f.name].option_strings == [flag]
        assert flags[f.name].default is None  # unset flags fall through to the environment


def test_a_flag_parses_to_the_setting_it_names(tmp_path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--kv-memory", "2048", "--cache-dir", str(tmp_path)])
    settings = ServerSettings.from_env({"GCLM_PORT": "9000"}, **vars(args))
    assert (settings.kv_memory, settings.port, settings.cache_dir) == (2048, 9000, tmp_path)
    assert settings.max_step_seconds == ServerSettings().max_step_seconds  # unset: the default
