"""Structure-aware fuzz of grid.toml through the command line: every mutation must end with exit 0
(a valid grid) or 2 (a configuration error with a message), never a crash, a hang or another code.

Mutations start from the grids in configs/ (parsed with tomllib) and change the structure: delete,
add or rename keys and sections, change a value's type, put extreme numbers (0, -1, 2^63-1, huge
floats, nan, inf), odd strings (empty, unicode, control characters, very long), empty or huge lists,
nested tables, and raw text edits of the serialised file (truncation, a byte inserted, lines
duplicated or swapped). Each mutated grid runs `fastudy plan GRID --ranks R` under a timeout.

Run (from the repository root; a -DFASTUDY_SANITIZE=address,undefined build runs it under ASan/UBSan):
  /usr/bin/python3 bench/reliability/grid_fuzz.py build --count 2000 --jobs 2
Prints the count of each outcome and keeps every failing grid in the work directory.
"""
import argparse
import concurrent.futures
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ["ci.toml", "quick.toml", "microbench.toml", "paper.toml"]

NUMBERS = [0, -1, 1, 2, 3, 7, 64, 1000003, 2**31 - 1, 2**31, 2**62, 2**63 - 1, -(2**63), 0.0, -0.5, 1e-300,
           1e300, float("nan"), float("inf"), float("-inf"), 3.5]
STRINGS = ["", " ", "fp16", "bf16", "flash", "baseline", "nope", "x" * 5000, "\u00e9\u4e2d\U0001f600", "a\tb",
           "../../etc", "out/$(touch pwned)", "'quote\"", "fp8_e4m3", "kv_outer", "q_outer", "mixed", "pure"]
KEYS = ["vocab", "d_model", "heads", "layers", "seq_len", "steps", "batch", "lr", "block_q", "block_kv",
        "precision", "attention", "seed", "policy", "kind", "path", "formats", "phases", "name", "out",
        "ranks_per_variant", "checkpoint_every", "token_bytes", "memory_check", "unknown_key", "seq_lens"]
SECTIONS = ["study", "grid", "model", "data", "train", "attention", "microbench", "reduce", "bogus"]


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        out = '"'
        for ch in v:
            if ch in '"\\':
                out += "\\" + ch
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                out += "\\u%04x" % ord(ch)
            else:
                out += ch
        return out + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def toml_key(k):
    return k if k and all(c.isalnum() or c in "_-" for c in k) else toml_value(k)


def dump(doc):
    lines, tables = [], []
    for k, v in doc.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{toml_key(k)} = {toml_value(v)}")
    for name, table in tables:
        lines.append(f"[{toml_key(name)}]")
        sub = []
        for k, v in table.items():
            if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
                sub.append((k, v))
            elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                for item in v:
                    sub.append((k, [item]))
            else:
                lines.append(f"{toml_key(k)} = {toml_value(v)}")
        for k, v in sub:
            if isinstance(v, list):
                for item in v:
                    lines.append(f"[[{toml_key(name)}.{toml_key(k)}]]")
                    lines += [f"{toml_key(a)} = {toml_value(b)}" for a, b in item.items()]
            else:
                for k2, v2 in v.items():
                    lines.append(f"[{toml_key(name)}.{toml_key(k)}.{toml_key(k2)}]")
                    lines += [f"{toml_key(a)} = {toml_value(b)}" for a, b in v2.items()]
    return "\n".join(lines) + "\n"


def random_value(rng, depth=0):
    r = rng.random()
    if r < 0.35:
        return rng.choice(NUMBERS)
    if r < 0.65:
        return rng.choice(STRINGS)
    if r < 0.72:
        return rng.choice([True, False])
    if r < 0.92 and depth < 2:
        return [random_value(rng, depth + 1) for _ in range(rng.choice([0, 1, 2, 3, 50]))]
    if depth < 2:
        return {rng.choice(KEYS): random_value(rng, depth + 1)}
    return 1


def table(doc, name):
    """doc[name] as a table (a section a previous mutation made a scalar becomes a table again)."""
    if not isinstance(doc.get(name), dict):
        doc[name] = {}
    return doc[name]


