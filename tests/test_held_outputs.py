"""Streamed outputs held within ``stream_interval_ms`` (sweep/serving/held_outputs.py), with transformers' own
``GenerationOutput`` and a clock the test moves: what is held, what is sent at once, the newest per sequence."""

from __future__ import annotations

from transformers.generation.continuous_batching.requests import GenerationOutput, RequestStatus

from sweep.serving.held_outputs import HeldOutputs


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def output(rid: str, tokens: list[int], status: RequestStatus = RequestStatus.DECODING,
           error: str | None = None) -> GenerationOutput:
    return GenerationOutput(request_id=rid, generated_tokens=tokens, status=status, error=error)


def sent(outputs: list[GenerationOutput]) -> dict[str, list[int]]:
    return {o.request_id: o.generated_tokens for o in outputs}


def test_no_interval_sends_every_step() -> None:
    held = HeldOutputs(0.0, Clock())
    assert sent(held.take([output("a", [1, 2])])) == {"a": [1, 2]}
    assert sent(held.take([output("a", [1, 2, 3])])) == {"a": [1, 2, 3]}


def test_steps_within_the_interval_are_held_and_the_newest_of_each_sequence_sent() -> None:
    clock = Clock()
    held = HeldOutputs(0.010, clock)
    assert sent(held.take([output("a", [1]), output("b", [7])])) == {"a": [1], "b": [7]}  # first tokens: at once
    clock.now += 0.004
    assert held.take([output("a", [1, 2]), output("b", [7, 8])]) == []
    clock.now += 0.004
    assert held.take([output("a", [1, 2, 3])]) == []  # b had no output this step: its last one stays held
    clock.now += 0.004  # 12 ms since the last message
    assert sent(held.take([output("a", [1, 2, 3, 4])])) == {"a": [1, 2, 3, 4], "b": [7, 8]}
    clock.now += 0.001
    assert held.take([output("a", [1, 2, 3, 4, 5])]) == []


def test_a_first_token_an_end_or_a_failure_is_sent_at_once_with_all_that_is_held() -> None:
    clock = Clock()
    held = HeldOutputs(0.010, clock)
    held.take([output("a", [1])])
    clock.now += 0.001
    assert held.take([output("a", [1, 2])]) == []
    assert sent(held.take([output("c", [9])])) == {"a": [1, 2], "c": [9]}  # a newcomer's first token
    assert held.take([output("a", [1, 2, 3])]) == []
    assert sent(held.take([output("c", [9, 10], RequestStatus.FINISHED)])) == {"a": [1, 2, 3], "c": [9, 10]}
    assert held.take([output("a", [1, 2, 3, 4])]) == []
    failed = held.take([output("d", [], RequestStatus.FAILED, error="boom")])
    assert sent(failed) == {"a": [1, 2, 3, 4], "d": []}


def test_a_pause_drains_and_a_cancelled_sequence_is_forgotten() -> None:
    clock = Clock()
    held = HeldOutputs(0.010, clock)
    held.take([output("a", [1]), output("b", [5])])
    assert held.take([output("a", [1, 2]), output("b", [5, 6])]) == []
    held.forget("b")  # cancelled: nobody reads its tokens
    assert sent(held.drain()) == {"a": [1, 2]}
    assert held.drain() == []
