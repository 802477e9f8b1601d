"""Templated Harbor task families, seeded, with oracle transcripts.

Each family turns a seed into one complete Harbor task (`TaskSpec`: instruction, task.toml,
environment/Dockerfile and data files, tests/test.sh, solution/solve.sh) deterministically. The
oracle is also stored as a *transcript*, `solution/transcript.json`::

    {"commands": [{"keystrokes": "echo apple > /app/notes.txt\\n", "duration": 0.5}]}

i.e. the Terminus-style keystrokes that solve the task in the persistent shell (`solve.sh` is the
same keystrokes as a script). An SFT script can turn transcripts into assistant turns.

Families, by difficulty (1 = easiest). The first two are meant for training a tiny policy: seeds
0..1999 of write-file (20 file names x 100 words) and 0..15999 of py-return (16 function names x 1000
integers) are all distinct tasks, so disjoint seed ranges are disjoint train / held-out splits:

===================  ==  ==========================================================================
family               lv  task
===================  ==  ==========================================================================
write-file           1   create /app/<name>.txt containing one given word
py-return            2   /app/solution.py with a no-argument function returning a given integer
shell-mkdir          2   create a nested directory with an empty .keep file
shell-script         2   an executable /app/greet.sh printing a greeting
shell-count-lines    3   write the line count of a data file
shell-sort           3   sort the words of a file into another file
shell-replace        3   replace a word everywhere in a config file
shell-unique         3   count the distinct lines of a file
shell-find           4   name the file of a folder that contains a word
shell-sum            4   sum a CSV column
py-kata              5   implement a function in /app/solution.py so that pytest passes
                         (pymethods2test style; a fixed list of katas, the seed picks one)
===================  ==  ==========================================================================

Every verifier writes 1 or 0 to /logs/verifier/reward.txt and pays 0 for an empty /app.
`write_shipped_tasks(out)` writes the set shipped in `jaxrl/assets/terminal_tasks/`
(`scripts/make_terminal_tasks.py`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import random
import textwrap
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

SHIPPED_TASKS_DIR = Path(__file__).resolve().parents[2] / "assets" / "terminal_tasks"

PY_DOCKERFILE = ("FROM ubuntu:24.04\n"
                 "RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip "
                 "python3-pytest && rm -rf /var/lib/apt/lists/*\n"
                 "WORKDIR /app\n")
SHELL_DOCKERFILE = "FROM ubuntu:24.04\nWORKDIR /app\n"

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "ocean", "pearl", "lemon", "amber", "cedar",
         "delta", "ember", "flint", "grape", "honey", "ivory", "jelly", "koala", "lunar", "mango", "noble",
         "olive", "piano", "quilt", "raven", "solar", "tulip", "umbra", "vivid", "waltz", "xenon", "yacht",
         "zebra", "acorn", "bison", "candy", "daisy", "eagle", "fable", "globe", "hazel", "igloo", "joker",
         "kayak", "lilac", "moose", "nylon", "orbit", "panda", "quartz", "robin", "spice", "toast", "urban",
         "viola", "wheat", "yodel", "zesty", "blaze", "coral", "dune", "frost", "gecko", "heron", "iris",
         "jade", "kite", "lotus", "mint", "nova", "onyx", "plum", "quail", "reef", "sage", "thorn", "violet",
         "willow", "yarrow", "birch", "comet", "drift", "fern", "glade", "harbor", "inlet", "juniper",
         "kelp", "lark", "marsh", "nectar", "oasis", "pine", "ridge", "shore", "tide", "vale", "wren",
         "aspen")
FILE_NAMES = ("notes", "greeting", "answer", "data", "hello", "output", "result", "message", "token", "word",
              "label", "name", "value", "entry", "item", "record", "memo", "draft", "reply", "status")
FUNC_NAMES = ("get_value", "answer", "magic_number", "compute", "lucky_number", "count", "total", "result",
              "secret", "get_number", "score", "level", "size", "limit", "offset", "base_value")
PEOPLE = ("Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Mallory",
          "Niaj", "Olivia", "Peggy", "Rupert", "Sybil", "Trent", "Victor", "Walter", "Zoe")


@dataclasses.dataclass
class TaskSpec:
    """One generated task: everything needed to write its Harbor directory.

    Attributes:
      name: the directory name (`<family>-<seed:03d>`, or `py-kata-<kata>`).
      family: the family name.
      seed: the seed it was generated from.
      difficulty: 1 (easiest) to 5.
      instruction: the text of instruction.md.
      transcript: the oracle's keystrokes: a list of `{"keystrokes", "duration"}`.
      files: extra files, `relative path -> text` (environment/, tests/); paths under tests/ or
        ending in .sh are made executable.
    """

    name: str
    family: str
    seed: int
    difficulty: int
    instruction: str
    transcript: list
    files: dict

    def task_toml(self) -> str:
        return (f'schema_version = "1.1"\n\n[task]\nname = "jaxrl/{self.name}"\n\n'
                f'[metadata]\nfamily = "{self.family}"\ndifficulty = {self.difficulty}\nseed = {self.seed}\n'
                'author = "jaxrl scripts/make_terminal_tasks.py"\n\n'
                '[agent]\ntimeout_sec = 120.0\n\n[verifier]\ntimeout_sec = 60.0\n\n'
                '[environment]\ncpus = 1\nmemory_mb = 1024\nstorage_mb = 256\nallow_internet = false\n')

    def solve_sh(self) -> str:
        return "#!/bin/bash\n# Oracle: the keystrokes of solution/transcript.json as a script.\n" + \
            "".join(c["keystrokes"] for c in self.transcript)

    def all_files(self) -> dict:
        """Every file of the task directory, `relative path -> text`."""
        out = {"instruction.md": self.instruction.rstrip("\n") + "\n", "task.toml": self.task_toml(),
               "solution/solve.sh": self.solve_sh(),
               "solution/transcript.json": json.dumps({"commands": self.transcript}, indent=2) + "\n"}
        out.update(self.files)
        return dict(sorted(out.items()))


def _cmd(keystrokes: str, duration: float = 0.5) -> dict:
    return {"keystrokes": keystrokes if keystrokes.endswith("\n") else keystrokes + "\n", "duration": duration}


def _shell_test(check: str, comment: str) -> str:
    return ("#!/bin/bash\n"
            f"# Verifier: reward 1 only if {comment}.\n"
            "mkdir -p /logs/verifier\n"
            f"if {check}; then\n  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n")


PYTEST_SH = ("#!/bin/bash\n"
             "# Verifier: reward 1 only if the tests in /tests/test_solution.py pass against /app.\n"
             "mkdir -p /logs/verifier\n"
             "cd /app\n"
             "python3 -m pytest -q -p no:cacheprovider /tests/test_solution.py\n"
             "if [ $? -eq 0 ]; then\n  echo 1 > /logs/verifier/reward.txt\nelse\n"
             "  echo 0 > /logs/verifier/reward.txt\nfi\n")


def _rng(family: str, seed: int) -> random.Random:
    return random.Random(f"jaxrl-terminal-tasks:{family}:{seed}")


def _distinct(family: str, seed: int, *choices: Sequence) -> tuple:
    """The seed-th element of a fixed shuffle of the product of `choices`: seeds below the product's
    size give distinct combinations (so disjoint seed ranges give disjoint train / held-out tasks)."""
    sizes = [len(c) for c in choices]
    total = math.prod(sizes)
    perm = _permutation(family, total)
    i = perm[seed % total]
    out = []
    for c, n in zip(reversed(choices), reversed(sizes)):
        out.append(c[i % n])
        i //= n
    return tuple(reversed(out))


@functools.lru_cache(maxsize=None)
def _permutation(family: str, n: int) -> tuple:
    order = list(range(n))
    random.Random(f"jaxrl-terminal-tasks:{family}:permutation").shuffle(order)
    return tuple(order)


# ---------------------------------------------------------------------------------------------------
# Families


def write_file(seed: int) -> TaskSpec:
    name, word = _distinct("write-file", seed, FILE_NAMES, WORDS)
    path = f"/app/{name}.txt"
    return TaskSpec(
        name=f"write-file-{seed:03d}", family="write-file", seed=seed, difficulty=1,
        instruction=f"Create the file {path} containing the word {word}.",
        transcript=[_cmd(f"echo {word} > {path}")],
        files={"environment/Dockerfile": SHELL_DOCKERFILE,
               "tests/test.sh": _shell_test(f'[ -f {path} ] && [ "$(cat {path})" = "{word}" ]',
                                            f"{path} contains exactly the word {word}")})


def py_return(seed: int) -> TaskSpec:
    fn, n = _distinct("py-return", seed, FUNC_NAMES, range(1000))
    test = textwrap.dedent(f"""\
        from solution import {fn}


        def test_returns_the_integer():
            assert {fn}() == {n}
            assert type({fn}()) is int
        """)
    return TaskSpec(
        name=f"py-return-{seed:03d}", family="py-return", seed=seed, difficulty=2,
        instruction=f"Create /app/solution.py with a function {fn}() that returns the integer {n}.",
        transcript=[_cmd(f"printf 'def {fn}():\\n    return {n}\\n' > /app/solution.py")],
        files={"environment/Dockerfile": PY_DOCKERFILE, "tests/test.sh": PYTEST_SH, "tests/test_solution.py": test})


def shell_mkdir(seed: int) -> TaskSpec:
    r = _rng("shell-mkdir", seed)
    parts = r.sample(WORDS, 3)
    d = "/app/" + "/".join(parts)
    return TaskSpec(
        name=f"shell-mkdir-{seed:03d}", family="shell-mkdir", seed=seed, difficulty=2,
        instruction=f"Create the directory {d} (with its parents) and an empty file named .keep inside it.",
        transcript=[_cmd(f"mkdir -p {d} && touch {d}/.keep")],
        files={"environment/Dockerfile": SHELL_DOCKERFILE,
               "tests/test.sh": _shell_test(f"[ -d {d} ] && [ -f {d}/.keep ] && [ ! -s {d}/.keep ]",
                                            f"{d}/.keep exists and is empty")})


def shell_script(seed: int) -> TaskSpec:
    r = _rng("shell-script", seed)
    who = r.choice(PEOPLE)
    msg = f"Hello, {who}!"
    return TaskSpec(
        name=f"shell-script-{seed:03d}", family="shell-script", seed=seed, difficulty=2,
        instruction=f"Write an executable shell script /app/greet.sh that prints exactly: {msg}",
        transcript=[_cmd(f"printf '#!/bin/bash\\necho \"{msg}\"\\n' > /app/greet.sh"),
                    _cmd("chmod +x /app/greet.sh")],
        files={"environment/Dockerfile": SHELL_DOCKERFILE,
               "tests/test.sh": _shell_test(f'[ -x /app/greet.sh ] && [ "$(cd /tmp && /app/greet.sh)" = "{msg}" ]',
                                            "/app/greet.sh is executable and prints the greeting")})


def _data_dockerfile(*files: str) -> str:
    return SHELL_DOCKERFILE + "".join(f"COPY {f} /app/{f}\n" for f in files)


def shell_count_lines(seed: int) -> TaskSpec:
    r = _rng("shell-count-lines", seed)
    n = r.randrange(5, 40)
    lines = [" ".join(r.choices(WORDS, k=r.randrange(1, 5))) for _ in range(n)]
    return TaskSpec(
        name=f"shell-count-lines-{seed:03d}", family="shell-count-lines", seed=seed, difficulty=3,
        instruction="Write the number of lines in /app/data.txt to /app/count.txt.",
        transcript=[_cmd("wc -l < /app/data.txt > /app/count.txt")],
        files={"environment/Dockerfile": _data_dockerfile("data.txt"),
               "environment/data.txt": "\n".join(lines) + "\n",
               "tests/test.sh": _shell_test(f'[ -f /app/count.txt ] && [ "$(tr -d " \\n" < /app/count.txt)" = "{n}" ]',
                                            f"/app/count.txt holds {n}")})


def shell_sort(seed: int) -> TaskSpec:
    r = _rng("shell-sort", seed)
    words = r.sample(WORDS, r.randrange(6, 15))
    expected = "\\n".join(sorted(words))
    return TaskSpec(
        name=f"shell-sort-{seed:03d}", family="shell-sort", seed=seed, difficulty=3,
        instruction="Sort the lines of /app/words.txt alphabetically and write them to /app/sorted.txt.",
        transcript=[_cmd("sort /app/words.txt > /app/sorted.txt")],
        files={"environment/Dockerfile": _data_dockerfile("words.txt"),
               "environment/words.txt": "\n".join(words) + "\n",
               "tests/test.sh": _shell_test(f'[ -f /app/sorted.txt ] && [ "$(cat /app/sorted.txt)" = "$(printf \'{expected}\')" ]',
                                            "/app/sorted.txt holds the sorted words")})


def shell_replace(seed: int) -> TaskSpec:
    r = _rng("shell-replace", seed)
    old, new = r.sample(WORDS, 2)
    keys = r.sample(("mode", "color", "theme", "level", "target", "profile", "owner", "region"), 4)
    lines = [f"{k}={r.choice([old, r.choice(WORDS)])}" for k in keys]
    lines[r.randrange(len(lines))] = f"{keys[0]}={old}"
    content = "\n".join(lines) + "\n"
    expected = content.replace(old, new)
    return TaskSpec(
        name=f"shell-replace-{seed:03d}", family="shell-replace", seed=seed, difficulty=3,
        instruction=f"Replace every occurrence of {old} with {new} in /app/config.txt (edit the file in place).",
        transcript=[_cmd(f"sed -i 's/{old}/{new}/g' /app/config.txt")],
        files={"environment/Dockerfile": _data_dockerfile("config.txt"),
               "environment/config.txt": content,
               "tests/expected.txt": expected,
               "tests/test.sh": _shell_test("cmp -s /app/config.txt /tests/expected.txt",
                                            f"/app/config.txt has every {old} replaced by {new}")})


def shell_unique(seed: int) -> TaskSpec:
    r = _rng("shell-unique", seed)
    pool = r.sample(WORDS, r.randrange(3, 9))
    items = [r.choice(pool) for _ in range(r.randrange(12, 30))]
    n = len(set(items))
    return TaskSpec(
        name=f"shell-unique-{seed:03d}", family="shell-unique", seed=seed, difficulty=3,
        instruction="Count the distinct lines of /app/items.txt and write the number to /app/unique.txt.",
        transcript=[_cmd("sort -u /app/items.txt | wc -l > /app/unique.txt")],
        files={"environment/Dockerfile": _data_dockerfile("items.txt"),
               "environment/items.txt": "\n".join(items) + "\n",
               "tests/test.sh": _shell_test(f'[ -f /app/unique.txt ] && [ "$(tr -d " \\n" < /app/unique.txt)" = "{n}" ]',
                                            f"/app/unique.txt holds {n}")})


def shell_find(seed: int) -> TaskSpec:
    r = _rng("shell-find", seed)
    token = r.choice(["needle", "secret", "marker", "beacon", "signal"])
    names = [f"{w}.txt" for w in r.sample(WORDS, r.randrange(4, 8))]
    target = r.choice(names)
    files = {"environment/Dockerfile": SHELL_DOCKERFILE + "COPY docs /app/docs\n"}
    for n in names:
        body = [" ".join(r.choices(WORDS, k=6)) for _ in range(r.randrange(2, 6))]
        if n == target:
            body.insert(r.randrange(len(body) + 1), f"the {token} is here")
        files[f"environment/docs/{n}"] = "\n".join(body) + "\n"
    files["tests/test.sh"] = _shell_test(f'[ -f /app/answer.txt ] && [ "$(tr -d " \\n" < /app/answer.txt)" = "{target}" ]',
                                         f"/app/answer.txt names {target}")
    return TaskSpec(
        name=f"shell-find-{seed:03d}", family="shell-find", seed=seed, difficulty=4,
        instruction=f"One file in /app/docs contains the word {token}. Write its file name (without the "
                    "directory) to /app/answer.txt.",
        transcript=[_cmd(f"grep -l {token} /app/docs/* | xargs -n1 basename > /app/answer.txt")], files=files)


def shell_sum(seed: int) -> TaskSpec:
    r = _rng("shell-sum", seed)
    rows = [(w, r.randrange(1, 500)) for w in r.sample(WORDS, r.randrange(4, 12))]
    total = sum(v for _, v in rows)
    csv = "name,value\n" + "".join(f"{w},{v}\n" for w, v in rows)
    return TaskSpec(
        name=f"shell-sum-{seed:03d}", family="shell-sum", seed=seed, difficulty=4,
        instruction="/app/numbers.csv has a header line and the columns name,value. Write the sum of the value "
                    "column to /app/total.txt.",
        transcript=[_cmd("awk -F, 'NR>1 {s+=$2} END {print s}' /app/numbers.csv > /app/total.txt")],
        files={"environment/Dockerfile": _data_dockerfile("numbers.csv"), "environment/numbers.csv": csv,
               "tests/test.sh": _shell_test(f'[ -f /app/total.txt ] && [ "$(tr -d " \\n" < /app/total.txt)" = "{total}" ]',
                                            f"/app/total.txt holds {total}")})


# py-kata: (name, signature, description, solution body, tests)
KATAS = [
    ("is-palindrome", "is_palindrome(text: str) -> bool",
     "Return True if text reads the same forwards and backwards, ignoring case and every character that is "
     "not a letter or a digit.\nExamples: is_palindrome(\"A man, a plan, a canal: Panama\") == True, "
     "is_palindrome(\"abc\") == False.",
     "def is_palindrome(text):\n    s = [c.lower() for c in text if c.isalnum()]\n    return s == s[::-1]\n",
     ["assert is_palindrome('A man, a plan, a canal: Panama') is True", "assert is_palindrome('abc') is False",
      "assert is_palindrome('') is True", "assert is_palindrome('No lemon, no melon') is True",
      "assert is_palindrome('12a21') is True", "assert is_palindrome('ab2a') is False"]),
    ("fizzbuzz", "fizzbuzz(n: int) -> list",
     "Return the list of strings for 1..n: \"Fizz\" for multiples of 3, \"Buzz\" for multiples of 5, "
     "\"FizzBuzz\" for multiples of both, otherwise the number as a string.\nExample: fizzbuzz(5) == "
     "[\"1\", \"2\", \"Fizz\", \"4\", \"Buzz\"].",
     "def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n        s = ('Fizz' if i % 3 == 0 else '') + "
     "('Buzz' if i % 5 == 0 else '')\n        out.append(s or str(i))\n    return out\n",
     ["assert fizzbuzz(5) == ['1', '2', 'Fizz', '4', 'Buzz']", "assert fizzbuzz(0) == []",
      "assert fizzbuzz(15)[-1] == 'FizzBuzz'", "assert fizzbuzz(15)[9] == 'Buzz'", "assert len(fizzbuzz(100)) == 100"]),
    ("word-frequencies", "word_frequencies(text: str) -> dict",
     "Return a dict mapping each lower-cased word of text to the number of times it occurs. Words are "
     "separated by whitespace; strip the punctuation characters .,!? from both ends of each word.\n"
     "Example: word_frequencies(\"The cat. the hat!\") == {\"the\": 2, \"cat\": 1, \"hat\": 1}.",
     "def word_frequencies(text):\n    out = {}\n    for w in text.split():\n        w = w.strip('.,!?').lower()\n"
     "        if w:\n            out[w] = out.get(w, 0) + 1\n    return out\n",
     ["assert word_frequencies('The cat. the hat!') == {'the': 2, 'cat': 1, 'hat': 1}",
      "assert word_frequencies('') == {}", "assert word_frequencies('a a a') == {'a': 3}",
      "assert word_frequencies('Hi! hi? HI.') == {'hi': 3}"]),
    ("flatten", "flatten(nested: list) -> list",
     "Return a flat list of all non-list items of an arbitrarily nested list, in order.\n"
     "Example: flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5].",
     "def flatten(nested):\n    out = []\n    for x in nested:\n        if isinstance(x, list):\n"
     "            out.extend(flatten(x))\n        else:\n            out.append(x)\n    return out\n",
     ["assert flatten([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]", "assert flatten([]) == []",
      "assert flatten([[[]]]) == []", "assert flatten(['a', ['b'], [['c']]]) == ['a', 'b', 'c']"]),
    ("gcd", "gcd(a: int, b: int) -> int",
     "Return the greatest common divisor of two non-negative integers (gcd(0, 0) == 0). Do not use math.gcd.\n"
     "Example: gcd(12, 18) == 6.",
     "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
     ["assert gcd(12, 18) == 6", "assert gcd(7, 13) == 1", "assert gcd(0, 5) == 5", "assert gcd(0, 0) == 0",
      "assert gcd(100, 75) == 25"]),
    ("to-roman", "to_roman(n: int) -> str",
     "Return the Roman numeral for 1 <= n <= 3999 (subtractive notation: IV, IX, XL, XC, CD, CM).\n"
     "Examples: to_roman(4) == \"IV\", to_roman(1994) == \"MCMXCIV\".",
     "def to_roman(n):\n    vals = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
     "            (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n"
     "    out = ''\n    for v, s in vals:\n        while n >= v:\n            out += s\n            n -= v\n"
     "    return out\n",
     ["assert to_roman(4) == 'IV'", "assert to_roman(1994) == 'MCMXCIV'", "assert to_roman(3999) == 'MMMCMXCIX'",
      "assert to_roman(58) == 'LVIII'", "assert to_roman(1) == 'I'"]),
    ("run-length", "run_length_encode(text: str) -> str",
     "Encode runs of equal characters as the character followed by the run length.\n"
     "Examples: run_length_encode(\"aaabcc\") == \"a3b1c2\", run_length_encode(\"\") == \"\".",
     "def run_length_encode(text):\n    out, i = [], 0\n    while i < len(text):\n        j = i\n"
     "        while j < len(text) and text[j] == text[i]:\n            j += 1\n"
     "        out.append(text[i] + str(j - i))\n        i = j\n    return ''.join(out)\n",
     ["assert run_length_encode('aaabcc') == 'a3b1c2'", "assert run_length_encode('') == ''",
      "assert run_length_encode('a') == 'a1'", "assert run_length_encode('zzzzzzzzzzzz') == 'z12'",
      "assert run_length_encode('abab') == 'a1b1a1b1'"]),
    ("merge-intervals", "merge_intervals(intervals: list) -> list",
     "Merge overlapping closed intervals given as [start, end] pairs; return the merged intervals as "
     "[start, end] lists sorted by start. Touching intervals ([1, 2] and [2, 3]) merge.\n"
     "Example: merge_intervals([[1, 3], [2, 6], [8, 10]]) == [[1, 6], [8, 10]].",
     "def merge_intervals(intervals):\n    out = []\n    for s, e in sorted(intervals):\n"
     "        if out and s <= out[-1][1]:\n            out[-1][1] = max(out[-1][1], e)\n        else:\n"
     "            out.append([s, e])\n    return out\n",
     ["assert merge_intervals([[1, 3], [2, 6], [8, 10]]) == [[1, 6], [8, 10]]", "assert merge_intervals([]) == []",
      "assert merge_intervals([[1, 2], [2, 3]]) == [[1, 3]]", "assert merge_intervals([[5, 6], [1, 2]]) == [[1, 2], [5, 6]]",
      "assert merge_intervals([[1, 10], [2, 3]]) == [[1, 10]]"]),
    ("caesar", "caesar_cipher(text: str, shift: int) -> str",
     "Shift every ASCII letter of text by shift positions in the alphabet (wrapping around, keeping case); "
     "leave other characters unchanged. shift may be negative or larger than 26.\n"
     "Example: caesar_cipher(\"Hello, World!\", 3) == \"Khoor, Zruog!\".",
     "def caesar_cipher(text, shift):\n    out = []\n    for c in text:\n        if 'a' <= c <= 'z':\n"
     "            out.append(chr((ord(c) - 97 + shift) % 26 + 97))\n        elif 'A' <= c <= 'Z':\n"
     "            out.append(chr((ord(c) - 65 + shift) % 26 + 65))\n        else:\n            out.append(c)\n"
     "    return ''.join(out)\n",
     ["assert caesar_cipher('Hello, World!', 3) == 'Khoor, Zruog!'", "assert caesar_cipher('abc', -1) == 'zab'",
      "assert caesar_cipher('xyz', 29) == 'abc'", "assert caesar_cipher('', 5) == ''",
      "assert caesar_cipher('Zz 9', 1) == 'Aa 9'"]),
    ("primes", "primes_up_to(n: int) -> list",
     "Return the list of prime numbers <= n in increasing order.\nExample: primes_up_to(10) == [2, 3, 5, 7].",
     "def primes_up_to(n):\n    return [p for p in range(2, n + 1) if all(p % d for d in range(2, int(p ** 0.5) + 1))]\n",
     ["assert primes_up_to(10) == [2, 3, 5, 7]", "assert primes_up_to(1) == []", "assert primes_up_to(2) == [2]",
      "assert len(primes_up_to(100)) == 25", "assert primes_up_to(30)[-1] == 29"]),
]


def py_kata(seed: int) -> TaskSpec:
    name, sig, desc, solution, asserts = KATAS[seed % len(KATAS)]
    fn = sig.split("(")[0]
    test = f"from solution import {fn}\n\n\n" + "".join(
        f"def test_{i}():\n    {a}\n\n\n" for i, a in enumerate(asserts)).rstrip("\n") + "\n"
    keystrokes = "cat > /app/solution.py << 'EOF'\n" + solution + "EOF\n"
    return TaskSpec(
        name=f"py-kata-{name}", family="py-kata", seed=seed, difficulty=5,
        instruction=f"Implement the function {sig} in /app/solution.py.\n\n{desc}\n\n"
                    "Tests will import it with `from solution import " + fn + "`.",
        transcript=[_cmd(keystrokes, 1.0)],
        files={"environment/Dockerfile": PY_DOCKERFILE, "tests/test.sh": PYTEST_SH, "tests/test_solution.py": test})


FAMILIES: dict[str, Callable[[int], TaskSpec]] = {
    "write-file": write_file, "py-return": py_return, "shell-mkdir": shell_mkdir, "shell-script": shell_script,
    "shell-count-lines": shell_count_lines, "shell-sort": shell_sort, "shell-replace": shell_replace,
    "shell-unique": shell_unique, "shell-find": shell_find, "shell-sum": shell_sum, "py-kata": py_kata,
}
"""family name -> generator(seed) -> TaskSpec."""

SHIPPED = {"write-file": range(8), "py-return": range(8), "shell-mkdir": range(1), "shell-script": range(1),
           "shell-count-lines": range(2), "shell-sort": range(1), "shell-replace": range(2), "shell-unique": range(1),
           "shell-find": range(2), "shell-sum": range(2), "py-kata": range(len(KATAS))}
"""The shipped set: family -> seeds (38 tasks)."""


def make_task(family: str, seed: int) -> TaskSpec:
    """The task of `family` for `seed` (deterministic).

    Raises:
      KeyError: unknown family (the message lists the known ones).
    """
    if family not in FAMILIES:
        raise KeyError(f"unknown task family {family!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[family](int(seed))


def write_task(spec: TaskSpec, out_dir: str | os.PathLike) -> Path:
    """Writes the task directory `out_dir/<spec.name>/` (replacing nothing: it must not exist)."""
    d = Path(out_dir) / spec.name
    d.mkdir(parents=True)
    for rel, text in spec.all_files().items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        os.chmod(p, 0o755 if rel.endswith(".sh") else 0o644)
    return d


def generate_tasks(family: str, seeds: Iterable[int], out_dir: str | os.PathLike) -> list[Path]:
    """Writes one task per seed of `family` under `out_dir`; returns the task directories."""
    return [write_task(make_task(family, s), out_dir) for s in seeds]


def shipped_specs() -> list[TaskSpec]:
    return [make_task(f, s) for f, seeds in SHIPPED.items() for s in seeds]


def write_shipped_tasks(out_dir: str | os.PathLike) -> list[Path]:
    """Writes the shipped set (`SHIPPED`) under `out_dir`."""
    return [write_task(s, out_dir) for s in shipped_specs()]


def load_transcript(task_dir: str | os.PathLike) -> Optional[list]:
    """The oracle transcript of a task (`solution/transcript.json`), or None if it has none."""
    p = Path(task_dir) / "solution" / "transcript.json"
    if not p.is_file():
        return None
    return json.loads(p.read_text())["commands"]
