#!/usr/bin/env python3
"""Build the training corpus of the small trained model from Debian packages.

Usage: tools/corpus/build_corpus.py --out DIR [--debs DIR] [--seed 1234]

Every text comes from a package of Debian 12's archive, fetched with `apt-get download` (nothing is
installed) and unpacked with `dpkg -x`:

  package            what                                    licence          used as
  bible-kjv-text     King James Bible (read with bible-kjv)  public domain    chapters; verse Q&A
  wordnet-base       WordNet 3.0 glosses and examples        WordNet licence  definition Q&A
  dict-gcide         GNU Collaborative International Dict.   GPL              definition Q&A
  dict-devil         Bierce, The Devil's Dictionary          public domain    definition Q&A
  dict-foldoc        Free On-line Dictionary of Computing    GPL              definition Q&A
  dict-jargon        The Jargon File 4.4.7                   public domain    entries
  fortunes           fortune-mod's (inoffensive) cookies     BSD-ish / PD     sayings
  python3.11-doc     the Python tutorial, HOWTOs, FAQ         PSF              prose
  gnu-standards      GNU coding standards, maintainers' info  GFDL             prose
  debian-reference-en  the Debian Reference                  GPL              prose

Plain documents teach English; the Q&A part is rendered as chat turns in the Qwen3 chat template
(exactly what `swiftlet chat` sends: "<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n"
with the empty thinking block the template puts before the last answer), so the trained model
answers in the chat format.

Text is NFC-normalised, control characters dropped, runs of spaces folded; documents are
de-duplicated by the hash of their normalised text; the documents are shuffled with a fixed seed
and split into train / validation / test (98 / 1 / 1 percent of the documents). Each split is
one UTF-8 file: the documents each followed by "<|endoftext|>", so tokenizing the file (special
tokens parsed) gives the token stream the model trains on. Sizes and SHA-256 hashes are printed
and written to DIR/manifest.json; the same packages and seed give the same files.
"""

import argparse
import gzip
import hashlib
import html.parser
import json
import os
import random
import re
import subprocess
import sys
import unicodedata
import zlib

