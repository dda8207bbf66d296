"""The project's exceptions that cross package boundaries, in one place (imported by every layer, importing none).

Each is a message for the user: the command-line entry points print it without a traceback and exit with status 2
(UsageError, ConfigFolderError, SchemaError, HubDataError) or report the cell it stopped (ResourceError). Errors
that stay inside one module (a docs block, a bench file, the sandbox) are defined there.
"""

from __future__ import annotations


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


__all__ = ["ConfigFolderError", "HubDataError", "ResourceError", "SchemaError", "UsageError"]
