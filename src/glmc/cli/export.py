"""glmc export MODEL -o FILE.safetensors: a model folder's tensors as a plain state dict."""

from __future__ import annotations

import argparse

from glmc.cli.common import add_allow_pickle, add_json, add_out, emit_json
from glmc.cli.main import add_command
from glmc.errors import GlmcError


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "export",
        "Write a model folder's tensors as one plain safetensors state dict under a layout's "
        "names: torchvision (convnets: conv1, bn1, layer1.0.conv1, features.J, fc, ...; "
        "what `glmc import` reads, and a torchvision-style module loads) or canonical "
        "(glmc's own names).",
        "glmc export runs/merged -o merged_resnet20.safetensors --layout torchvision")
    p.add_argument("model", help="model folder (Hugging Face or glmc)")
    add_out(p, "output .safetensors file (replaced atomically)")
    p.add_argument("--layout", choices=("torchvision", "canonical"), default="torchvision",
                   help="the tensor names to write")
    add_json(p)
    add_allow_pickle(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from glmc.api import export_state_dict
    from glmc.io.folders import load_model
    from glmc.io.outputs import check_output

    if not args.out.endswith(".safetensors"):  # (before loading; the library checks it too)
        raise GlmcError(f"{args.out}: the state dict is written as safetensors (name it "
                        "*.safetensors)")
    check_output(args.out, force=args.force, inputs=(args.model,))
    m = load_model(args.model, allow_pickle=args.allow_pickle)
    report = export_state_dict(m, args.out, layout=args.layout, force=args.force)
    if args.json:
        emit_json(report)
    else:
        print(f"wrote {args.out}: {report['tensors']} tensors ({report['n_params']:,} "
              f"parameters) under {args.layout} names")
    return 0