EOT = "<|endoftext|>"
PACKAGES = ["bible-kjv", "bible-kjv-text", "wordnet-base", "dict-gcide", "dict-devil", "dict-foldoc",
            "dict-jargon", "fortunes", "python3.11-doc", "gnu-standards", "debian-reference-en"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ packages

def fetch(debs):
    os.makedirs(debs, exist_ok=True)
    have = {f.split("_")[0] for f in os.listdir(debs) if f.endswith(".deb")}
    missing = [p for p in PACKAGES if p not in have]
    if missing:
        subprocess.run(["apt-get", "download", *missing], cwd=debs, check=True,
                       stdout=subprocess.DEVNULL)
    roots = {}
    for f in sorted(os.listdir(debs)):
        if not f.endswith(".deb"):
            continue
        name = f.split("_")[0]
        root = os.path.join(debs, "x", name)
        if not os.path.isdir(root):
            os.makedirs(root)
            subprocess.run(["dpkg", "-x", f, root], cwd=debs, check=True)
        roots[name] = (root, f)
    return roots


# ------------------------------------------------------------------ normalisation

_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_SPACES = re.compile(r"[ \t\u00a0]+")


def norm(text):
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CTRL.sub("", text)
    lines = [_SPACES.sub(" ", ln).strip() for ln in text.split("\n")]
    out, blank = [], 0
    for ln in lines:
        if not ln:
            blank += 1
            continue
        if out and blank:
            out.append("")
        out.append(ln)
        blank = 0
    return "\n".join(out).replace(EOT, "")


def one_line(text):
    return _SPACES.sub(" ", norm(text).replace("\n", " ")).strip()


def chat(turns):
    """Render [(question, answer), ...] as the Qwen3 template renders the conversation: earlier
    answers plain, the last one after an empty thinking block."""
    out = []
    for i, (q, a) in enumerate(turns):
        out.append("<|im_start|>user\n" + q + "<|im_end|>\n")
        think = "<think>\n\n</think>\n\n" if i == len(turns) - 1 else ""
        out.append("<|im_start|>assistant\n" + think + a + "<|im_end|>\n")
    return "".join(out)


# ------------------------------------------------------------------ sources

def bible(roots):
    exe = os.path.join(roots["bible-kjv"][0], "usr/bin/bible")
    data = os.path.join(roots["bible-kjv-text"][0], "usr/lib")
    out = subprocess.run([exe, "-p", data, "gen1:1-rev22:21"], check=True, capture_output=True,
                         text=True).stdout
    chapters, verses = [], []
    title, cur = None, []
    for raw in out.split("\n"):
        m = re.match(r"^(\S.*\S) (\d+)$", raw)
        if m and not raw.startswith(" "):
            if title and cur:
                chapters.append((title, cur))
            title, cur = raw.strip(), []
            continue
        m = re.match(r"^\s+(\d+) (.*)$", raw)
        if m:
            cur.append([int(m.group(1)), m.group(2)])
        elif raw.strip() and cur:
            cur[-1][1] += " " + raw.strip()
    if title and cur:
        chapters.append((title, cur))
    docs = []
    for title, vs in chapters:
        docs.append(norm(title + "\n\n" + " ".join(v for _, v in vs)))
        for n, v in vs:
            verses.append((f"{title}:{n}", one_line(v)))
    return docs, verses


def wordnet(roots):
    base = os.path.join(roots["wordnet-base"][0], "usr/share/wordnet")
    pos_name = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}
    entries = []
    for f in ["data.noun", "data.verb", "data.adj", "data.adv"]:
        with open(os.path.join(base, f), encoding="latin-1") as fh:
            for line in fh:
                if line.startswith("  "):
                    continue
                head, _, gloss = line.partition(" | ")
                parts = head.split()
                ss_type, w_cnt = parts[2], int(parts[3], 16)
                words = [parts[4 + 2 * i].replace("_", " ") for i in range(w_cnt)]
                words = [re.sub(r"\([a-z]+\)$", "", w) for w in words]
                gloss = gloss.strip()
                examples = re.findall(r'"([^"]+)"', gloss)
                definition = re.sub(r';?\s*"[^"]*"', "", gloss).strip(" ;")
                if not definition:
                    continue
                entries.append((words, pos_name[ss_type], definition, examples))
    return entries


def dictd(root, name):
    base = os.path.join(root, "usr/share/dictd")
    with open(os.path.join(base, name + ".dict.dz"), "rb") as fh:
        data = zlib.decompress(fh.read(), 16 + zlib.MAX_WBITS)
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def num(s):
        v = 0
        for c in s:
            v = v * 64 + b64.index(c)
        return v

    seen, out = set(), []
    with open(os.path.join(base, name + ".index"), encoding="utf-8", errors="replace") as fh:
        for line in fh:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3 or parts[0].startswith("00-database"):
                continue
            off, size = num(parts[1]), num(parts[2])
            if (off, size) in seen:
                continue
            seen.add((off, size))
            out.append((parts[0], data[off:off + size].decode("utf-8", errors="replace")))
    return out


_GCIDE_POS = {"n.": "noun", "v. t.": "verb", "v. i.": "verb", "a.": "adjective", "adv.": "adverb",
              "n": "noun", "v": "verb", "adj": "adjective", "adv": "adverb"}


