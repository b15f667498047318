"""glmc train --arch ARCH --data D --seed S -o OUT: train a small model from scratch."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

from glmc.cli.common import add_json, add_out, emit_json
from glmc.cli.main import add_command
from glmc.data.catalog import DATASETS, PATH_HELP
from glmc.families import ARCHS as DECLARED
from glmc.families.options import TRAIN_OPTIONS
from glmc.training.options import ARCHS, TrainConfig, check_train_output

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "train",
        "Train a model from scratch with AdamW and a warm-up + cosine schedule: a "
        "transformer (--arch below), written as a Hugging Face folder with its tokenizer, or "
        "one of Git Re-Basin's convnets, written as a glmc folder; with a training log "
        "(glmc_train.json). Each family's options are listed under its own heading. "
        "Checkpoints go to .OUT.ckpt beside OUT until the run completes.",
        "glmc train --arch gpt2 --data shakespeare --seed 1 -o runs/gpt-a --n-layer 2 "
        "--n-embd 64 --steps 500",
    )
    d = _DEFAULTS
    p.add_argument("--arch", choices=ARCHS, required=True,
                   help="; ".join(f"{a}: {DECLARED.info(a, 'help')}" for a in ARCHS))
    p.add_argument("--data", required=True, metavar="D",
                   help=f"dataset name ({', '.join(DATASETS)}) or a path: {PATH_HELP}")
    p.add_argument("--seed", type=int, default=d["seed"],
                   help="seed of initialisation, batch order and dropout")
    p.add_argument("--data-seed", type=int, default=d["data_seed"],
                   help="seed of the train/val/test split of image data; keep it fixed across "
                   "models you will compare")
    add_out(p, "output model folder")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT's checkpoint (the options must match the run's); "
                   "while a checkpoint exists, a run without --resume needs --force, which "
                   "discards it")

    g = p.add_argument_group("data and model")
    g.add_argument("--context", type=int, default=d["context"],
                   help="text models' window length (their n_positions)")
    g.add_argument("--tokenizer", choices=("char", "gpt2"), default=d["tokenizer"],
                   help="text tokenizer (char: the data's sorted characters)")
    g.add_argument("--dropout", type=float, default=d["dropout"], help="every dropout rate")
    add_family_options(p)

    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=int, default=d["steps"], help="optimiser steps")
    g.add_argument("--batch-size", type=int, default=d["batch_size"],
                   help="windows (text) or images per step")
    g.add_argument("--lr", type=float, default=d["lr"], help="AdamW peak learning rate")
    g.add_argument("--weight-decay", type=float, default=d["weight_decay"],
                   help="AdamW weight decay (matrices and embeddings only)")
    g.add_argument("--warmup", type=int, default=d["warmup"],
                   help="linear warm-up steps before the cosine decay; unset: 5%% of steps")
    g.add_argument("--grad-clip", type=float, default=d["grad_clip"],
                   help="maximum gradient norm (0: no clipping)")

    g = p.add_argument_group("evaluation and checkpoints")
    g.add_argument("--eval-every", type=int, default=d["eval_every"],
                   help="validate every N steps and at the end (0: only at the end)")
    g.add_argument("--eval-batches", type=int, default=d["eval_batches"],
                   help="validation batches per validation (fixed order)")
    g.add_argument("--log-every", type=int, default=d["log_every"],
                   help="record the mean training loss every N steps")
    g.add_argument("--checkpoint-every", type=int, default=d["checkpoint_every"],
                   help="write a resumable checkpoint every N steps (0: never)")

    g = p.add_argument_group("runtime")
    g.add_argument("--threads", type=int, default=None,
                   help="torch threads; unset: os.cpu_count() (on a busy machine fewer is faster)")
    g.add_argument("--device", default=d["device"],
                   help="cpu or cuda (bit-identical resumption is promised on CPU)")
    add_json(p)
    p.add_argument("--stop-after", type=int, default=None, help=argparse.SUPPRESS)  # tests
    p.set_defaults(func=run, check=check)


def add_family_options(p: argparse.ArgumentParser) -> None:
    """One group per family, of the training options it declares (glmc.families.options)."""
    for family in TRAIN_OPTIONS.values():
        archs = [a for a in ARCHS if DECLARED.info(a, "family") == family.family]
        g = p.add_argument_group(f"{family.family} options ({', '.join(archs)})")
        for o in family.options:
            g.add_argument(o.flag, *o.aliases, type=o.type, default=o.default, dest=o.name,
                           choices=o.choices, help=o.help)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig named by the parsed options (another family's options, which every
    run's command line takes, are not the run's)."""
    names = TrainConfig.option_names()
    return TrainConfig(**{k: v for k, v in vars(args).items() if k in names})


def resume_command(argv: list[str]) -> str:
    """The command that resumes a run started with ``argv``: the same options plus --resume
    (and without the test hook --stop-after), shell-quoted."""
    words, skip = [], False
    for word in argv:
        if skip or word == "--stop-after" or word.startswith("--stop-after="):
            skip = word == "--stop-after"
            continue
        words.append(word)
    return shlex.join(["glmc", *words, *(["--resume"] if "--resume" not in words else [])])


def check(args: argparse.Namespace) -> None:
    """The checks that need no torch, before it loads: the options, and OUT (unless resuming,
    which may find the finished run there)."""
    cfg = config_from_args(args)
    cfg.validate()
    if not args.resume:
        check_train_output(Path(args.out).expanduser().absolute(), cfg, args.force)


def run(args: argparse.Namespace) -> int:
    from glmc.training.loop import TrainingStopped, train

    cfg = config_from_args(args)
    try:
        record = train(cfg, args.out, resume=args.resume, progress=not args.json,
                       stop_after=args.stop_after, force=args.force)
    except TrainingStopped as stop:
        how = "" if stop.checkpoint is None else \
            f"; resume with: {resume_command(getattr(args, 'argv', sys.argv[1:]))}"
        print(f"glmc train: {stop}{how}", file=sys.stderr)
        return 130
    if args.json:
        emit_json(record)
        return 0
    log = record["log"]
    val, test = log["val"][-1] if log["val"] else None, log["test"]
    val_text = f"val loss {val['loss']:.4f}, " if val else ""
    print(f"wrote {args.out}: {cfg.arch}, "
          f"{record['model']['n_params']:,} parameters, {log['steps']} steps in "
          f"{log['wall_time_s']:.1f} s; {val_text}test loss {test['loss']:.4f}, "
          f"test accuracy {test['accuracy']:.4f}")
    return 0
