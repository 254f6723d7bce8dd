"""slurm.conf and cgroup.conf as far as the hooks and the doctor read them: ``Key=Value`` words,
keys in any case, ``#`` comments, ``Include`` files followed relative to the including file's
folder (globbed, as Slurm globs them).

Invariants: standard library only, and :func:`read` never raises: a file it cannot read is a
problem it returns, and a key not found is absent (the caller says what Slurm's default is).
The first value of a key wins.
"""

from __future__ import annotations

import os

__all__ = ["read", "slurm_conf_path", "setting"]

SLURM_CONF_DEFAULT = "/etc/slurm/slurm.conf"


def read(path: str, keys: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """``{Key: value}`` of the file at ``path`` for ``keys`` (in the spelling given), and the
    problems met."""
    known = {k.lower(): k for k in keys}
    values: dict[str, str] = {}
    problems: list[str] = []

    def one(file: str, depth: int) -> None:
        try:
            with open(file, encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
        except OSError as exc:
            problems.append(f"{file}: cannot read: {exc.strerror}")
            return
        for line in lines:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            word = line.split(None, 1)
            if word[0].lower() == "include" and len(word) == 2:
                if depth > 8:
                    problems.append(f"{file}: Include nested too deep")
                    continue
                target = word[1].strip()
                if not os.path.isabs(target):
                    target = os.path.join(os.path.dirname(file), target)
                for name in _expand(target):
                    one(name, depth + 1)
                continue
            for pair in line.split():
                key, sep, value = pair.partition("=")
                if sep and key.lower() in known:
                    values.setdefault(known[key.lower()], value)

    one(path, 0)
    return values, problems


def _expand(target: str) -> list[str]:
    if not any(c in target for c in "*?["):
        return [target]
    import glob  # only for a wildcard Include: it imports re, which a hook need not pay for

    return sorted(glob.glob(target)) or [target]


def slurm_conf_path() -> str:
    """The slurm.conf Slurm's node daemons read: ``$SLURM_CONF`` (Slurm gives the node's
    Prolog and Epilog it), else the default."""
    return os.environ.get("SLURM_CONF") or SLURM_CONF_DEFAULT


def setting(key: str, path: str | None = None) -> str | None:
    """One key of slurm.conf (``path``, else :func:`slurm_conf_path`), or None where the file
    does not set it or cannot be read."""
    return read(path or slurm_conf_path(), (key,))[0].get(key)
