"""The ``mccloud-help`` directive: every ``mccloud`` command's ``--help``,
generated from the installed package's parser, so the command-line
reference cannot drift from the code."""

from __future__ import annotations

import argparse
import os
from typing import Any, Iterator

from docutils import nodes
from sphinx.util.docutils import SphinxDirective


def _commands(parser: argparse.ArgumentParser, prefix: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``(command line, parser)`` of ``parser`` and of every subcommand
    below it, depth first, in the order they were declared."""
    yield prefix, parser
    for action in parser._actions:  # argparse keeps subparsers there only
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prefix} {name}")


class MccloudHelp(SphinxDirective):
    """Renders one section per command with its ``--help`` text."""

    def run(self) -> list[Any]:
        from mccloud import cli

        # The help is formatted for an 80-column terminal, whatever this one is.
        os.environ["COLUMNS"] = "80"
        out: list[Any] = []
        for line, parser in _commands(cli._parser(), "mccloud"):
            section = nodes.section(ids=[nodes.make_id(line)])
            section += nodes.title(text=line)
            section += nodes.literal_block(text=parser.format_help().rstrip())
            out.append(section)
        return out


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("mccloud-help", MccloudHelp)
    return {"parallel_read_safe": True, "version": "1"}
