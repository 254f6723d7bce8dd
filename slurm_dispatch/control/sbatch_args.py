"""Reading a dispatch-sbatch command line and a job script's directives, and rendering the
batch script that sbatch receives.  Pure: no I/O.

``dispatch-sbatch [dispatch options] [sbatch options] script [args...]`` keeps sbatch's own
grammar, the options of every release in :mod:`..slurm.sbatch_options` (which says how sbatch
reads them): short options may be clustered (``-N2``, ``-HN 2``), an option with a required
value takes ``=value`` or the next word, one with an optional value only ``=value``, and
unambiguous prefixes of long options work as they do with getopt.  The first word that is not an
option is the script; everything after it belongs to the script.  An option no release knows is
passed to sbatch as it is, without a value of its own (as sbatch's getopt reads it).

Dispatch options (also as ``#DISPATCH`` lines in the script's header, like ``#SBATCH``):
``--checkpoint DIR``, ``--resubmit N``, ``--shared-checkpoint``, ``--supersede JOB``,
``--warn-before TIME[:SIGNAL]``, ``--max-no-progress N`` (default :data:`MAX_NO_PROGRESS`),
``--quarantine-after N`` (default :data:`QUARANTINE_AFTER`), ``--stop-on-exit CODES``,
``--restart-on-exit CODES`` (exit statuses, ``3,5-7``: :func:`parse_codes`),
``--max-requeues N`` (Slurm's requeues; default none: unbudgeted), ``--avoid-bad-nodes N``
(failed executions on a node before it is excluded; default none: the site's
``AvoidBadNodes``, 0 unless it sets one), ``--stall-timeout TIME`` (the time without progress
before an execution is asked to save and ended: :func:`parse_stall_timeout`; default none: the
site's ``StallTimeout``, off unless it sets one), ``--plan``.  The command line wins over
directives.
"""

from __future__ import annotations

import shlex

from ..errors import UsageError
from ..slurm import sbatch_options

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Optional

# sbatch's options, every release's (slurm/sbatch_options.py, which says how sbatch reads them);
# these sets are what the completion and the docs' tests read.
_SHORT, _LONG = sbatch_options.SHORT, sbatch_options.LONG
SHORT_WITH_ARG = {c for c, o in _SHORT.items() if o.value == sbatch_options.REQUIRED}
SHORT_OPTIONAL_ARG = {c for c, o in _SHORT.items() if o.value == sbatch_options.OPTIONAL}
LONG_WITH_ARG = {name for name, o in _LONG.items() if o.value == sbatch_options.REQUIRED}
LONG_FLAGS = set(_LONG) - LONG_WITH_ARG  # no value, or one only as --name=value

DISPATCH_WITH_ARG = {
    "checkpoint",
    "resubmit",
    "supersede",
    "warn-before",
    "max-no-progress",
    "quarantine-after",
    "stop-on-exit",
    "restart-on-exit",
    "max-requeues",
    "avoid-bad-nodes",
    "stall-timeout",
}
# --max-no-progress's default: executions in a row without progress before restarts stop.
MAX_NO_PROGRESS = 3
# --quarantine-after's default: failed executions in a row from one save before it is passed over.
QUARANTINE_AFTER = 2
DISPATCH_FLAGS = {"shared-checkpoint", "plan"}


class DispatchOptions:
    """The dispatch options given, and which of them were given (``given``)."""

    __slots__ = (
        "checkpoint",
        "resubmit",
        "shared_checkpoint",
        "supersede",
        "plan",
        "warn_before",
        "max_no_progress",
        "quarantine_after",
        "stop_on_exit",
        "restart_on_exit",
        "max_requeues",
        "avoid_bad_nodes",
        "stall_timeout",
        "given",
    )

    def __init__(self, given: Optional[set[str]] = None) -> None:
        self.checkpoint: Optional[str] = None
        self.warn_before: Optional[tuple[str, int]] = None  # (signal, seconds before the end)
        self.resubmit = 0
        self.shared_checkpoint = False
        self.supersede: Optional[str] = None
        self.plan = False
        self.max_no_progress = MAX_NO_PROGRESS
        self.quarantine_after = QUARANTINE_AFTER
        self.stop_on_exit: list[int] = []  # exit statuses after which nothing restarts
        self.restart_on_exit: list[int] = []  # ... restarted without spending the budget
        self.max_requeues: Optional[int] = None  # Slurm's requeues; None: unbudgeted
        self.avoid_bad_nodes: Optional[int] = None  # None: the site's AvoidBadNodes
        self.stall_timeout: Optional[int] = None  # seconds, 0 off; None: the site's StallTimeout
        self.given: set[str] = set(given or ())

    def merged_over(self, directives: DispatchOptions) -> DispatchOptions:
        """These options (the command line) over ``directives`` (the script's)."""
        out = DispatchOptions(given=self.given | directives.given)
        for name in (
            "checkpoint",
            "resubmit",
            "shared_checkpoint",
            "supersede",
            "plan",
            "warn_before",
            "max_no_progress",
            "quarantine_after",
            "stop_on_exit",
            "restart_on_exit",
            "max_requeues",
            "avoid_bad_nodes",
            "stall_timeout",
        ):
            source = self if name in self.given else directives
            setattr(out, name, getattr(source, name))
        both = sorted(set(out.stop_on_exit) & set(out.restart_on_exit))
        if both:  # each list from its own source: one in each (a source's own is refused)

            def said(name: str) -> str:
                return "the command line" if name in self.given else "the script's #DISPATCH lines"

            raise UsageError(
                f"exit code(s) {', '.join(map(str, both))} given to both "
                f"--stop-on-exit ({said('stop_on_exit')}) and --restart-on-exit "
                f"({said('restart_on_exit')}): a code means one of them"
            )
        return out


