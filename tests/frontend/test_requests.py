"""build_request: a value of the wrong type is refused at the frontend, naming
the argument, before anything reaches a ring."""

from __future__ import annotations

from typing import Any

import pytest

from rt.errors import InvalidRequestError
from rt.frontend.requests import build_request
from rt.messages import GenerateRequest

VOCAB = 1000


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"logprobs": 1}, "logprobs"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"priority": "high"}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"max_new_tokens": "8"}, "max_new_tokens"),
    ],
)
def test_a_parameter_of_the_wrong_type_is_refused_by_name(options: Any, named: str) -> None:
    with pytest.raises(InvalidRequestError, match=named):
        build_request("hello", options, VOCAB)


def test_a_chat_message_the_tokenizer_could_not_read_is_refused_here() -> None:
    with pytest.raises(InvalidRequestError, match=r"wrong type: .* in `messages\[0\]`"):
        build_request(None, {"messages": [{"role": "user", 1: "not a str key"}]}, VOCAB)


def test_an_accepted_request_is_what_the_tokenizer_will_read() -> None:
    req = build_request(None, {"input_ids": [5, 6, 7], "stop_token_ids": [2], "rid": "r"}, VOCAB)
    assert isinstance(req, GenerateRequest)
    assert req.rid == "r" and req.input_ids == (5, 6, 7)
    assert req.sampling.stop_token_ids == (2,) and isinstance(req.sampling.seed, int)
