"""glmc import CHECKPOINT -o OUT: read a plain state dict file by tensor name into a model
folder every other command reads."""

from __future__ import annotations

import argparse

from glmc.cli.common import add_allow_pickle, add_json, add_out, emit_json
from glmc.cli.main import add_command
from glmc.cli.options import check_at_least
from glmc.families.options import train_option


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "import",
        "Read a plain PyTorch or safetensors state dict (not a model folder) by its tensor "
        "names: glmc's own, torchvision's ResNet and VGG names (conv1, bn1, layer1.0.conv1, "
        "downsample.0, fc; features.J, classifier) or an MLP's chain of linear layers. The "
        "architecture, width and norm follow from the tensors; write it as a model folder.",
        "glmc import resnet20_cifar.pt --image-size 32 --allow-pickle -o runs/resnet-a")
    p.add_argument("checkpoint", help="a .safetensors file, or a PyTorch checkpoint "
                   "(.pt/.pth/.bin, with --allow-pickle)")
    add_out(p, "output model folder (replaced atomically)")
    p.add_argument("--arch", default=None,
                   help="architecture (mlp, vgg11, vgg16, resnet20); default: from the names")
    p.add_argument("--norm", choices=train_option("norm").choices, default=None,
                   help="the norm layers; default: from the tensors (needed for a channel "
                   "LayerNorm, which stores no running statistics)")
    p.add_argument("--image-size", type=int, default=None,
                   help="input image side (needed for vgg and resnet20: their weights do not "
                   "fix it)")
    p.add_argument("--num-channels", type=int, default=None,
                   help="input image channels (an MLP: default 1; vgg and resnet20 read them "
                   "from the first conv)")
    add_json(p)
    add_allow_pickle(p, "read a PyTorch checkpoint")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from glmc.api import read_state_dict, save
    from glmc.io.outputs import check_output

    check_at_least(args, image_size=1, num_channels=1)
    check_output(args.out, force=args.force, inputs=(args.checkpoint,))
    model = read_state_dict(args.checkpoint, arch=args.arch, norm=args.norm,
                            image_size=args.image_size, num_channels=args.num_channels,
                            allow_pickle=args.allow_pickle)
    cfg = model.config
    report = {"command": "import", "checkpoint": args.checkpoint, "out": args.out,
              "family": model.family.name, "config": cfg.to_json(),
              "n_params": model.n_params()}
    report = save(model, args.out, force=args.force, report=report)
    if args.json:
        emit_json(report)
    else:
        print(f"read {args.checkpoint} ({cfg.source.get('layout', '?')} names) as "
              f"{cfg.describe()}, {model.n_params():,} parameters; wrote {args.out}")
    return 0
