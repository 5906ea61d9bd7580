#!/usr/bin/env python3
"""Fails when a source file includes a layer above its own (docs/DEVELOPERS.md, "Layers").

Every file under src/ belongs to the layer of its directory; its quoted includes ("core/error.h")
must name its own layer or one that ALLOWED below lets it use. Unit tests (*_test.cpp beside the
code) are held to the same table with a few named additions (TEST_EXTRA: test oracles and model
makers; TEST_HARNESS: loading or making a whole model to run a layer on) and may include the light
helpers of tests/support/. Files under apps/, bench/, examples/, fuzz/ and tests/
sit on top and may include anything. ctest runs this (the test `layer_map`).

  tools/check_layers.py [ROOT]      prints each upward include and exits 1 if there is one
  tools/check_layers.py --self-test plants violations in a scratch tree and checks they are found
"""

import pathlib
import re
import sys

# Layer -> the layers it may include (besides itself). Kept transitive on purpose: a layer may use
# anything below it, and the list says which those are.
ALLOWED = {
    "core": [],
    "kernels/cpu": ["core"],
    "kernels/cuda": ["core"],
    "kernels": ["core", "kernels/cpu", "kernels/cuda"],
    "io": ["core"],
    "format": ["core", "io"],
    "tokenizer": ["core"],
    "model": ["core", "kernels/cpu", "kernels/cuda", "io", "format"],
    "experts": ["core", "kernels/cpu", "kernels/cuda", "io", "format", "model"],
    "convert": ["core", "kernels/cpu", "kernels/cuda", "io", "format", "model", "experts"],
    "runtime": ["core", "kernels/cpu", "kernels/cuda", "io", "format", "tokenizer", "model", "experts"],
    "server": ["core", "kernels/cpu", "kernels/cuda", "io", "format", "tokenizer", "model", "experts",
               "runtime"],
}
# Where a layer's unit tests may reach beyond its table (tests only, never the library):
# - the scalar reference ops of kernels/cpu are the oracle of format's and the CUDA kernels' tests;
# - runtime's and server's tests make their models with convert/ (synthetic containers, repacks);
# - convert's GGUF tests load the tokenizer it rebuilds from a GGUF's metadata.
TEST_EXTRA = {
    "format": ["kernels/cpu"],
    "convert": ["tokenizer"],
    "kernels/cuda": ["kernels/cpu"],
    "runtime": ["convert"],
    "server": ["convert"],
}
# Headers any test from model/ up may include to get a whole model to run its layer on: the loader
# (fixtures, containers) and the converters that make a container.
TEST_HARNESS = {"runtime/model_loader.h", "convert/synthetic.h", "convert/repack.h"}
HARNESS_FROM = "model"
# tests/support headers a unit test of any layer may include (they include only core/, the
# standard library and test libraries). The others need more (random_weights.h: the reference
# products, from kernels/cpu/; tiny_model.h: a synthetic container, from convert/; split_inputs.h: the DeltaNet row order, from model/; greedy_decode.h: a forward
# pass's prompt-then-greedy loop, from model/; sharded_checkpoint.h: a checkpoint written as shards,
# from format/; gguf_export.h: a loaded model written as GGUF, from convert/; reference_logits.h:
# a prompt's logits through the reference backend, from model/).
LIGHT_SUPPORT = {"support/test_paths.h", "support/test_util.h", "support/local_hub.h", "support/fake_machine.h"}
SUPPORT_NEEDS = {"support/random_weights.h": "kernels/cpu", "support/tiny_model.h": "convert", "support/split_inputs.h": "model", "support/greedy_decode.h": "model", "support/sharded_checkpoint.h": "format", "support/gguf_export.h": "convert", "support/reference_logits.h": "model"}

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.M)
SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")


def layer_of(path: str):
    """The layer a path under src/ (or an include naming one) belongs to, else None."""
    for name in sorted(ALLOWED, key=len, reverse=True):
        if path == name or path.startswith(name + "/"):
            return name
    return None


def check(root: pathlib.Path):
    problems = []
    src = root / "src"
    for f in sorted(src.rglob("*")):
        if f.suffix not in SOURCES or not f.is_file():
            continue
        rel = f.relative_to(src).as_posix()
        layer = layer_of(rel)
        if layer is None:
            problems.append(f"src/{rel}: not in any layer (add its directory to tools/check_layers.py)")
            continue
        is_test = f.stem.endswith("_test") or "/standalone/" in rel
        allowed = {layer, *ALLOWED[layer]}
        if is_test:
            allowed |= set(TEST_EXTRA.get(layer, []))
        harness = is_test and (layer == HARNESS_FROM or HARNESS_FROM in ALLOWED[layer])
        text = f.read_text(encoding="utf-8", errors="replace")
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            if inc.startswith("support/"):
                if not is_test:
                    problems.append(f"src/{rel}:{line}: includes the test helper {inc} outside a test")
                elif inc not in LIGHT_SUPPORT and not (harness and SUPPORT_NEEDS.get(inc) == "convert") \
                        and SUPPORT_NEEDS.get(inc, "tests") not in allowed:
                    problems.append(f"src/{rel}:{line}: a {layer} test includes {inc}, which needs "
                                    f"{SUPPORT_NEEDS.get(inc, 'the layers above')}")
                continue
            if harness and inc in TEST_HARNESS:
                continue
            target = layer_of(inc)
            if target is None:
                if (f.parent / inc).exists():  # a file beside it: the same layer
                    continue
                problems.append(f"src/{rel}:{line}: includes \"{inc}\", which is in no layer")
            elif target not in allowed:
                what = "test" if is_test else "file"
                problems.append(f"src/{rel}:{line}: a {layer} {what} includes {inc} ({target} is not below {layer})")
    return problems


def self_test():
    """The check must be able to fail: plant upward includes in a scratch tree and count them."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)

        def put(rel, text):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)

        put("src/core/ok.h", '#include "core/error.h"\n#include <vector>\n')
        put("src/model/ok.cpp", '#include "kernels/cpu/kernels.h"\n#include "format/qpack.h"\n')
        put("src/model/ok_test.cpp", '#include "runtime/model_loader.h"\n#include "support/test_util.h"\n')
        assert check(root) == [], check(root)
        put("src/core/bad.h", '#include "model/weights.h"\n')                 # library, upward
        put("src/kernels/cpu/bad_test.cpp", '  #  include "format/qpack.h"\n')  # test, upward
        put("src/runtime/bad.cpp", '#include "convert/repack.h"\n')          # a sibling, not below
        put("src/format/bad.cpp", '#include "support/test_util.h"\n')        # test helper in the library
        put("src/elsewhere/x.cpp", "")                                         # no layer
        found = check(root)
        want = ["src/core/bad.h:1", "src/elsewhere/x.cpp", "src/format/bad.cpp:1", "src/kernels/cpu/bad_test.cpp:1",
                "src/runtime/bad.cpp:1"]
        assert [p.split(":")[0] + (":" + p.split(":")[1] if p.split(":")[1].isdigit() else "") for p in found] == want, found
    print("check_layers self-test: planted violations found, clean tree passes")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) against the layer map (docs/DEVELOPERS.md, Layers)")
        return 1
    print("layer map: no upward includes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
