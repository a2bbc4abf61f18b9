"""Where a place of the policy file is written: `tools.refund.requires_approval.when.all[0]`
-> its line, so an error names the line to fix as well as the field.

The file is composed once more into YAML nodes (which keep their positions) when it is
loaded; a place is followed key by key and index by index as far as the file has it, and
the deepest line reached is the answer (a missing `when:` points at its `requires_approval:`).
"""

from __future__ import annotations

import re

import yaml

_PART = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


def _parts(where: str) -> list[str | int]:
    """`tools.refund.when.all[0].gte` -> ["tools", "refund", "when", "all", 0, "gte"]."""
    return [int(index) if index else name for index, name in _PART.findall(where)]


class PolicyLines:
    """The line (1-based) of each place in one YAML document."""

    def __init__(self, text: str) -> None:
        try:
            self._root: yaml.Node | None = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            self._root = None  # the load itself reports it, with its own line

    def line(self, where: str) -> int | None:
        """The line of `where`, or of its deepest part the file has; None for an empty file."""
        node = self._root
        if node is None:
            return None
        line = node.start_mark.line + 1
        for part in _parts(where):
            if isinstance(node, yaml.MappingNode):
                found = next(
                    (
                        (key, value)
                        for key, value in node.value
                        if isinstance(key, yaml.ScalarNode) and key.value == str(part)
                    ),
                    None,
                )
                if found is None:
                    break
                line = found[0].start_mark.line + 1
                node = found[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if part >= len(node.value):
                    break
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return line
