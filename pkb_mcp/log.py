"""Structured logs: JSON lines on stderr, never stdout (stdout carries results and MCP over stdio)."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure(level: str = "warning", file: TextIO | None = None) -> None:
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        # sys.stderr is looked up at each use: it may be replaced after this (pytest's capture does)
        logger_factory=lambda *_: structlog.PrintLogger(file or sys.stderr),
        cache_logger_on_first_use=False,
    )


configure()  # quiet JSON on stderr until a command line or server asks for more


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)
