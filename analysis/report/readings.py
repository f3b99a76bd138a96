"""The readings (precision-policy presets) in words, and which real code each models, as the fastudy
binary lists them: `fastudy readings --json` (its table kReadings, kernels/attention_common.cpp) is the
one place the report takes them from. `fastudy report` sets FASTUDY_BIN to the program that renders, so
the report describes the readings of the build that made it; run alone, the renderer asks the program
FASTUDY_BIN names, else `fastudy` on PATH.

A microbench.csv written by a build with real-code rows carries its own account in its "# code ALG:" and
"# machine:" lines (jobs/microbench/table.hpp code_notes, from kRealCode in kernels/microbench.hpp): the
report prefers those to the words here, so the report says what the build that ran measured.
"""

import functools
import json
import os
import re
import shutil
import subprocess


class ReadingsUnavailable(RuntimeError):
    """The fastudy program could not be asked for its readings."""


def fastudy_program():
    """The fastudy program to ask: $FASTUDY_BIN, else `fastudy` on PATH."""
    program = os.environ.get("FASTUDY_BIN") or shutil.which("fastudy")
    if not program:
        raise ReadingsUnavailable("the report needs the readings of a fastudy build (`fastudy readings --json`), and "
                                  "FASTUDY_BIN is unset and no `fastudy` is on PATH; set FASTUDY_BIN=/path/to/fastudy")
    return program


@functools.lru_cache(maxsize=None)
def table():
    """{name: row} of `fastudy readings --json`, in the binary's order; each row has name, models, source,
    cuda, gpu_kernel and report."""
    program = fastudy_program()
    try:
        done = subprocess.run([program, "readings", "--json"], capture_output=True, text=True, timeout=120,
                              check=False)
    except OSError as e:
        raise ReadingsUnavailable(f"cannot run {program} readings --json: {e} (set FASTUDY_BIN to the fastudy "
                                  "program)") from e
    if done.returncode != 0:
        said = done.stderr.strip()
        raise ReadingsUnavailable(f"{program} readings --json failed (exit code {done.returncode})" +
                                  (f": {said}" if said else "") + " (set FASTUDY_BIN to a fastudy program)")
    try:
        rows = json.loads(done.stdout)["readings"]
    except (ValueError, KeyError, TypeError) as e:
        raise ReadingsUnavailable(f"{program} readings --json did not print the readings table: {e}") from e
    return {row["name"]: row for row in rows}


def kernel_readings():
    """The readings that model a GPU attention kernel (the others model re-implementations or nothing real)."""
    return tuple(name for name, row in table().items() if row["gpu_kernel"])


def reading_words(name):
    row = table().get(name)
    return row["report"] if row else "unknown reading"


_CODE = re.compile(r"models (?P<reading>.+?) \(device (?P<device>\w+)\): (?P<code>.*)$")


def real_codes(provenance):
    """{algorithm: {"reading": "eager flash" | "no reading", "device": "cpu" | "cuda", "code": description}} from
    the "# code ALG: models READING KIND (device D): CODE" lines of microbench.csv's header."""
    out = {}
    for key, value in provenance.items():
        if not key.startswith("code "):
            continue
        m = _CODE.match(value)
        if m:
            out[key[len("code "):]] = m.groupdict()
    return out
