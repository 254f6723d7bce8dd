"""sbatch's options at one Slurm release, as rows for ``slurm_dispatch/slurm/sbatch_options.py``.

``python3 tools/sbatch_options.py SLURM_GIT TAG`` (``TAG`` e.g. ``slurm-26-05-3-1``) reads
``src/common/slurm_opt.c`` at that tag: every ``slurm_cli_opt_t`` of ``common_options[]`` that
sbatch sets (``set_func`` or ``set_func_sbatch``; a NULL name is an option only a SPANK plugin
may claim), printed as ``name value short`` (value R required, O optional, N none, from
``has_arg``; the short letter where ``val`` is one, else ``-``).  Two names with one setter are
one option: the second is printed ``=first``.  Standard library only.

To add a release: print its rows, compare them with the newest release's (``diff``), and give
each new or changed row the release's span in the table; ``tests/unit/test_sbatch_options.py``
then says whether a name changed between taking a value and not.
"""

from __future__ import annotations

import re
import subprocess
import sys

_BLOCK = re.compile(r"static slurm_cli_opt_t (\w+) = \{(.*?)\n\};", re.S)
_FIELD = re.compile(r"\.(\w+)\s*=\s*([^,\n]+),")
_VALUES = {"required_argument": "R", "optional_argument": "O", "no_argument": "N"}


def rows(source: str) -> list[str]:
    """The rows of ``source``, slurm_opt.c's text, in ``common_options[]``'s order."""
    blocks = {name: dict(_FIELD.findall(body)) for name, body in _BLOCK.findall(source)}
    listed = re.search(r"common_options\[\] = \{(.*?)\};", source, re.S)
    if listed is None:
        raise SystemExit("no common_options[] in this slurm_opt.c")
    found = []
    for ref in re.findall(r"&(\w+)", listed.group(1)):
        fields = blocks[ref]
        setter = fields.get("set_func") or fields.get("set_func_sbatch")
        name = fields.get("name", "NULL").strip('"')
        if not setter or name == "NULL":
            continue  # another command's option, or one left for a SPANK plugin
        val = fields.get("val", "")
        short = val[1] if re.fullmatch(r"'.'", val) else "-"
        found.append((name, _VALUES[fields.get("has_arg", "no_argument")], short, setter))
    # Of names sharing a setter, the one with a short letter (else the first) is the option.
    owner: dict[str, str] = {}
    for name, _, _short, setter in sorted(found, key=lambda f: f[2] == "-"):
        owner.setdefault(setter, name)
    return [f"{name:<22} {value}  {short}" + (f"  ={owner[setter]}" if owner[setter] != name
                                              else "")
            for name, value, short, setter in found]


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python3 tools/sbatch_options.py SLURM_GIT TAG")
    source = subprocess.run(["git", "-C", argv[0], "show", f"{argv[1]}:src/common/slurm_opt.c"],
                            check=True, capture_output=True, text=True).stdout
    print("\n".join(rows(source)))


if __name__ == "__main__":
    main(sys.argv[1:])
