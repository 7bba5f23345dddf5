"""Process settings are read once, from one mapping, and refused when they would change
meaning with the working folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprobox.core.errors import BadInput
from reprobox.core.settings import Settings, repro_cache


def test_settings_come_from_the_mapping_given(tmp_path: Path) -> None:
    env = {
        "REPROBOX_ROOT": str(tmp_path),
        "REPROBOX_RESULTS": str(tmp_path / "r"),
        "REPROBOX_CACHE": str(tmp_path / "c"),
        "REPROBOX_FIND_LINKS": "/a /b",
        "PIP_FIND_LINKS": "/b /c",
        "REPROBOX_REFRESH_INDEX": "1",
        "CI": "true",
    }
    settings = Settings.from_env(env)
    assert settings.root == tmp_path.resolve()
    assert (settings.results, settings.cache) == (tmp_path / "r", tmp_path / "c")
    assert settings.find_links == ("/a", "/b", "/c")
    assert settings.refresh_index and settings.ci
    assert repro_cache(settings, "kl") == tmp_path / "c" / "repro-cache" / "kl"


def test_defaults_follow_the_checkout_and_the_cache_home(tmp_path: Path) -> None:
    settings = Settings.from_env({"REPROBOX_ROOT": str(tmp_path), "XDG_CACHE_HOME": "/xdg"})
    assert settings.results == tmp_path.resolve() / "results"
    assert settings.cache == Path("/xdg/reprobox")
    assert not settings.ci and settings.script_cache is None


def test_the_host_torch_settings_are_read_once_here() -> None:
    """REPROBOX_TORCH_SOURCE=host takes torch from REPROBOX_HOST_PYTHON (default python3)."""
    assert Settings.from_env({}).host_python == "python3"
    host = Settings.from_env(
        {"REPROBOX_TORCH_SOURCE": "host", "REPROBOX_HOST_PYTHON": "/cluster/bin/python"}
    )
    assert (host.torch_source, host.host_python) == ("host", "/cluster/bin/python")
    with pytest.raises(BadInput, match="expected one of cpu, pypi, host"):
        Settings.from_env({"REPROBOX_TORCH_SOURCE": "system"})


@pytest.mark.parametrize("name", ["REPROBOX_RESULTS", "REPROBOX_CACHE", "REPRO_CACHE"])
def test_a_relative_folder_is_refused(name: str) -> None:
    with pytest.raises(BadInput, match=f"{name}='results' must be an absolute path"):
        Settings.from_env({name: "results"})


def test_the_cli_says_so_in_one_line(toy_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import reprobox

    monkeypatch.setenv("REPROBOX_RESULTS", "results")
    done = reprobox("table", "toy")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "reprobox: error: REPROBOX_RESULTS='results' must be an absolute path"
    ]


def test_the_ci_run_and_step_summary_are_settings(tmp_path: Path) -> None:
    """GitHub's run variables are read with the others, so nothing below the CLI reads them."""
    from reprobox.report.build import plot_note

    run = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r"}
    assert Settings.from_env(run).ci_run_url is None  # one part missing: no link guessed
    settings = Settings.from_env(
        {**run, "GITHUB_RUN_ID": "42", "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    )
    assert settings.ci_run_url == "https://github.com/o/r/actions/runs/42"
    assert settings.step_summary == tmp_path / "summary.md"
    assert plot_note(3, settings.ci_run_url) == (
        "*report.html, with 3 plots embedded, is in the artifacts of "
        "https://github.com/o/r/actions/runs/42.*"
    )
    assert plot_note(3, None) == ""  # the reader has no report folder: not mentioned