def gcide(roots):
    out = []
    for word, body in dictd(roots["dict-gcide"][0], "gcide"):
        m = re.match(r"^(.*?)\\([^\\]*)\\,?\s*(.*)", body, re.S)
        if not m:
            continue
        rest = m.group(3)
        pos = None
        for k in sorted(_GCIDE_POS, key=len, reverse=True):
            if rest.startswith(k):
                pos = _GCIDE_POS[k]
                rest = rest[len(k):]
                break
        if not pos:
            continue
        rest = re.sub(r"\[[^\]]*\]", "", rest)          # etymology, sources
        rest = re.sub(r"--[A-Z][\w.]*( [A-Z][\w.]*)*\.?", "", rest)  # citations
        rest = rest.replace("{", "").replace("}", "")
        senses = re.split(r"\n\s*\d+\.\s", "\n" + rest)
        sense = next((s for s in senses if len(one_line(s)) > 12), None)
        if not sense:
            continue
        sense = one_line(re.sub(r"\([A-Z][a-z]+\.\)", "", sense))
        sense = re.split(r"(?<=[.;])\s+(?:See|Syn\.|Note:)", sense)[0].strip()
        if "?" in sense or len(sense) < 12 or len(sense) > 400 or not re.match(r"^[A-Za-z(]", sense):
            continue
        w = one_line(m.group(1)).rstrip(",")
        if not re.match(r"^[A-Za-z][A-Za-z' -]*$", w):
            continue
        out.append((w, pos, sense))
    return out


def devil(roots):
    out = []
    for word, body in dictd(roots["dict-devil"][0], "devil"):
        m = re.match(r"^([A-Z][A-Z' -]+),\s*([a-z. ]+?)\s\s+(.*)$", body, re.S)
        if not m:
            continue
        text = norm(m.group(3).replace("{", "").replace("}", ""))
        paras = text.split("\n\n")
        out.append((m.group(1).title(), one_line(paras[0])))
    return out


def foldoc(roots):
    out = []
    for word, body in dictd(roots["dict-foldoc"][0], "foldoc"):
        text = norm(body)
        paras = [p for p in text.split("\n\n")[1:] if p.strip()]
        if not paras:
            continue
        first = one_line(re.sub(r"\{([^}]*)\}", r"\1", re.sub(r"<[^>]*>", "", paras[0])))
        first = re.sub(r"\(\d{4}-\d{2}-\d{2}\)$", "", first).strip()
        if 30 <= len(first) <= 600 and re.match(r"^[A-Za-z(\"]", first):
            out.append((one_line(word), first))
    return out


def jargon(roots):
    docs = []
    for word, body in dictd(roots["dict-jargon"][0], "jargon"):
        text = norm(re.sub(r"\{([^}]*)\}", r"\1", body))
        if len(text) > 120:
            docs.append(text)
    return docs


def fortunes(roots):
    base = os.path.join(roots["fortunes"][0], "usr/share/games/fortunes")
    docs = []
    for f in sorted(os.listdir(base)):
        p = os.path.join(base, f)
        if f.endswith(".dat") or f.endswith(".u8") or os.path.islink(p) or f in ("ascii-art",):
            continue
        with open(p, encoding="utf-8", errors="replace") as fh:
            for item in fh.read().split("\n%\n"):
                t = norm(item)
                if 20 <= len(t) <= 1200:
                    docs.append(t)
    return docs


def rst_text(src):
    text = re.sub(r":[a-z:]+:`~?!?([^`<]*?)(?:\s*<[^>]*>)?`", r"\1", src)
    text = re.sub(r"``([^`]*)``", r"\1", text)
    text = re.sub(r"`([^`<]*?)(?:\s*<[^>]*>)?`_*", r"\1", text)
    out, skip = [], False
    for ln in text.split("\n"):
        if re.match(r"^\s*\.\. ", ln) or ln.rstrip().endswith("::"):
            skip = ln.rstrip().endswith("::") or ln.strip().startswith(".. code")
            if ln.rstrip().endswith("::") and not ln.strip().startswith(".."):
                out.append(ln.rstrip()[:-1])
            continue
        if skip:
            if ln.strip() == "" or ln.startswith((" ", "\t")):
                continue
            skip = False
        if ln.startswith(">>>") or ln.startswith("..."):
            continue
        if re.match(r"^[=\-~^*#+\"']{3,}\s*$", ln):
            continue
        out.append(ln)
    return norm("\n".join(out))


