"""The ``gangflow`` command line."""

from engine.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
