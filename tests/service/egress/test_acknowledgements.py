"""The acknowledgements: each acknowledged outcome to each listener, the listeners in the order
they were added, against a model of who heard what."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from purgatory._core import Outcome
from purgatory.service.egress.acknowledgements import Acknowledgements
from tests.service.egress.parts import outcome


def test_each_outcome_goes_to_every_listener_in_the_order_they_were_added() -> None:
    acks = Acknowledgements()
    heard: list[tuple[str, str]] = []
    acks.listen(lambda o: heard.append(("waiters", o.op_id)))
    acks.listen(lambda o: heard.append(("recent", o.op_id)))
    acks.delivered(outcome(1))
    acks.delivered(outcome(2))
    assert heard == [("waiters", "op1"), ("recent", "op1"), ("waiters", "op2"), ("recent", "op2")]


def test_with_no_listener_an_acknowledgement_goes_nowhere() -> None:
    Acknowledgements().delivered(outcome(1))


def test_a_listener_added_later_hears_only_what_is_acknowledged_from_then_on() -> None:
    acks = Acknowledgements()
    early: list[Outcome] = []
    late: list[Outcome] = []
    acks.listen(early.append)
    acks.delivered(outcome(1))
    acks.listen(late.append)
    acks.delivered(outcome(2))
    assert early == [outcome(1), outcome(2)] and late == [outcome(2)]


def _noting(told: list[tuple[int, int]], index: int) -> Callable[[Outcome], None]:
    def listener(done: Outcome) -> None:
        told.append((index, done.sequence))

    return listener


@given(st.lists(st.one_of(st.just("listen"), st.integers(0, 99)), max_size=30))
def test_every_listener_hears_every_later_outcome_once_in_order(steps: list[str | int]) -> None:
    """The model: listener ``n`` hears exactly the outcomes delivered after the ``n``-th
    ``listen``, and at each delivery the listeners are told in the order they were added."""
    acks = Acknowledgements()
    told: list[tuple[int, int]] = []  # (listener, sequence), in call order
    listeners = 0
    expected: list[tuple[int, int]] = []
    for step in steps:
        if step == "listen":
            acks.listen(_noting(told, listeners))
            listeners += 1
        else:
            assert isinstance(step, int)
            acks.delivered(outcome(step))
            expected += [(index, step) for index in range(listeners)]
    assert told == expected
