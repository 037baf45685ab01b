"""Library log messages that say nothing actionable about the user's export, kept off the user's terminal while a
stage runs, unless the user turned that logger up to INFO or DEBUG."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping


class _DropMessages(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(fragment in str(record.msg) for fragment in self.fragments)


@contextlib.contextmanager
def without_messages(fragments_by_logger: Mapping[str, tuple[str, ...]]) -> Iterator[None]:
    """Drop the records of each named logger whose message contains one of its fragments, for the duration."""
    installed = []
    for name, fragments in fragments_by_logger.items():
        logger = logging.getLogger(name)
        if not logger.isEnabledFor(logging.INFO):
            installed.append((logger, _DropMessages(fragments)))
            logger.addFilter(installed[-1][1])
    try:
        yield
    finally:
        for logger, message_filter in installed:
            logger.removeFilter(message_filter)
