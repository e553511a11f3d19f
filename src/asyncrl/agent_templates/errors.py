"""The one error of agent templates, shared by the renderer, the structure check and the pod policy."""

from __future__ import annotations

MAX_MESSAGE_CHARS = 400


class TemplateError(ValueError):
    """The template does not render to exactly one valid agent Job; the message (one line) says where and why.

    `row_dependent`: the failure came from a value missing from the row, so a render for a placeholder row
    (the operator does not read a run's ConfigMap or file data) cannot tell a template bug from a row shape.
    """

    def __init__(self, message: str, *, row_dependent: bool = False) -> None:
        super().__init__(one_line(message))
        self.row_dependent = row_dependent


def one_line(message: str) -> str:
    """A message fit for an Event or a condition: one line, bounded."""
    text = " ".join(message.split())
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"
