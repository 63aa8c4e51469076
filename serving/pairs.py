"""Text pairs packed as BERT packs them, `[CLS] a [SEP] b [SEP]` with segment ids 0 then 1,
shortened to the packer's length by the rule the model was trained with: the trimmers of
tensorflow-text (`RoundRobinTrimmer`, `ShrinkLongestTrimmer`, `WaterfallTrimmer`), written
again over Python lists (the server has no TensorFlow; a differential test holds them equal).
"""


def trim(lengths: list[int], budget: int, rule: str) -> list[int]:
    """How many ids each segment keeps so that they total at most `budget`."""
    if sum(lengths) <= budget:
        return list(lengths)
    if rule == "waterfall":  # the first segments keep theirs; the last lose first
        kept, left = [], budget
        for length in lengths:
            kept.append(min(length, left))
            left -= kept[-1]
        return kept
    if rule == "longest_first":  # one id at a time off the longest (the first of equals)
        kept = list(lengths)
        while sum(kept) > budget:
            longest = max(range(len(kept)), key=lambda i: (kept[i], -i))
            kept[longest] -= 1
        return kept
    if rule == "round_robin":  # one id to each segment in turn, while the budget lasts
        kept, left = [0] * len(lengths), budget
        while left:
            grew = False
            for i, length in enumerate(lengths):
                if left and kept[i] < length:
                    kept[i] += 1
                    left -= 1
                    grew = True
            if not grew:
                break
        return kept
    raise ValueError(f"unknown truncation rule {rule!r}")


def pack_pair(first: list[int], second: list[int], length: int, start: int, end: int,
              rule: str) -> tuple[list[int], list[int]]:  # fmt: skip
    """`(ids, segment ids)` of a pair: `[start] first [end] second [end]`, at most `length`."""
    a, b = trim([len(first), len(second)], length - 3, rule)
    ids = [start, *first[:a], end, *second[:b], end]
    return ids, [0] * (a + 2) + [1] * (b + 1)
