"""The console history's folding, in-process: the events one action made are one row, the action's, with its steps
under it; separate actions, actors, models or sources stay separate rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from edged.frontends.console.history import FOLD_WINDOW_S, fold, page_rows, word
from edged.state.audit import Event

START = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def _events(*steps: tuple[str, int | None], model: str = "m", actor: str | None = "user:otto",
            source: str = "console", gap_s: float = 0.1, start: int = 0) -> list[Event]:  # fmt: skip
    """Transitions in the order they happened (oldest first)."""
    return [
        Event(
            "transition",
            start + i,
            START + timedelta(seconds=(start + i) * gap_s),
            source,
            actor,
            action,
            model,
            version,
            None,
            None,
            "",
            None,
            None,
        )
        for i, (action, version) in enumerate(steps)
    ]


def _newest_first(events: list[Event]) -> list[Event]:
    return sorted(events, key=lambda e: e.at, reverse=True)


ACTIVATION = (("LOADING", None), ("LOADING", 1), ("READY", 1), ("ACTIVATED", None), ("UNLOADING", 3), ("UNLOADED", 3))


def test_an_activation_is_one_row_under_its_action() -> None:
    rows = fold(_newest_first(_events(*ACTIVATION)))
    assert len(rows) == 1
    assert rows[0].head.action == "ACTIVATED"
    assert [step.action for step in rows[0].steps] == [a for a, _ in ACTIVATION]


def test_an_unload_after_a_load_is_a_row_of_its_own() -> None:
    load = (("LOADING", None), ("LOADING", 1), ("READY", 1))
    unload = (("UNLOADING", 1), ("UNLOADED", 1))
    rows = fold(_newest_first(_events(*load, *unload, ("LOADING", None), ("LOADING", 1), ("READY", 1))))
    assert [row.head.action for row in rows] == ["READY", "UNLOADED", "READY"]
    assert [len(row.steps) for row in rows] == [3, 2, 3]


def test_two_actions_never_share_a_row() -> None:
    rollback = (
        ("LOADING", None),
        ("LOADING", 3),
        ("READY", 3),
        ("ROLLED_BACK", None),
        ("UNLOADING", 1),
        ("UNLOADED", 1),
    )
    rows = fold(_newest_first(_events(*ACTIVATION, *rollback)))
    assert [row.head.action for row in rows] == ["ROLLED_BACK", "ACTIVATED"]


def test_other_models_actors_sources_and_late_events_are_separate() -> None:
    mine = _events(("LOADING", None), ("READY", 1))
    other_model = _events(("UNLOADED", 1), model="n", start=10)
    other_actor = _events(("UNLOADED", 1), actor="token:ci", start=20)
    late = _events(("UNLOADED", 1), start=int(FOLD_WINDOW_S * 20), gap_s=0.1)
    rows = fold(_newest_first(mine + other_model + other_actor + late))
    assert [(row.head.target, row.head.action, len(row.steps)) for row in rows] == [
        ("m", "UNLOADED", 0),
        ("m", "UNLOADED", 0),
        ("n", "UNLOADED", 0),
        ("m", "READY", 2),
    ]


def test_an_upload_and_the_load_it_led_to_are_one_row() -> None:
    rows = fold(_newest_first(_events(("UPLOADED", 2), ("LOADING", None), ("LOADING", 2), ("READY", 2),
                                      ("SERVING", None), source="upload")))  # fmt: skip
    assert len(rows) == 1 and rows[0].head.action == "UPLOADED"


def test_a_page_never_ends_in_half_an_action() -> None:
    """A model's page and the overview read past the page's end: an action it would cut in two is folded whole
    and left to the next page, which begins where the rows shown end."""
    unload = _events(("UNLOADING", 1), ("UNLOADED", 1), start=100)  # the version it brought up: a later action
    events = _newest_first(_events(*ACTIVATION) + unload)
    rows, held = page_rows(events, 5)
    assert [row.head.action for row in rows] == ["UNLOADED"] and held == 2
    rows, held = page_rows(events[held:], 5)
    # One action larger than a page is shown all the same, rather than nothing.
    assert [row.head.action for row in rows] == ["ACTIVATED"] and held == len(ACTIVATION)
    assert [len(row.steps) for row in page_rows(events, 8)[0]] == [2, len(ACTIVATION)]


def test_plain_words() -> None:
    assert [word(a) for a in ("ROLLED_BACK", "UPLOAD_REMOVED", "SERVING", "READY", "token-create")] == [
        "rolled back",
        "upload removed",
        "now serving",
        "ready",
        "token-create",
    ]


def test_the_interleaved_loads_of_a_start_fold_under_their_own_models() -> None:
    """At start every model loads at once: their events interleave, and each model's still folds into one row."""
    load = (("LOADING", None), ("LOADING", 1), ("READY", 1))
    a = _events(*load, model="a", actor=None, source="startup", gap_s=1.0, start=0)
    b = _events(*load, model="b", actor=None, source="startup", gap_s=1.0, start=0)
    interleaved = [event for pair in zip(a, b, strict=True) for event in pair]  # a, b, a, b, ... oldest first
    rows = fold(list(reversed(interleaved)))
    assert [(row.head.target, row.head.action, len(row.steps)) for row in rows] == [
        ("b", "READY", 3),
        ("a", "READY", 3),
    ]
