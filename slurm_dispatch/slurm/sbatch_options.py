"""sbatch's options, release by release: which take a value (required, optional or none), their
short letters and aliases.  The grammar ``dispatch-sbatch`` reads a command line and ``#SBATCH``
lines with (``control/sbatch_args.py``).  Pure data and lookups, standard library only.

Where the table comes from: Slurm's ``src/common/slurm_opt.c`` at each release's tag, every
option of ``common_options[]`` that sbatch sets (``set_func`` or ``set_func_sbatch``), with its
``has_arg`` and, where ``val`` is a letter, its short form (``tools/sbatch_options.py`` prints a
tag's rows from a Slurm checkout).  ``tests/real/test_sbatch_grammar.py`` checks the rows of each
release the real tier runs (the host's 22.05, 24.11 and 26.05 in their Debian roots) against
that release's sbatch itself.

How sbatch reads its options (``src/sbatch/opt.c``): glibc's ``getopt_long`` with an option
string starting ``+``, so the first word that is not an option is the script and every word after
it is the script's; ``--`` ends the options.  A long option takes ``--name=value``; a required
value may also be the next word (whatever it starts with), an optional one never is.  A long
name may be abbreviated to any prefix that names one option: exactly one name, or names that are
one option (an alias).  A short letter with a required value takes the rest of its word
(``-N2``) or else the next word; with an optional value, only the rest of its word (``-kyes``);
letters without a value cluster (``-HQ``).  An option sbatch does not know is a word on its own
(getopt reads no value for it), so the word after it is the script; sbatch itself then refuses
it, unless a SPANK plugin of the site adds it.

Invariant: one name never changes between needing a value and not across the releases listed
(``tests/unit/test_sbatch_options.py``), so a command line splits into options, script and the
script's arguments the same way whichever of these releases the user runs; only what each
release accepts differs, and sbatch judges that.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: start-up speed
if TYPE_CHECKING:
    from typing import Optional

REQUIRED, OPTIONAL, NONE = "required", "optional", "none"

#: The releases the table describes, oldest first (releases between two of them have the
#: options of the older one, plus what the newer one added: 23.02 to 24.05 are checked so).
RELEASES = ("22.05", "24.11", "25.05", "25.11", "26.05")

# One row per option and value kind: the long name; its value (R required, O optional, N none);
# its short letter or '-'; the releases that have it ('-' all, '24.11-' from 24.11 on, '-24.11'
# up to 24.11, '22.05' that one only); '=NAME' where it is another name of option NAME.
_ROWS = """
account                R  A  -
acctg-freq             R  -  -
array                  R  a  -
autocomplete           R  -  24.11-
batch                  R  -  -
bb                     R  -  -
bbf                    R  -  -
begin                  R  b  -
chdir                  R  D  -
cluster                R  -  -       =clusters
cluster-constraint     R  -  -
clusters               R  M  -
comment                R  -  -
consolidate-segments   N  -  25.11-
constraint             R  C  -
container              R  -  -
container-id           R  -  24.11-
container-type         R  -  26.05-
context                R  -  -
contiguous             N  -  -
core-spec              R  S  -
cores-per-socket       R  -  -
cpu-freq               R  -  -
cpus-per-gpu           R  -  -
cpus-per-task          R  c  -
deadline               R  -  -
delay-boot             R  -  -
dependency             R  d  -
distribution           R  m  -
error                  R  e  -
exclude                R  x  -
exclusive              O  -  -
export                 R  -  -
export-file            R  -  -
external               N  -  25.05-
extra                  R  -  24.11-
extra-node-info        R  B  -
get-user-env           O  -  -24.11
get-user-env           N  -  25.05-
gid                    R  -  -
gpu-bind               R  -  -
gpu-freq               R  -  -
gpus                   R  G  -
gpus-per-node          R  -  -
gpus-per-socket        R  -  -
gpus-per-task          R  -  -
gres                   R  -  -
gres-flags             R  -  -
help                   N  h  -
hint                   R  -  -
hold                   N  H  -
ignore-pbs             N  -  -
input                  R  i  -
job-name               R  J  -
kill-on-invalid-dep    R  -  -
licenses               R  L  -
mail-type              R  -  -
mail-user              R  -  -
mcs-label              R  -  -
mem                    R  -  -
mem-bind               R  -  -
mem-per-cpu            R  -  -
mem-per-gpu            R  -  -
mem-update             R  -  26.05-
mincpus                R  -  -
network                R  -  -
nice                   O  -  -
no-kill                O  k  -
no-requeue             N  -  -
nodefile               R  F  -
nodelist               R  w  -
nodes                  R  N  -
ntasks                 R  n  -
ntasks-per-core        R  -  -
ntasks-per-gpu         R  -  -
ntasks-per-node        R  -  -
ntasks-per-socket      R  -  -
ntasks-per-tres        R  -  -
oom-kill-step          O  -  24.11-
open-mode              R  -  -
output                 R  o  -
overcommit             N  O  -
oversubscribe          N  s  -
parsable               N  -  -
partition              R  p  -
power                  R  -  22.05
prefer                 R  -  -
priority               R  -  -
profile                R  -  -
propagate              O  -  -
qos                    R  q  -
quiet                  N  Q  -
reboot                 N  -  -
requeue                N  -  -25.05
requeue                O  -  25.11-
reservation            R  -  -
resources              R  -  25.11-
resv-ports             O  -  24.11-
segment                R  -  24.11-
signal                 R  -  -
sockets-per-node       R  -  -
spread-job             N  -  -
spread-segments        N  -  25.11-
stepmgr                N  -  24.11-
switches               R  -  -
tasks-per-node         R  -  -       =ntasks-per-node
test-only              N  -  -
thread-spec            R  -  -
threads-per-core       R  -  -
time                   R  t  -
time-min               R  -  -
tmp                    R  -  -
tres-bind              R  -  24.11-
tres-per-task          R  -  24.11-
uid                    R  -  -
usage                  N  -  -
use-min-nodes          N  -  -
verbose                N  v  -
version                N  V  -
wait                   N  W  -
wait-all-nodes         R  -  -
wckey                  R  -  -
wrap                   R  -  -
"""

_VALUES = {"R": REQUIRED, "O": OPTIONAL, "N": NONE}


class Option:
    """One sbatch option in one release: ``name`` (long), ``value`` (:data:`REQUIRED`,
    :data:`OPTIONAL` or :data:`NONE`), ``short`` (a letter, or empty), ``canonical`` (the
    option's own name where ``name`` is an alias, else ``name``)."""

    __slots__ = ("name", "value", "short", "canonical")

    def __init__(self, name: str, value: str, short: str, canonical: str) -> None:
        self.name = name
        self.value = value
        self.short = short
        self.canonical = canonical

    def __repr__(self) -> str:
        return f"Option({self.name!r}, {self.value!r}, short={self.short!r})"


def _span(text: str) -> tuple[str, ...]:
    if text == "-":
        return RELEASES
    first, dash, last = text.partition("-")
    if not dash:
        return (text,)
    start = RELEASES.index(first) if first else 0
    end = RELEASES.index(last) + 1 if last else len(RELEASES)
    return RELEASES[start:end]


def _tables() -> dict[str, dict[str, Option]]:
    tables: dict[str, dict[str, Option]] = {release: {} for release in RELEASES}
    for line in _ROWS.strip().splitlines():
        name, value, short, span, *alias = line.split()
        option = Option(
            name, _VALUES[value], "" if short == "-" else short, alias[0][1:] if alias else name
        )
        for release in _span(span):
            tables[release][name] = option
    return tables


_TABLES = _tables()


def options(release: str) -> dict[str, Option]:
    """Release ``release``'s sbatch options by long name (a copy); KeyError for a release the
    table does not describe."""
    return dict(_TABLES[release])


def short_options(release: str) -> dict[str, Option]:
    """Release ``release``'s sbatch options by short letter."""
    return {o.short: o for o in _TABLES[release].values() if o.short}


def _union() -> tuple[dict[str, Option], dict[str, Option]]:
    # Newest first: where a name's value kind changed (--requeue took an optional value from
    # 25.11), the newest is kept; by the invariant it needs the next word exactly when the
    # older did.
    longs: dict[str, Option] = {}
    shorts: dict[str, Option] = {}
    for release in reversed(RELEASES):
        for name, option in _TABLES[release].items():
            longs.setdefault(name, option)
            if option.short:
                shorts.setdefault(option.short, option)
    return longs, shorts


LONG, SHORT = _union()  # every release's options by long name and by short letter


def find_long(given: str) -> tuple[Optional[Option], list[str]]:
    """The option ``--given`` names, as sbatch's getopt_long reads it: (option, []) for a name
    or an abbreviation that names one option in some release (where releases differ, the one
    they agree on), (None, candidates) for an abbreviation of several options in every release
    that has one, (None, []) for a name no release knows."""
    if given in LONG:
        return LONG[given], []
    found: dict[str, Option] = {}
    ambiguous: set[str] = set()
    for release in RELEASES:
        matches = [o for name, o in _TABLES[release].items() if name.startswith(given)]
        if not matches:
            continue
        kinds = {(o.canonical, o.value) for o in matches}
        if len(kinds) == 1:
            found[release] = matches[0]
        else:
            ambiguous.update(o.name for o in matches)
    meanings = {o.canonical for o in found.values()}
    if len(meanings) == 1:
        return next(iter(found.values())), []
    if meanings:  # one option on one release, another on another: only the user's sbatch knows
        return None, sorted(o.name for o in found.values())
    return None, sorted(ambiguous)