def python_docs(roots):
    base = os.path.join(roots["python3.11-doc"][0], "usr/share/doc/python3.11/html/_sources")
    docs = []
    for sub in ["tutorial", "howto", "faq", "glossary.rst.txt"]:
        p = os.path.join(base, sub)
        files = [p] if os.path.isfile(p) else [os.path.join(p, f) for f in sorted(os.listdir(p))]
        for f in files:
            if not f.endswith(".rst.txt"):
                continue
            with open(f, encoding="utf-8") as fh:
                text = rst_text(fh.read())
            docs.extend(split_long(text))
    return docs


def html_text(src):
    hp = html.parser

    class P(hp.HTMLParser):
        def __init__(self):
            super().__init__()
            self.out, self.skip = [], 0

        def handle_starttag(self, tag, attrs):
            if tag in ("pre", "script", "style", "table"):
                self.skip += 1
            if tag in ("p", "div", "h1", "h2", "h3", "h4", "li", "br", "dt", "dd"):
                self.out.append("\n\n")

        def handle_endtag(self, tag):
            if tag in ("pre", "script", "style", "table") and self.skip:
                self.skip -= 1

        def handle_data(self, data):
            if not self.skip:
                self.out.append(data.replace("\n", " "))

    p = P()
    p.feed(src)
    return norm("".join(p.out))


def prose_docs(roots):
    docs = []
    gs = os.path.join(roots["gnu-standards"][0], "usr/share/doc/gnu-standards")
    for f in ["standards.text.gz", "maintain.text.gz"]:
        with gzip.open(os.path.join(gs, f), "rt", encoding="utf-8", errors="replace") as fh:
            docs.extend(split_long(norm(fh.read())))
    dr = os.path.join(roots["debian-reference-en"][0], "usr/share/debian-reference")
    for f in sorted(os.listdir(dr)):
        if f.endswith(".en.html"):
            with open(os.path.join(dr, f), encoding="utf-8") as fh:
                docs.extend(split_long(html_text(fh.read())))
    return docs


def split_long(text, limit=6000):
    """Split a long text at paragraph boundaries into documents of about `limit` characters."""
    out, cur = [], []
    n = 0
    for para in text.split("\n\n"):
        if n + len(para) > limit and cur:
            out.append("\n\n".join(cur))
            cur, n = [], 0
        cur.append(para)
        n += len(para) + 2
    if cur:
        out.append("\n\n".join(cur))
    return [d for d in out if len(d) > 200]


# ------------------------------------------------------------------ Q&A

def article(word):
    return "an" if word[:1].lower() in "aeiou" else "a"


def qa_definitions(rng, wn, gc, dv, fd):
    """Definition questions and answers, with varied phrasings."""
    pairs = []
    for words, pos, definition, examples in wn:
        w = words[0]
        d = definition[0].upper() + definition[1:]
        if pos == "noun":
            q = rng.choice([f"What is {article(w)} {w}?", f"What does the word \"{w}\" mean?",
                            f"Define {w}.", f"What is meant by \"{w}\"?", f"Explain the word {w}."])
        else:
            q = rng.choice([f"What does \"{w}\" mean?", f"What does the {pos} \"{w}\" mean?",
                            f"Define the word {w}.", f"What is the meaning of \"{w}\"?"])
        a = f"\"{w}\" is {article(pos)} {pos}: {definition}."
        if rng.random() < 0.5:
            a = f"{d}."
        if examples:
            a += f" For example: \"{examples[0]}\"."
        if len(words) > 1 and rng.random() < 0.5:
            a += " It is also called " + ", ".join(f"\"{x}\"" for x in words[1:4]) + "."
        pairs.append((q, a))
    for w, pos, sense in gc:
        q = rng.choice([f"What does \"{w}\" mean?", f"Define {w.lower()}.",
                        f"What is the meaning of the {pos} \"{w.lower()}\"?"])
        pairs.append((q, f"{w} ({pos}): {sense}"))
    for w, d in dv:
        q = rng.choice([f"What is {w.lower()}, according to the Devil's Dictionary?",
                        f"How does Ambrose Bierce define \"{w.lower()}\"?"])
        pairs.append((q, d))
    for w, d in fd:
        q = rng.choice([f"What is {w} in computing?", f"What does {w} mean?", f"Explain {w}."])
        pairs.append((q, d))
    return pairs


