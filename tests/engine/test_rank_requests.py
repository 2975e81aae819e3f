"""What each rank runs (`RankLayout.rank_requests`, the one home of the rule that `GroupEngine` runs and
`run --gpus` names its files by): data-parallel ranks one seed each, CFG-parallel ranks one request."""

from __future__ import annotations

from omni_console.engine.ranks.rank_layout import RankLayout
from omni_console.engine.running.runner import GenerateRequest


def test_data_parallel_ranks_take_consecutive_seeds_of_one_request() -> None:
    request = GenerateRequest(prompt="a fox", steps=3, height=64, width=64, seed=41, negative_prompt="blur")
    runs = RankLayout(4, True).rank_requests(request)
    assert [r.seed for r in runs] == [41, 42, 43, 44]
    assert all(r.prompt == "a fox" and r.steps == 3 and r.negative_prompt == "blur" for r in runs)
    assert request.seed == 41  # the caller's request is left as it was


def test_cfg_parallel_ranks_run_the_same_request() -> None:
    request = GenerateRequest(prompt="a fox", steps=3, seed=7)
    assert RankLayout(2, False, "cfg").rank_requests(request) == [request, request]


def test_one_rank_runs_the_request_itself() -> None:
    request = GenerateRequest(prompt="a fox", seed=7)
    assert RankLayout(1).rank_requests(request) == [request]
