"""Releasing the pages of host tensors that moved to the device: only whole pages inside a view's bytes, only views
into a larger storage; a neighbour sharing a page keeps every byte, a tensor with a storage of its own is left to
its allocator."""

from __future__ import annotations

import mmap

import torch

from omni_console.offload.page_release import release_moved_pages

PAGE = mmap.PAGESIZE


def test_a_views_inner_pages_go_and_its_neighbours_keep_every_byte():
    storage = torch.full((64 * PAGE + 100,), 7, dtype=torch.uint8)
    cut, end = 100 + PAGE // 2, 100 + 40 * PAGE
    left, moved, right = storage[:cut], storage[cut:end], storage[end:]
    released = release_moved_pages([moved])
    inner_start = -(-moved.data_ptr() // PAGE) * PAGE
    inner_end = (moved.data_ptr() + moved.numel()) // PAGE * PAGE
    assert released == inner_end - inner_start >= 38 * PAGE
    assert bool((left == 7).all()) and bool((right == 7).all())  # the pages they share with it are untouched
    head = inner_start - moved.data_ptr()
    assert bool((moved[:head] == 7).all())  # a page partly outside it: kept
    assert bool((moved[head : head + released] == 0).all())  # given back: the kernel's fresh zero pages


def test_a_tensor_with_its_own_storage_is_left_to_its_allocator():
    own = torch.full((32 * PAGE,), 5, dtype=torch.uint8)
    assert release_moved_pages([own]) == 0
    assert bool((own == 5).all())


def test_nothing_smaller_than_a_page_or_twice_released():
    storage = torch.ones(8 * PAGE, dtype=torch.uint8)
    small = storage[10 : 10 + PAGE // 2]
    view = storage[PAGE : 5 * PAGE]
    assert release_moved_pages([small]) == 0
    inner = (view.data_ptr() + view.numel()) // PAGE * PAGE - -(-view.data_ptr() // PAGE) * PAGE
    assert inner >= 3 * PAGE
    assert release_moved_pages([view, view.view(torch.int32).view(torch.uint8)]) == inner  # one alias: once
