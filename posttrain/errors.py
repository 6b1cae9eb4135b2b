"""Errors that are the user's to fix.

`UserError` is raised for bad input: malformed YAML or JSONL, unknown config keys, wrong types,
missing files or fields. Its message names the file and the key or line. The CLI prints it on
one line (no traceback) and exits with status 2; anything else is a bug and exits 1.
"""


class UserError(Exception):
    """Bad input from the user. The message must name the file and the key or line."""
