#!/usr/bin/env python
"""Django's command-line utility; a bad setting is reported in one line, not a stack trace."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch_site.settings")
    from dispatch_site.config import ConfigError, load_config

    try:
        load_config()
    except ConfigError as exc:
        sys.stderr.write(f"dispatch: configuration error: {exc}\n")
        sys.exit(2)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
