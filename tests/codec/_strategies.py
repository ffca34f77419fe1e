"""Hypothesis strategies for valid records of every format."""

from __future__ import annotations

from hypothesis import strategies as st

from purgatory._codec import (
    CancelRequest,
    RegisterRequest,
    SignalRecord,
    WatermarkRecord,
    canonical_json,
)
from purgatory._core import MAX_TIME_MS, Condition, Outcome, OutcomeKind, TimeDomain

# st.text() never draws lone surrogates, which are not Unicode and cannot travel as UTF-8.
names = st.text(min_size=1, max_size=12)
times = st.integers(0, MAX_TIME_MS)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
# A JSON null payload is no payload (None): the stored text is never "null".
payloads = st.none() | json_values.filter(lambda v: v is not None).map(canonical_json)
topics = st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True).filter(
    lambda t: t not in {".", ".."}
)


@st.composite
def registers(draw: st.DrawFn) -> RegisterRequest:
    keys = tuple(draw(st.lists(names, unique=True, max_size=8)))
    condition = draw(st.sampled_from(Condition)) if keys else Condition.ALL
    count = draw(st.integers(1, len(keys))) if condition is Condition.COUNT else None
    domain = draw(st.sampled_from(TimeDomain))
    deadline: int | None = draw(times)
    timeout: int | None = None
    if domain is TimeDomain.PROCESSING_TIME and draw(st.booleans()):
        deadline, timeout = None, deadline
    return RegisterRequest(
        op_id=draw(names),
        scope=draw(names),
        keys=keys,
        condition=condition,
        count=count,
        deadline_ms=deadline,
        timeout_ms=timeout,
        time_domain=domain,
        payload=draw(payloads),
        reply_to=draw(st.none() | topics),
    )


cancels = st.builds(CancelRequest, op_id=names, scope=names)
requests = registers() | cancels
signals = st.builds(
    SignalRecord, scope=names, key=names, event_time_ms=st.none() | times, payload=payloads
)
watermarks = st.builds(WatermarkRecord, scope=names, watermark_ms=times)
signal_inputs = signals | watermarks


@st.composite
def outcomes(draw: st.DrawFn) -> Outcome:
    keys = draw(st.lists(names, unique=True, max_size=8))
    signalled = [k for k in keys if draw(st.booleans())]
    return Outcome(
        op_id=draw(names),
        scope=draw(names),
        outcome=draw(st.sampled_from(OutcomeKind)),
        registered_ms=draw(times),
        outcome_ms=draw(times),
        deadline_ms=draw(times),
        time_domain=draw(st.sampled_from(TimeDomain)),
        sequence=draw(st.integers(1, 2**63 - 1)),
        keys=tuple(signalled),
        missing=tuple(k for k in keys if k not in signalled),
        signals={k: draw(payloads) for k in signalled},
        payload=draw(payloads),
        reply_to=draw(st.none() | topics),
        late=draw(st.booleans()),
    )


dead_letter_args = st.fixed_dictionaries(
    {
        "reason": st.text(),
        "field": st.none() | st.text(),
        "topic": topics,
        "partition": st.integers(0, 2**31 - 1),
        "offset": st.integers(0, 2**63 - 1),
        "timestamp_ms": st.none() | st.integers(-1, MAX_TIME_MS),
        "key": st.none() | st.binary(max_size=20) | st.text(max_size=20).map(str.encode),
        "value": st.none() | st.binary(max_size=200) | st.text(max_size=200).map(str.encode),
        "max_value_bytes": st.integers(0, 300),
    }
)
