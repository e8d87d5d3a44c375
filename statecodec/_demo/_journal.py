"""The demo's record: where its keys and store live by default, and what happened, as one document.

``statecodec demo`` prints each event as it happens; what it found is also one JSON
document (``--json``), kept here from the same events: a Python caller of
:func:`._run.run` keeps the same record by passing :meth:`Journal.record` as its report.
The defaults are the demo's own too: a key ring file and a SQLite replay store in a
private data directory, created on the first run and reused after, so the demo never
picks up a service's keys by accident.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, assert_never

import platformdirs

from .._errors import StateCodecError
from .._humanize import duration
from ._cluster import Setup
from ._run import Answered, Event, Rejection, RoundOne, RoundTwo

KEYS_FILE: Final = "demo-keys.json"
REPLAY_FILE: Final = "demo-replay.sqlite3"


class DataDirError(StateCodecError):
    """The demo's data directory cannot be created (a file or input error, not a bug)."""


def default_data_dir() -> Path:
    """The user's data directory for statecodec (``platformdirs``), where the demo keeps its files."""
    return Path(platformdirs.user_data_dir("statecodec", appauthor=False))


@dataclass(frozen=True)
class Sources:
    """The demo's key source and replay store; ``keys_note`` says whether the ring is new."""

    keys: str
    replay: str
    keys_note: str = ""

    @classmethod
    def of(cls, keys: str | None, replay: str | None, folder: Path | None = None) -> Sources:
        """``keys`` and ``replay`` as given, each missing one embedded in ``folder`` (default: the user's).

        The key ring is created 0600 on the first run and reused after; the folder is 0700,
        as it holds a secret.
        """
        folder = default_data_dir() if folder is None else folder
        note = ""
        if keys is None:
            keys, note = _embedded_keys(folder)
        if replay is None:
            _private_dir(folder)
            replay = f"sqlite:{folder / REPLAY_FILE}"
        return cls(keys, replay, note)


def _private_dir(folder: Path) -> None:
    """The data directory, created 0700: it holds a secret key ring."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise DataDirError(f"cannot create the data directory {folder}: {exc.strerror}") from None


def _embedded_keys(folder: Path) -> tuple[str, str]:
    """``file:`` the demo's key ring, created 0600 on first run and reused after."""
    from ..kms import init_keys  # noqa: PLC0415 - hvac and friends load only when needed

    _private_dir(folder)
    path = folder / KEYS_FILE
    created = not path.exists()
    spec = f"file:{path}"
    init_keys(spec)  # never overwrites; an existing file must be a valid ring
    return spec, "created now, mode 600" if created else "reused from an earlier run"


class Journal:
    """The events of one run as the fields of one JSON document (docs/cli-schema.json's ``demo``)."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {"rejections": []}

    def record(self, event: Event) -> None:
        match event:
            case Setup():
                self.fields.update(
                    mode=event.mode.value,
                    keys=event.keys,
                    replay=event.replay,
                    primary_kid=event.primary_kid,
                    instances=[{"name": i.name, "service": i.service, "url": i.url} for i in event.instances],
                )
            case RoundOne():
                self.fields["round_one"] = {
                    "instance": event.instance,
                    "request_id": event.request_id,
                    "input_requests": event.questions,
                    "request_state": _token_fields(event.token, event.kid, event.issued_at, event.expires_at),
                }
            case Answered():
                self.fields["answers"] = event.answers
            case RoundTwo():
                self.fields["round_two"] = {
                    "instance": event.instance,
                    "request_id": event.request_id,
                    "outcome": event.outcome,
                }
            case Rejection():
                self.fields["rejections"].append(_rejection_fields(event))
            case _:
                assert_never(event)

    def finish(self, problems: list[str], elapsed: float) -> dict[str, Any]:
        """The whole document: the events, then the deviations and the time taken."""
        rejections = self.fields.pop("rejections")
        self.fields.update(rejections=rejections, deviations=problems, elapsed_seconds=round(elapsed, 2))
        return self.fields

    def hint(self) -> str | None:
        """Why a replayed token was accepted, when the setup explains it; else None."""
        replay_failed = any(r["attack"] == "replayed" and not r["ok"] for r in self.fields["rejections"])
        if replay_failed and str(self.fields.get("replay")).startswith("memory:"):
            return (
                "memory: gives every instance a replay store of its own, so B's redemption is "
                "unknown to A; share one store (sqlite:PATH on one machine, redis:// across machines)"
            )
        return None


def _rejection_fields(event: Rejection) -> dict[str, Any]:
    return {
        "attack": event.attack,
        "label": event.label,
        "instance": event.instance,
        "expected_reason": event.expected,
        "error": event.error,
        "reason": event.reason,
        "detail": event.detail,
        "ok": event.ok,
        "problems": list(event.problems),
    }


def _token_fields(token: str, kid: str, issued_at: int, expires_at: int) -> dict[str, Any]:
    return {
        "prefix": token.split(".", 1)[0] + ".",
        "chars": len(token),
        "kid": kid,
        "issued_at": issued_at,
        "expires_at": expires_at,
        "lifetime": duration(expires_at - issued_at),
    }