def mutate_doc(doc, rng):
    for _ in range(rng.choice([1, 1, 2, 3])):
        sections = [k for k, v in doc.items() if isinstance(v, dict)]
        op = rng.randrange(9)
        if op == 0 and sections:  # delete a key
            s = doc[rng.choice(sections)]
            if s:
                del s[rng.choice(list(s))]
        elif op == 1:  # add or overwrite a key with a random value
            table(doc, rng.choice(SECTIONS))[rng.choice(KEYS)] = random_value(rng)
        elif op == 2 and sections:  # change the type or value of an existing key
            s = doc[rng.choice(sections)]
            if s:
                s[rng.choice(list(s))] = random_value(rng)
        elif op == 3 and sections:  # delete a section
            del doc[rng.choice(sections)]
        elif op == 4:  # a grid axis with odd values
            table(doc, "grid")[rng.choice(KEYS)] = [random_value(rng) for _ in range(rng.choice([0, 1, 2, 4]))]
        elif op == 5 and sections:  # a section replaced by a scalar
            doc[rng.choice(sections)] = random_value(rng)
        elif op == 6:  # a number key at an extreme
            table(doc, rng.choice(["model", "train", "attention", "microbench"]))[rng.choice(KEYS)] = rng.choice(NUMBERS)
        elif op == 7 and sections:  # rename a key (a typo)
            s = doc[rng.choice(sections)]
            if s:
                k = rng.choice(list(s))
                s[k[:-1] + "x" if k else "x"] = s.pop(k)
        else:  # a custom policy or sweep table
            table(table(doc, "attention"), "policies")["p" + str(rng.randrange(3))] = {
                rng.choice(["q", "k", "v", "s", "p", "accum", "stats", "bogus"]): random_value(rng)}
    return doc


def mutate_text(text, rng):
    lines = text.split("\n")
    op = rng.randrange(5)
    if op == 0:
        return text[: rng.randrange(len(text) + 1)]
    if op == 1:
        at = rng.randrange(len(text) + 1)
        return text[:at] + chr(rng.choice([0, 9, 10, 13, 34, 39, 61, 91, 93, 92, 0x7F, 0xE9, 0x1F600])) + text[at:]
    if op == 2 and lines:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
    elif op == 3 and len(lines) > 1:
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    else:
        at = rng.randrange(len(text) + 1)
        return text[:at] + text[at:][rng.randrange(8):]
    return "\n".join(lines)


def make_case(rng, seeds):
    name, doc = rng.choice(seeds)
    doc = mutate_doc(copy_doc(doc), rng)
    text = dump(doc)
    if rng.random() < 0.3:
        text = mutate_text(text, rng)
    return name, text


def copy_doc(v):
    if isinstance(v, dict):
        return {k: copy_doc(x) for k, x in v.items()}
    if isinstance(v, list):
        return [copy_doc(x) for x in v]
    return v


def run_case(exe, path, ranks, timeout):
    try:
        r = subprocess.run([exe, "plan", str(path), "--ranks", str(ranks)], capture_output=True, timeout=timeout,
                           env=dict(os.environ, FASTUDY_PYTHON="/bin/true"))
        return r.returncode, r.stderr.decode("utf-8", "replace")[-400:]
    except subprocess.TimeoutExpired:
        return "timeout", ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", help="the build directory (holds the fastudy binary)")
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--keep", help="directory for failing grids (default: a temporary one)")
    args = ap.parse_args()
    exe = str(Path(args.build).resolve() / "fastudy")
    rng = random.Random(args.seed)
    seeds = [(n, tomllib.loads((ROOT / "configs" / n).read_text())) for n in SEEDS]
    work = Path(tempfile.mkdtemp(prefix="fastudy-grid-fuzz-"))
    keep = Path(args.keep) if args.keep else work / "failing"
    keep.mkdir(parents=True, exist_ok=True)
    cases = []
    for i in range(args.count):
        name, text = make_case(rng, seeds)
        path = work / f"case{i:05d}.toml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        cases.append((i, name, path, rng.choice([1, 2, 3, 4, 64])))
    outcomes = {}
    failures = 0
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run_case, exe, p, r, args.timeout): (i, n, p) for i, n, p, r in cases}
        for f in concurrent.futures.as_completed(futures):
            i, name, path = futures[f]
            code, err = f.result()
            outcomes[code] = outcomes.get(code, 0) + 1
            if code not in (0, 2):
                failures += 1
                shutil.copy(path, keep / path.name)
                print(f"FAIL case {i} (from {name}): exit {code}\n{err}", file=sys.stderr)
            done = sum(outcomes.values())
            if done % 250 == 0:
                print(f"  {done}/{args.count}: " + ", ".join(f"exit {k}: {v}" for k, v in sorted(outcomes.items(), key=lambda kv: str(kv[0]))), flush=True)
    print(f"grid fuzz: {args.count} mutations (seed {args.seed}), outcomes: " +
          ", ".join(f"exit {k}: {v}" for k, v in sorted(outcomes.items(), key=lambda kv: str(kv[0]))))
    print(f"failing grids kept in {keep}" if failures else "no crash, hang or unexpected exit code")
    shutil.rmtree(work / "failing", ignore_errors=True) if not failures and not args.keep else None
    for p in work.glob("case*.toml"):
        p.unlink()
    if not failures and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
