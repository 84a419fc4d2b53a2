"""The help formatter of GE2's command lines: every flag's help ends with its default."""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions as written; "(default: X)" after every flag's help, except where the help already says its
    default, the flag is a switch, or it has none (required, or absent unless given)."""

    def _get_help_string(self, action):
        if action.default is None or isinstance(action.default, bool) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)