class CommandLine:
    """A dispatch-sbatch command line, split into its parts."""

    __slots__ = (
        "dispatch",
        "sbatch",
        "script",
        "script_args",
        "long_names",
        "warnings",
        "unknown_before_script",
    )

    def __init__(
        self,
        dispatch: DispatchOptions,
        sbatch: list[str],
        script: Optional[str],
        script_args: list[str],
        long_names: set[str],
        warnings: Optional[list[str]] = None,
        unknown_before_script: Optional[str] = None,
    ) -> None:
        self.dispatch = dispatch
        self.sbatch = sbatch  # sbatch's own options, in order, as given
        self.script = script
        self.script_args = script_args
        self.long_names = long_names  # long names of the sbatch options given, aliases resolved
        self.warnings = list(warnings or [])  # for people: likely mistakes that are not errors
        # an option no release knows, just before the script: had it a value, that is the
        # "script" (sbatch reads it so too), which the error for an unreadable script says
        self.unknown_before_script = unknown_before_script


def resolve_long(name: str, where: str) -> str:
    """An sbatch or dispatch long option as given (``name``, without ``--``; an unambiguous
    prefix, as sbatch takes it) by its full name (an sbatch alias by the option's own name:
    ``cluster`` is ``clusters``); ``where`` says where it was given, for the error that names
    an ambiguous one or a likely typo.  A name like nothing known is returned as given: a
    newer sbatch's option or a SPANK plugin's, which sbatch judges."""
    ours = DISPATCH_WITH_ARG | DISPATCH_FLAGS
    if name in ours:
        return name
    option, candidates = sbatch_options.find_long(name)
    mine = sorted(k for k in ours if k.startswith(name))
    if option is not None and not mine:
        return option.canonical
    if option is not None:
        candidates = [option.name]
    candidates = sorted(set(candidates) | set(mine))
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise UsageError(
            f"option '--{name}'{where} is ambiguous: " + ", ".join("--" + c for c in candidates)
        )
    import difflib  # only on this path: dispatch-sbatch's start-up stays small

    close = difflib.get_close_matches(name, sorted(set(_LONG) | ours), n=1, cutoff=0.8)
    if close:
        # A typo: left alone, its value would be taken for the script (`--checkpont X`).
        raise UsageError(f"unrecognized option '--{name}'{where} (did you mean --{close[0]}?)")
    return name  # unknown and like nothing we know: a newer sbatch's option, sbatch judges it


# Options counting something, each with no default of its own: what they count, their bound.
_COUNTS = {
    "max-requeues": ("Slurm's requeues", 999_999),
    "avoid-bad-nodes": ("failed executions on a node (0 never avoids one)", 999),
}
# Every dispatch option whose value is a whole number (_set_count checks each).
_COUNTED = {"resubmit", *_COUNTS, "max-no-progress", "quarantine-after"}


def _whole(value: Optional[str]) -> int:
    """A count as written: ASCII digits, a ``-`` before them at most (said as outside its
    range); ValueError for anything else int() would take ('1_0', '+2', other scripts'
    digits), as dispatch.conf's counts are read."""
    text = (value or "").strip()
    digits = text[1:] if text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(text)
    return int(text)


