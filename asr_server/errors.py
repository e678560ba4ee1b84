"""Errors that end a call, each with the one status it maps to (see transport/status.py)."""

from __future__ import annotations

import enum


class Status(enum.Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # bad or missing config, unsupported format, bad audio
    FAILED_PRECONDITION = "FAILED_PRECONDITION"  # audio before config, config twice
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # too many streams
    OUT_OF_RANGE = "OUT_OF_RANGE"  # stream too long
    UNAVAILABLE = "UNAVAILABLE"  # draining, model not loaded
    INTERNAL = "INTERNAL"  # engine failure (with an error id in the log)
    UNAUTHENTICATED = "UNAUTHENTICATED"  # no or wrong token / client certificate
    PERMISSION_DENIED = "PERMISSION_DENIED"  # known client, call not allowed
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"  # no config in time, or an idle stream


class AsrError(Exception):
    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    @classmethod
    def invalid(cls, message: str) -> AsrError:
        return cls(Status.INVALID_ARGUMENT, message)

    @classmethod
    def precondition(cls, message: str) -> AsrError:
        return cls(Status.FAILED_PRECONDITION, message)
