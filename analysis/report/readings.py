"""The readings (precision-policy presets) in words, and which real code each models: the one place the
report takes them from (docs/readings.md, kernels/attention.hpp kPolicyPresets).

A microbench.csv written by a build with real-code rows carries its own account in its "# code ALG:" and
"# machine:" lines (jobs/microbench/table.hpp code_notes, from kRealCode in kernels/microbench.hpp): the
report prefers those to the words here, so the report says what the build that ran measured.
"""

import re

READINGS = {
    "pure": "every step in the format, every add of every accumulation rounded",
    "eager": "a framework-level re-implementation (PyTorch ops on bf16/fp16 tensors): each op in fp32, its output "
             "and flash's state between key/value tiles in the format",
    "mixed": "a hypothetical reading: storage in the format, in-op values and running state in fp32; no known "
             "kernel does exactly this",
    "fa2": "the FlashAttention-2 CUDA kernel",
    "fa3": "the FlashAttention-3 Hopper kernel",
}
# The readings that model a GPU attention kernel (the others model re-implementations or nothing real).
KERNEL_READINGS = ("fa2", "fa3")

_CODE = re.compile(r"models (?P<reading>.+?) \(device (?P<device>\w+)\): (?P<code>.*)$")


def reading_words(name):
    return READINGS.get(name, "unknown reading")


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
