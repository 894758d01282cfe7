"""The held-call state machine (session/_input.py, issue 18): a 2026-07-28 session's call whose
handshake-era upstream asks for input, decided without sockets."""

from __future__ import annotations

import pytest

from mcpool.session._input import (
    INPUT_RETRY_TIMEOUT,
    MAX_ASKS_PER_CALL,
    STATE_PREFIX,
    Held,
    InputRefused,
    StateRejected,
    is_ours,
    subject_of,
)

CALL = {"name": "ask", "arguments": {"b": 1, "a": [2]}}
SUBJECT = subject_of("tools/call", "up", CALL)
ELICIT = {"message": "your name?", "requestedSchema": {"type": "object"}}


def asked_once(now: float = 0.0) -> tuple[Held, dict[str, object]]:
    held = Held(SUBJECT)
    held.ask(7, "elicitation/create", ELICIT)
    return held, held.input_required(now)


def test_an_upstream_request_becomes_an_input_required_result_with_a_fresh_state() -> None:
    held, result = asked_once()
    assert result == {
        "resultType": "input_required",
        "inputRequests": {"elicitation-1": {"method": "elicitation/create", "params": ELICIT}},
        "requestState": held.state,
    }
    assert is_ours(result["requestState"])
    assert str(result["requestState"]).startswith(STATE_PREFIX)
    assert not held.waiting
    _other, again = asked_once()
    assert again["requestState"] != result["requestState"]  # unguessable, never reused


def test_a_retry_answers_the_upstream_and_waits_for_the_call() -> None:
    held, _ = asked_once()
    answer = {"action": "accept", "content": {"name": "Ada"}}
    retry = held.retry(SUBJECT, {"elicitation-1": answer, "unknown": {"x": 1}}, now=1.0)
    assert [(a.upstream_id, r) for a, r in retry.answers] == [(7, answer)]
    assert retry.then == "wait"
    assert held.waiting and held.state is None and not held.asks


def test_a_retry_is_good_once() -> None:
    held, _ = asked_once()
    held.retry(SUBJECT, {"elicitation-1": {"action": "decline"}}, now=1.0)
    with pytest.raises(StateRejected) as caught:
        held.retry(SUBJECT, {"elicitation-1": {"action": "decline"}}, now=2.0)
    assert caught.value.data["requestState"] == "used"


def test_a_retry_after_the_timeout_is_rejected_and_the_call_counts_as_expired() -> None:
    held, _ = asked_once(now=10.0)
    assert not held.expired(10.0 + INPUT_RETRY_TIMEOUT - 1)
    assert held.expired(10.0 + INPUT_RETRY_TIMEOUT)
    with pytest.raises(StateRejected) as caught:
        held.retry(SUBJECT, {}, now=10.0 + INPUT_RETRY_TIMEOUT)
    assert caught.value.data["requestState"] == "expired"
    assert held.asks  # untouched: the expiry answers the upstream


@pytest.mark.parametrize(
    ("method", "server", "params"),
    [
        ("prompts/get", "up", CALL),
        ("tools/call", "other", CALL),
        ("tools/call", "up", {"name": "other", "arguments": CALL["arguments"]}),
        ("tools/call", "up", {"name": "ask", "arguments": {"b": 2, "a": [2]}}),
    ],
)
def test_a_state_presented_on_another_request_is_rejected(
    method: str, server: str, params: dict[str, object]
) -> None:
    held, _ = asked_once()
    with pytest.raises(StateRejected) as caught:
        held.retry(subject_of(method, server, params), {}, now=1.0)
    assert caught.value.data["requestState"] == "mismatch"
    assert not held.waiting and held.asks  # the held call still waits for the right retry


def test_arguments_match_whatever_their_key_order() -> None:
    held, _ = asked_once()
    reordered = subject_of("tools/call", "up", {"name": "ask", "arguments": {"a": [2], "b": 1}})
    assert held.retry(reordered, {}, now=1.0).then == "ask"


def test_input_the_client_left_out_is_asked_for_again() -> None:
    held = Held(SUBJECT)
    held.ask(1, "elicitation/create", ELICIT)
    held.ask(2, "sampling/createMessage", {"messages": [], "maxTokens": 5})
    first = held.input_required(0.0)
    assert list(first["inputRequests"]) == ["elicitation-1", "sampling-2"]  # type: ignore[call-overload]
    retry = held.retry(SUBJECT, {"sampling-2": {"role": "assistant"}}, now=1.0)
    assert [a.upstream_id for a, _ in retry.answers] == [2]
    assert retry.then == "ask"
    second = held.input_required(1.0)
    assert list(second["inputRequests"]) == ["elicitation-1"]  # type: ignore[call-overload]


def test_an_answer_that_came_while_no_request_waited_is_the_retrys() -> None:
    held, _ = asked_once()
    held.final = object()
    assert held.retry(SUBJECT, {}, now=1.0).then == "final"


def test_a_request_the_upstream_cancelled_is_not_asked_again() -> None:
    held, _ = asked_once()
    assert held.drop(7) and not held.drop(7)
    assert held.retry(SUBJECT, {}, now=1.0).then == "wait"


def test_input_requests_are_bounded_per_call_and_only_known_methods_travel() -> None:
    held = Held(SUBJECT)
    with pytest.raises(InputRefused):
        held.ask(1, "tools/call", None)
    for n in range(MAX_ASKS_PER_CALL):
        held.ask(n, "roots/list", None)
    with pytest.raises(InputRefused):
        held.ask(-1, "roots/list", None)


def test_a_resource_reads_subject_is_its_uri() -> None:
    read = subject_of("resources/read", "up", {"uri": "note://a"})
    assert read == subject_of("resources/read", "up", {"uri": "note://a", "requestState": "x"})
    assert read != subject_of("resources/read", "up", {"uri": "note://b"})
