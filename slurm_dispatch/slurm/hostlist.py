"""Slurm host lists (``n[1-3,05],gpu1``) to node names, as the controller's hooks record them.

Invariant: pure (no I/O), standard library only (the controller hooks import it); a malformed
list raises ValueError naming it, never a guess.
"""

from __future__ import annotations

__all__ = ["expand_hostlist"]


def expand_hostlist(text: str) -> list[str]:
    """Slurm host list to names: ``n[1-3,05],gpu1`` -> n1 n2 n3 n05 gpu1 (zero padding kept).

    Several bracket groups in one name multiply (``r[1-2]n[1-2]``).  Raises ValueError on a
    malformed list.
    """
    names: list[str] = []
    depth = 0
    start = 0
    text = text.strip()
    if text in ("", "(null)", "None"):
        return []
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        elif char == "," and depth == 0:
            names += _expand_one(text[start:i], text)
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    names += _expand_one(text[start:], text)
    return names


def _expand_one(item: str, whole: str) -> list[str]:
    item = item.strip()
    if not item:
        return []
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.find("]", open_at)
    prefix, body, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    values: list[str] = []
    for part in body.split(","):
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"bad range {part!r} in host list {whole!r}")
        if not sep:
            values.append(low)
            continue
        width = len(low) if low.startswith("0") else 0
        if int(high) < int(low) or int(high) - int(low) > 1_000_000:
            raise ValueError(f"bad range {part!r} in host list {whole!r}")
        values += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    tails = _expand_one(rest, whole) if rest else [""]
    return [prefix + value + tail for value in values for tail in tails]