def _set_dispatch(opts: DispatchOptions, name: str, value: Optional[str], where: str) -> None:
    opts.given.add(name.replace("-", "_"))
    if name == "checkpoint":
        if not value:
            raise UsageError(f"--checkpoint{where} needs a directory")
        opts.checkpoint = value
    elif name in _COUNTED:
        _set_count(opts, name, value, where)
    elif name in ("stop-on-exit", "restart-on-exit"):
        setattr(opts, name.replace("-", "_"), parse_codes(value or "", f"--{name}", where))
        both = sorted(set(opts.stop_on_exit) & set(opts.restart_on_exit))
        if both:
            raise UsageError(
                f"exit code(s) {', '.join(map(str, both))}{where} given to both "
                "--stop-on-exit and --restart-on-exit: a code means one of them"
            )
    elif name == "supersede":
        if not value:
            raise UsageError(f"--supersede{where} needs a dispatch job id")
        opts.supersede = value
    elif name == "warn-before":
        opts.warn_before = parse_warning(value or "", where)
    elif name == "stall-timeout":
        opts.stall_timeout = parse_stall_timeout(value or "", where)
    elif name == "shared-checkpoint":
        opts.shared_checkpoint = True
    elif name == "plan":
        opts.plan = True


def _set_count(opts: DispatchOptions, name: str, value: Optional[str], where: str) -> None:
    """The dispatch options that take a whole number, each checked against its range."""
    if name == "resubmit":
        try:
            opts.resubmit = _whole(value)
        except ValueError:
            raise UsageError(
                f"--resubmit {value!r}{where} is not a number of resubmissions"
            ) from None
        if not 0 <= opts.resubmit <= 999_998:
            raise UsageError(f"--resubmit {opts.resubmit}{where} is outside 0..999998")
    elif name in _COUNTS:
        what, high = _COUNTS[name]
        try:
            count = _whole(value)
        except ValueError:
            raise UsageError(f"--{name} {value!r}{where} is not a number of {what}") from None
        if not 0 <= count <= high:
            raise UsageError(f"--{name} {count}{where} is outside 0..{high}")
        setattr(opts, name.replace("-", "_"), count)
    elif name in ("max-no-progress", "quarantine-after"):
        try:
            count = _whole(value)
        except ValueError:
            raise UsageError(
                f"--{name} {value!r}{where} is not a number of executions (0 turns the check off)"
            ) from None
        if not 0 <= count <= 999_999:
            raise UsageError(
                f"--{name} {count}{where} is outside 0..999999 (0 turns the check off)"
            )
        setattr(opts, name.replace("-", "_"), count)


def parse_codes(value: str, option: str, where: str = "") -> list[int]:
    """Exit statuses as ``--stop-on-exit``/``--restart-on-exit`` take them: ``3``, ``3,5-7``
    (1..255: a script's own exit status; 0 is a completion), sorted, each once."""
    codes: set[int] = set()
    for part in value.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last if dash else first)
        except ValueError:
            raise UsageError(
                f"{option} {value!r}{where}: {part.strip()!r} is not an exit code "
                "or a range of them (give e.g. 3 or 3,5-7)"
            ) from None
        if not 1 <= low <= high <= 255:
            raise UsageError(
                f"{option} {value!r}{where}: {part.strip()!r} is outside 1..255 "
                "(a script's own exit status; 0 is a completion)"
            )
        codes.update(range(low, high + 1))
    return sorted(codes)


