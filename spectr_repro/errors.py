"""The project's exceptions that cross package boundaries, in one place (imported by every layer, importing none).

Each is a message for the user: the command-line entry points print it without a traceback and exit with status 2
(UsageError, ConfigFolderError, SchemaError, HubDataError) or report the cell it stopped (ResourceError). Errors
that stay inside one module (a docs block, a bench file, the sandbox) are defined there.
"""

from __future__ import annotations

import sys


class UsageError(ValueError):
    """Bad command-line input: the CLI prints the message (no traceback) and exits with status 2."""


class ResourceError(RuntimeError):
    """A model pair or dataset cannot be loaded (missing weights or data): reported without a traceback."""


class SchemaError(ValueError):
    """A summary or record that does not fit the schema; the message names the file."""


class HubDataError(ValueError):
    """A dataset could not be read from the hub (not cached offline, no such files, no network)."""


class ConfigFolderError(ValueError):
    """The config folder does not exist or has no config.yaml."""


def exit_at_the_door(error: UsageError | ResourceError) -> int:
    """Say why a command stopped before loading any model, and its exit status: 2 for bad input, 1 for a dataset
    (or other resource) that cannot be read. Every command that loads models checks both at its door."""
    if isinstance(error, ResourceError):
        print(f"error: {error}\n(nothing was loaded or written)", file=sys.stderr)
        return 1
    print(f"error: {error}", file=sys.stderr)
    return 2


__all__ = ["ConfigFolderError", "HubDataError", "ResourceError", "SchemaError", "UsageError", "exit_at_the_door"]