def qa_bible(rng, verses, n):
    pairs = []
    for ref, text in rng.sample(verses, min(n, len(verses))):
        q = rng.choice([f"What does {ref} say?", f"Quote {ref}.", f"Recite {ref} from the King James Bible."])
        pairs.append((q, f"{ref}: {text}"))
    return pairs


def conversations(rng, pairs, max_turns=3):
    rng.shuffle(pairs)
    docs, i = [], 0
    while i < len(pairs):
        k = rng.choice([1, 1, 2, 3][:max_turns + 1])
        docs.append(chat(pairs[i:i + k]))
        i += k
    return docs


# ------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--debs", default="/tmp/swiftlet-corpus-debs")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--gcide-max", type=int, default=60000)
    ap.add_argument("--bible-qa", type=int, default=12000)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    roots = fetch(args.debs)
    sources = {}
    kjv, verses = bible(roots)
    sources["bible-kjv-text (chapters)"] = kjv
    wn = wordnet(roots)
    gc = gcide(roots)
    gc = rng.sample(gc, min(args.gcide_max, len(gc)))
    dv = devil(roots)
    fd = foldoc(roots)
    sources["jargon"] = jargon(roots)
    sources["fortunes"] = fortunes(roots)
    sources["python3.11-doc"] = python_docs(roots)
    sources["gnu-standards + debian-reference"] = prose_docs(roots)
    defs = qa_definitions(rng, wn, gc, dv, fd)
    sources["chat: definitions (wordnet, gcide, devil, foldoc)"] = conversations(rng, defs)
    sources["chat: bible verses"] = conversations(rng, qa_bible(rng, verses, args.bible_qa))

    docs, seen, stats = [], set(), {}
    for name, items in sources.items():
        kept = 0
        chars = 0
        for d in items:
            d = d.strip("\n") if not d.startswith("<|im_start|>") else d
            h = hashlib.sha256(d.encode()).digest()
            if not d or h in seen:
                continue
            seen.add(h)
            docs.append(d)
            kept += 1
            chars += len(d.encode())
        stats[name] = {"documents": kept, "bytes": chars, "dropped_duplicates": len(items) - kept}
        log(f"{name:52s} {kept:8d} docs {chars / 1e6:8.2f} MB ({len(items) - kept} duplicates)")

    rng.shuffle(docs)
    n = len(docs)
    n_test = n_val = max(1, n // 100)
    splits = {"test": docs[:n_test], "val": docs[n_test:n_test + n_val], "train": docs[n_test + n_val:]}
    os.makedirs(args.out, exist_ok=True)
    manifest = {"seed": args.seed, "sources": stats, "packages": {}, "splits": {}}
    for name, (root, deb) in sorted(roots.items()):
        with open(os.path.join(args.debs, deb), "rb") as fh:
            manifest["packages"][name] = {"deb": deb, "sha256": hashlib.sha256(fh.read()).hexdigest()}
    for name, items in splits.items():
        data = "".join(d + EOT for d in items).encode()
        path = os.path.join(args.out, name + ".txt")
        with open(path, "wb") as fh:
            fh.write(data)
        sha = hashlib.sha256(data).hexdigest()
        manifest["splits"][name] = {"documents": len(items), "bytes": len(data), "sha256": sha}
        print(f"{name:5s} {len(items):8d} documents {len(data):12d} bytes sha256 {sha}")
    with open(os.path.join(args.out, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1)


if __name__ == "__main__":
    main()
