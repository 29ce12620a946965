"""Every --help text of the `multihead` command reads as written: no `%%` left by a text that
argparse does not %-format (descriptions) or a `%(...)s` it did not fill."""

import argparse

from multihead.cli import build_parser


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_no_help_text_shows_format_escapes():
    parsers = list(_parsers(build_parser()))
    assert len(parsers) > 10  # every command and bench / train member
    for parser in parsers:
        text = parser.format_help()
        assert "%%" not in text, f"{parser.prog} --help shows '%%'"
        assert "%(" not in text, f"{parser.prog} --help shows an unfilled %(...)"


def test_syntax_help_says_95_percent():
    (syntax,) = [p for p in _parsers(build_parser()) if p.prog == "multihead syntax"]
    assert "bootstrap 95% interval" in " ".join(syntax.format_help().split())
