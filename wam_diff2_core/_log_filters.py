"""Drops one known-harmless log line a dependency prints on every command.

torchao (imported by transformers when it is installed, as the ``quant`` extra installs it) registers two
of its enums with torch's pytree; torch 2.14 logs a deprecation warning for each, on every start of every
entry point. The registration is torchao's and works; the lines say nothing a user can act on. This filter
drops exactly those records, nothing else of that logger; it is installed on the package's first import, before torch.
"""
from __future__ import annotations

import logging

PYTREE_LOGGER = "torch.utils._pytree"
ENUM_NOTICE = "is an Enum subclass and is now natively supported by torch.compile"


class _DropEnumNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return ENUM_NOTICE not in record.getMessage()


def drop_known_notices() -> None:
    """Install the filter once (idempotent)."""
    logger = logging.getLogger(PYTREE_LOGGER)
    if not any(isinstance(f, _DropEnumNotice) for f in logger.filters):
        logger.addFilter(_DropEnumNotice())
