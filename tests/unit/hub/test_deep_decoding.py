"""deep_decoding (gpufed.hub.adapters.kubewire): the raised recursion limit holds while any block is open."""

from __future__ import annotations

import sys

from gpufed.hub.adapters.kubewire import DECODE_RECURSION_LIMIT, deep_decoding


def test_overlapping_blocks_keep_the_limit_until_the_last_one_ends() -> None:
    # Two coroutines decode at once, awaiting inside their blocks: the first to leave used to
    # restore the default limit under the other one, which then failed with RecursionError.
    before = sys.getrecursionlimit()
    first, second = deep_decoding(), deep_decoding()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first coroutine is done, the second still decodes
    assert sys.getrecursionlimit() == DECODE_RECURSION_LIMIT
    second.__exit__(None, None, None)
    assert sys.getrecursionlimit() == before
