"""A command's own exit code survives both wrappers, whichever click typer brings: typer 0.2x
vendors click, so its Exit is not the installed click's."""

from __future__ import annotations

import click
import pytest
import typer

from ledgerloop.cli.common import user_errors
from ledgerloop.cli.exiting import _exit_code


@pytest.mark.parametrize("exit_class", [typer.Exit, click.exceptions.Exit])
def test_an_exit_passes_user_errors_and_keeps_its_code(
    exit_class: type[Exception], capsys: pytest.CaptureFixture[str]
) -> None:
    @user_errors
    def command() -> None:
        raise exit_class(3)

    with pytest.raises(exit_class) as raised:
        command()
    assert _exit_code(raised.value) == 3
    assert capsys.readouterr().err == ""  # not "error: unexpected Exit"


def test_a_usage_error_of_typers_click_is_not_unexpected() -> None:
    @user_errors
    def command() -> None:
        raise typer.BadParameter("no")

    with pytest.raises(typer.BadParameter):
        command()
