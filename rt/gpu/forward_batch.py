"""What one forward pass computes: flat tokens of every request, and where their KV goes."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ForwardBatch:
    """A batch of requests flattened to tokens.

    Request ``b`` contributes ``extend_lens[b]`` tokens at positions
    ``prefix_lens[b] ..`` (a decode step is an extend of 1). Its KV slots for
    positions ``0 .. prefix_lens[b] + extend_lens[b]`` are in row ``req_rows[b]``
    of the request→token table; the new tokens' slots are ``out_cache_loc``.
    """

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    out_cache_loc: torch.Tensor  # [num_tokens] int64
    req_rows: torch.Tensor  # [batch] int64
    prefix_lens: list[int]
    extend_lens: list[int]
    # flat token indices whose logits the model computes: each sampled request's last
    # token, and the prompt positions whose logprobs are asked for (prompt_spans)
    sample_indices: torch.Tensor  # [num_logits] int64
    # rows of those logits that are sampled (None: every row, the usual case)
    sampled_rows: torch.Tensor | None = None
    # (item, first logits row, rows, first position): prompt logprobs to compute
    prompt_spans: list[tuple[int, int, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        assert len(self.prefix_lens) == len(self.extend_lens) == self.req_rows.shape[0]
        assert self.input_ids.shape == self.positions.shape == self.out_cache_loc.shape
        assert sum(self.extend_lens) == self.input_ids.shape[0]

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def is_decode(self) -> bool:
        return all(n == 1 for n in self.extend_lens)

    @property
    def seq_lens(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix_lens, self.extend_lens, strict=True)]