SIGNALS = {"USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "CONT", "URG"}


def parse_warning(value: str, where: str = "") -> tuple[str, int]:
    """``--warn-before TIME[:SIGNAL]``: seconds (or MM:SS) before the time limit, and the
    signal (default USR1).  Slurm takes 0..65535 seconds."""
    parts = value.split(":")
    signal = "USR1"
    if len(parts) > 1 and not parts[-1].isdigit():
        signal = parts.pop().upper().removeprefix("SIG")
    if signal not in SIGNALS:
        raise UsageError(
            f"--warn-before {value!r}{where}: unknown signal {signal!r} "
            f"(one of {', '.join(sorted(SIGNALS))})"
        )
    try:
        if len(parts) > 2:
            raise ValueError(value)
        total = int(parts[-1]) + (60 * int(parts[0]) if len(parts) == 2 else 0)
    except ValueError:
        raise UsageError(
            f"--warn-before {value!r}{where}: give the time before the limit as "
            "seconds or MM:SS, then :SIGNAL if not USR1 (e.g. 300, 5:00, "
            "120:TERM)"
        ) from None
    if not 1 <= total <= 65535:
        raise UsageError(
            f"--warn-before {value!r}{where}: {total} s is outside 1..65535 "
            "(what sbatch --signal accepts)"
        )
    return signal, total


STALL_TIMEOUT_MAX = 7 * 24 * 3600


def parse_stall_timeout(value: str, where: str = "") -> int:
    """``--stall-timeout TIME``: the time without progress before the execution is asked to
    save and ended, as seconds, MM:SS, HH:MM:SS or D-HH:MM:SS; ``0`` (or ``off``) is off."""
    if value.strip().lower() in ("0", "off"):
        return 0
    from ..config import parse_duration

    try:
        total = parse_duration(value)
    except ValueError:
        raise UsageError(
            f"--stall-timeout {value!r}{where}: give the time without progress "
            "as seconds, MM:SS or HH:MM:SS (e.g. 600, 10:00, 1:30:00), or 0 for "
            "off"
        ) from None
    if not 1 <= total <= STALL_TIMEOUT_MAX or total != int(total):
        raise UsageError(
            f"--stall-timeout {value!r}{where}: {total:g} s is not a whole number "
            f"of seconds from 1 to {STALL_TIMEOUT_MAX} (a week; 0 turns it off)"
        )
    return int(total)


def parse_options(
    words: list[str],
    *,
    stop_at_script: bool,
    where: str = "",
    values: Optional[list[tuple[str, Optional[str]]]] = None,
) -> tuple[DispatchOptions, list[str], int, set[str]]:
    """Walk ``words``; return (dispatch options, sbatch words, index of the script, long names).
    ``values``, where given, gets each sbatch option's (long name, value or None) in order."""
    opts = DispatchOptions()
    values = [] if values is None else values
    sbatch: list[str] = []
    names: set[str] = set()
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            sbatch.append(word)
            i += 1
            break
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            long = resolve_long(name, where)
            if long in DISPATCH_WITH_ARG or long in DISPATCH_FLAGS:
                if long in DISPATCH_WITH_ARG and not eq:
                    if i + 1 >= len(words):
                        raise UsageError(f"--{long}{where} needs a value")
                    value = words[i + 1]
                    i += 1
                elif long in DISPATCH_FLAGS and eq:
                    raise UsageError(f"--{long}{where} takes no value (got {value!r})")
                _set_dispatch(opts, long, value, where)
                i += 1
                continue
            names.add(long)
            sbatch.append(word)
            if long in LONG_WITH_ARG and not eq:
                if i + 1 >= len(words):
                    raise UsageError(f"sbatch option --{long}{where} needs a value")
                sbatch.append(words[i + 1])
                value, eq = words[i + 1], "="
                i += 1
            values.append((long, value if eq else None))
            i += 1
            continue
        if word.startswith("-") and len(word) > 1:
            i = _short_word(words, i, where, sbatch, names, values) + 1
            continue
        if stop_at_script:
            break
        raise UsageError(f"unexpected word {word!r}{where}: directives hold options only")
    return opts, sbatch, i, names


def _short_word(
    words: list[str],
    i: int,
    where: str,
    sbatch: list[str],
    names: set[str],
    values: list[tuple[str, Optional[str]]],
) -> int:
    """Read the short options of ``words[i]`` (``-N2``, ``-vv``, ``-t 5``) into ``sbatch``,
    ``names`` and ``values`` as :func:`parse_options` does; the index of the last word read
    (``i + 1`` where the last letter took the next word as its value)."""
    word = words[i]
    sbatch.append(word)
    for j, letter in enumerate(word[1:], start=1):
        name = _SHORT[letter].canonical if letter in _SHORT else letter
        if letter in _SHORT:
            names.add(name)
        if letter in SHORT_OPTIONAL_ARG:
            # the rest of the word is its value (-kyes), never the next word
            values.append((name, word[j + 1 :] or None))
            break
        if letter in SHORT_WITH_ARG:
            if j == len(word) - 1:
                if i + 1 >= len(words):
                    raise UsageError(f"sbatch option -{letter}{where} needs a value")
                sbatch.append(words[i + 1])
                values.append((name, words[i + 1]))
                i += 1
            else:
                values.append((name, word[j + 1 :]))
            break
        values.append((name, None))
    return i


def expedited_requeue(words: list[str]) -> bool:
    """``words`` (sbatch's options in the order sbatch applies them: the script's ``#SBATCH``
    words, then the command line's) ask for 25.11's expedited requeue: the last of
    ``--requeue``/``--no-requeue`` is ``--requeue=expedite``."""
    seen: list[tuple[str, Optional[str]]] = []
    parse_options(words, stop_at_script=True, values=seen)
    last = [(name, value) for name, value in seen if name in ("requeue", "no-requeue")]
    return bool(last) and last[-1] == ("requeue", "expedite")


def parse_command_line(argv: list[str]) -> CommandLine:
    opts, sbatch, index, names = parse_options(argv, stop_at_script=True)
    script = argv[index] if index < len(argv) else None
    script_args = list(argv[index + 1 :])
    ours = DISPATCH_WITH_ARG | DISPATCH_FLAGS
    late = [
        w.split("=", 1)[0]
        for w in script_args
        if w.startswith("--") and w[2:].split("=", 1)[0] in ours
    ]
    warnings = []
    if late:
        warnings.append(
            f"{', '.join(late)} after the script {script} go to the script, as "
            "with sbatch; dispatch options go before the script name"
        )
    unknown = None
    if (
        sbatch
        and index > 0
        and sbatch[-1] == argv[index - 1]
        and "=" not in sbatch[-1]
        and sbatch[-1].startswith("--")
        and len(sbatch[-1]) > 2
    ):
        name = resolve_long(sbatch[-1][2:], "")
        if name not in _LONG:
            unknown = sbatch[-1]
    return CommandLine(opts, sbatch, script, script_args, names, warnings, unknown)


class ScriptHeader:
    """What the top of a job script says: its shebang and directive lines."""

    __slots__ = ("shebang", "sbatch_lines", "sbatch_words", "dispatch", "long_names")

    def __init__(
        self,
        shebang: str,
        sbatch_lines: list[str],
        sbatch_words: list[str],
        dispatch: DispatchOptions,
        long_names: set[str],
    ) -> None:
        self.shebang = shebang
        self.sbatch_lines = sbatch_lines  # the directive block after the shebang, verbatim
        self.sbatch_words = sbatch_words  # the words of the #SBATCH directives
        self.dispatch = dispatch
        self.long_names = long_names


def read_header(text: str, script_name: str) -> ScriptHeader:
    """Read the shebang and directive block the way sbatch does.

    sbatch stops reading directives at the first line that is neither blank nor a comment.
    """
    if "\r\n" in text:
        raise UsageError(
            f"script {script_name!r} has DOS line breaks (\\r\\n); sbatch refuses "
            "such scripts: convert it with `dos2unix` or `sed -i 's/\\r$//'`"
        )
    lines = text.split("\n")
    if not lines or not lines[0].startswith("#!"):
        raise UsageError(
            f"script {script_name!r} does not start with '#!': a batch script's "
            "first line must name its interpreter (e.g. #!/bin/bash)"
        )
    block: list[str] = []
    sbatch_words: list[str] = []
    dispatch_words: list[str] = []
    for number, line in enumerate(lines[1:], start=2):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        block.append(line)
        for tag, sink in (("#SBATCH", sbatch_words), ("#DISPATCH", dispatch_words)):
            if stripped.startswith(tag) and (
                len(stripped) == len(tag) or stripped[len(tag)].isspace()
            ):
                words = directive_words(stripped[len(tag) :], script_name, number)
                sink.extend(words)
    where = f" (in {script_name}'s #DISPATCH lines)"
    dispatch, stray, _, _ = parse_options(dispatch_words, stop_at_script=False, where=where)
    if stray:
        raise UsageError(
            f"{script_name}: #DISPATCH lines hold dispatch options only; "
            f"{' '.join(stray)!r} belongs on an #SBATCH line"
        )
    _, _, _, names = parse_options(
        sbatch_words, stop_at_script=False, where=f" (in {script_name}'s #SBATCH lines)"
    )
    return ScriptHeader(lines[0], block, sbatch_words, dispatch, names)


def directive_words(rest: str, script_name: str, number: int) -> list[str]:
    """The words of one ``#SBATCH`` line (``rest``: what follows the tag), as sbatch reads
    them; an unreadable line is a UsageError naming the script and line ``number``."""
    # sbatch ignores what follows a '#' that starts a word in a directive line.
    try:
        words = shlex.split(rest, comments=True)
    except ValueError as exc:
        raise UsageError(f"{script_name}, line {number}: cannot read directive: {exc}") from None
    return words


def render_batch_script(
    *, header: ScriptHeader, python: str, job_path: str, submission: int
) -> str:
    """The batch script sbatch receives: the user's directives, then the launcher.

    The user's shebang is replaced by bash (the launcher is exec'd from bash); the user's own
    script runs under its own interpreter, exec'd by the launcher with its arguments.
    """
    lines = ["#!/bin/bash"]
    lines.extend(header.sbatch_lines)
    lines.append("# slurm-dispatch: give this execution its identity, then run the script.")
    lines.append(
        " ".join(
            [
                "exec",
                shlex.quote(python),
                "-m",
                "slurm_dispatch.launch",
                "--job",
                shlex.quote(job_path),
                "--submission",
                str(submission),
                "--",
                '"$@"',
            ]
        )
    )
    return "\n".join(lines) + "\n"
