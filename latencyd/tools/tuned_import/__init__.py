"""tuned_import: convert TuneD profiles (tuned.conf, INI) into latencyd profiles (TOML).

`latencyctl import-tuned NAME|DIR|FILE [-o DIR]` writes one latencyd profile per TuneD
profile in the include chain, and lists everything it could not convert, with the
reason, as comments in the files and on stderr. TuneD's semantics are kept: includes
are found and merged as TuneD does, variables stay variables where latencyd has the
same thing, what depends on the machine is evaluated on this one and reported.

The package, from TuneD's side to latencyd's:

- `profiles`: tuned.conf as TuneD reads it; the search path, include chains, the merge.
- `values`: TuneD's value language (${var}, ${f:...}) and its evaluation on this machine;
  `cpulists`: TuneD's CPU lists and their latencyd expressions; `host`: this machine's
  facts that evaluation may use.
- `variables`: a profile's [variables], and TuneD values translated into latencyd's.
- `convert`: one merged profile into latencyd items and findings (`results`), through
  one converter per TuneD plugin (`convert_cpu`, `convert_knobs`, `convert_threads`,
  `convert_net`, `convert_unsupported`) sharing a `context`.
- `output`: the chain as latencyd files with their comments, and `import_tuned`, the
  I/O edge that reads the profiles and writes the files.
"""

from latencyd.tools.tuned_import.host import Host, IdleState, read_host
from latencyd.tools.tuned_import.output import (
    COMPLETE,
    IMPOSSIBLE,
    MARKER,
    PARTIAL,
    ImportResult,
    OutputFile,
    import_tuned,
)
from latencyd.tools.tuned_import.profiles import TUNED_DIRS
from latencyd.tools.tuned_import.results import ImportFailed

__all__ = [
    "COMPLETE",
    "IMPOSSIBLE",
    "MARKER",
    "PARTIAL",
    "TUNED_DIRS",
    "Host",
    "IdleState",
    "ImportFailed",
    "ImportResult",
    "OutputFile",
    "import_tuned",
    "read_host",
]
