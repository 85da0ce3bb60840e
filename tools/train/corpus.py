"""corpus.py - the training corpus of the small ds4 model: the Python
standard library of the Python that runs this script (its .py sources, test
suites included, and the English reference text of pydoc_data/topics.py),
all under the PSF licence (the LICENSE file next to the sources).

Documents:
  * every .py file below the stdlib folder, site-/dist-packages excluded and
    files over MAX_FILE bytes skipped (generated tables), in path order;
  * every pydoc topic (79 entries of the language reference) as text;
  * chat turns made from the sources: for a function with a docstring, the
    user asks the docstring's first line and the assistant answers with the
    function's code (docs/TRAINING.md says why), one to three turns a
    conversation, rendered with the chat template's markers (docs/MODEL.md
    11.1, non-thinking mode).

Split: a document is held out when the SHA-256 of its name (the path
relative to the stdlib folder, "topic:NAME", "chat:PATH") starts with a byte
below HELD_OUT_BYTE (about 3 %); chat turns come only from training files.
The split depends on names only, so it is the same on any machine with the
same Python version; the log records the version and a hash of the corpus.
"""
import ast
import hashlib
import os
import random
import sysconfig
import textwrap

MAX_FILE = 400_000
HELD_OUT_BYTE = 8          # 8 / 256 = 3.1 % of the documents
CHAT_MIN, CHAT_MAX = 16, 160   # length of a usable docstring first line
CHAT_CODE_MAX = 1600           # longest function answered with


def stdlib_dir():
    return sysconfig.get_paths()["stdlib"]


def held_out(name):
    return hashlib.sha256(name.encode()).digest()[0] < HELD_OUT_BYTE


def source_files(root):
    """Relative paths of the stdlib's .py files, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.endswith("-packages") and d != "__pycache__")
        for f in filenames:
            if f.endswith(".py"):
                p = os.path.join(dirpath, f)
                if os.path.getsize(p) <= MAX_FILE:
                    out.append(os.path.relpath(p, root))
    return sorted(out)


def read_text(path):
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def topics(root):
    """(name, text) of pydoc_data/topics.py, read as data (not imported)."""
    text = read_text(os.path.join(root, "pydoc_data", "topics.py"))
    if text is None:
        return []
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            d = ast.literal_eval(node.value)
            return sorted((k, v) for k, v in d.items() if isinstance(v, str))
    return []


def qa_pairs(text):
    """(question, answer) from the functions of a module's source: the first
    docstring line and the function's dedented code (whole lines, from the
    def line, decorators left out, to the end of the body)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    lines = text.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc:
            continue
        first = doc.strip().split("\n")[0].strip()
        if not (CHAT_MIN <= len(first) <= CHAT_MAX):
            continue
        if node.end_lineno - node.lineno > 60:
            continue
        code = textwrap.dedent("".join(lines[node.lineno - 1:node.end_lineno])).rstrip() + "\n"
        if len(code) <= CHAT_CODE_MAX:
            out.append((first, code))
    return out


def build(seed, max_files=0):
    """{"train": [doc], "held_out": [doc], "info": {...}}; a doc is a str
    (plain text) or a list of ("text", str) / ("special", name) parts.
    max_files > 0 keeps every k-th source file, about max_files of them
    (the pipeline check's small corpus)."""
    root = stdlib_dir()
    train, held, pairs = [], [], []
    h = hashlib.sha256()
    n_files = 0
    files = source_files(root)
    if max_files and len(files) > max_files:
        files = files[::len(files) // max_files]
    for rel in files:
        text = read_text(os.path.join(root, rel))
        if not text or not text.strip():
            continue
        n_files += 1
        h.update(rel.encode() + b"\0" + text.encode() + b"\0")
        if held_out(rel):
            held.append(text)
        else:
            train.append(text)
            pairs += qa_pairs(text)
    for name, text in topics(root):
        (held if held_out("topic:" + name) else train).append(text)
    rng = random.Random(seed)
    rng.shuffle(pairs)
    chats = []
    i = 0
    while i < len(pairs):
        k = rng.randint(1, 3)
        parts = []
        for q, a in pairs[i:i + k]:
            parts += [("special", "user"), ("text", q), ("special", "assistant"), ("special", "think_end"),
                      ("text", a), ("special", "eos")]
        chats.append(parts)
        i += k
    info = {"stdlib": root, "files": n_files, "topics": len(topics(root)), "chat_turns": len(pairs),
            "sha256": h.hexdigest()}
    return {"train": train + chats, "held_out": held, "info": info}
