"""glmc align A B -o OUT: B aligned to A (same function as B), its transform and a report."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from glmc.cli.common import (
    add_allow_pickle,
    add_json,
    add_out,
    emit_json,
    print_notes,
    print_warnings,
)
from glmc.cli.main import add_command
from glmc.cli.options import (
    STOPS,
    add_alignment_options,
    add_device,
    add_learned_options,
    add_tokenizer,
    alignment_options,
    check_at_least,
    check_device,
    learned_options,
)
from glmc.errors import GlmcError
from glmc.methods import aligning_methods

if TYPE_CHECKING:  # (torch and the library load when a command runs: --help stays fast)
    import torch

    from glmc.api import Alignment
    from glmc.io.folders import LoadedModel


def check_pair_options(args: argparse.Namespace) -> None:
    """The checks of align and merge that need no torch, before it loads: the option values;
    OUT, which must be neither input, and free (or --force), writable and with room for B's
    size; and the memory the pair needs (estimated from the safetensors headers: both in
    float32 plus the working set, a merge holding one model more), which must be available
    (``MemAvailable``)."""
    from glmc.io.outputs import (
        KEPT_MATCHING_COPIES,
        MATCHING_COPIES,
        check_output,
        check_pair_memory,
        model_bytes,
        stored_params,
    )

    check_at_least(args, iters=1)
    learned_options(args, args.out)
    check_output(args.out, model_bytes(stored_params(args.b)), force=args.force,
                 inputs=(args.a, args.b))
    merging = getattr(args, "alpha", None) is not None  # (glmc merge: the merged model too)
    copies = (KEPT_MATCHING_COPIES + 1 if merging
              else MATCHING_COPIES if may_hand_over(args) else KEPT_MATCHING_COPIES)
    ranks = spread_ranks(args, merging)
    half = not merging and holds_half(args)
    stream = {"auto": None, "always": True}.get(getattr(args, "stream", "never"), False)
    if stream and not (half and not ranks):
        raise GlmcError("--stream always: A is streamed only for weight matching without "
                        "--data (heads inner), in one process")
    args.streamed = check_pair_memory(  # (A streamed: a bfloat16 pair, in one process)
        args.a, args.b, extra_copies=copies, what=f"{args.a} and {args.b}", half=half,
        stream=stream if half and not ranks else False, **ranks)


def spread_ranks(args: argparse.Namespace, merging: bool) -> dict:
    """Under torchrun, where align's ranks each read a share of the pair: this machine's
    processes and all of them, for the memory estimate
    (:func:`glmc.io.outputs.pair_memory`); else nothing."""
    import os

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or merging or not may_hand_over(args):
        return {}
    return {"ranks": (int(os.environ.get("LOCAL_WORLD_SIZE", "1")), world)}


def load_pair(args: argparse.Namespace, keep_stock: bool = False, shares: bool = False,
              half: bool = False, stream: bool = False) -> tuple[LoadedModel, LoadedModel]:
    """Both input folders (see :func:`check_pair_options` for the checks before), checked to
    share their inputs, outputs and tokenizer.

    A's stock weights are dropped unless ``keep_stock`` (B's are kept). ``shares``: under
    torchrun, each rank reads only the tensors its share of the weight matching touches
    (:func:`glmc.matching.spread.load_pair`; for align's handed-over pair). ``half``: the
    canonical tensors of a bfloat16 pair kept in bfloat16 (``load_model``'s ``half``: see
    :func:`holds_half`); ``stream``: A streamed from its files with it, never held
    (``load_model``'s ``stream``: see :func:`check_pair_options`)."""
    from glmc.api import shared_tokenizer
    from glmc.distributed import spread
    from glmc.io.folders import load_model
    from glmc.verify import same_interface

    if shares and spread():
        from glmc.matching.spread import load_pair as load_shares
        from glmc.methods import AlignOptions

        opts = AlignOptions(residual=args.residual, heads=args.heads).weight_matching()
        a, b = load_shares(args.a, args.b, opts, allow_pickle=args.allow_pickle, half=half)
    else:
        a = load_model(args.a, allow_pickle=args.allow_pickle, half=half, stream=stream)
        if not keep_stock:
            a.stock_state = None  # (A is needed in canonical form only)
        release_memory()
        b = load_model(args.b, allow_pickle=args.allow_pickle, half=half)
    release_memory()
    same_interface(a.canonical.config, b.canonical.config, f"{args.a} vs {args.b}")
    shared_tokenizer(a.canonical, b.canonical, f"{args.a} vs {args.b}")
    return a, b


def release_memory() -> None:
    """Free what reference cycles still hold (objects of other libraries') and hand the
    heap's free memory back to the system (glibc's ``malloc_trim``, where there is one),
    between the phases of a command on large models: the next phase's peak does not then
    sit on the last one's leftovers."""
    import gc

    from glmc.matching.workspace import release_freed

    gc.collect()
    release_freed()


@contextmanager
def alignment_progress(args: argparse.Namespace, many: bool = False) -> Iterator[dict]:
    """Progress bars of weight and learned matching on stderr (none under --json, off a
    terminal, or on a rank other than the first): the callbacks AlignOptions takes.
    ``many``: N models, whose weight matchings show no bar (only the refinement's)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from glmc.cli.common import console
    from glmc.distributed import is_main

    # (off a terminal a transient bar shows nothing, and leaves a blank line on stderr)
    quiet = getattr(args, "json", False) or not is_main() or not console.is_terminal
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=quiet) as bar:
        wm = bar.add_task("weight matching", total=args.iters, visible=not many)
        lm = bar.add_task("learned matching", total=args.steps, visible=False)
        state = {"barrier": "?"}

        def progress(it: int, obj: float) -> None:
            bar.update(wm, completed=it, description=f"weight matching: distance {obj:.5f}")

        def learned_progress(step: int, loss: float, barrier: float | None) -> None:
            if barrier is not None:
                state["barrier"] = f"{barrier:.4f}"
            bar.update(lm, completed=step, visible=True,
                       description=f"learned matching: loss {loss:.4f}, "
                       f"{'barrier estimate' if many else 'midpoint barrier'} "
                       f"{state['barrier']}")

        yield {"progress": progress, "learned_progress": learned_progress}


def run_alignment(args: argparse.Namespace, a: LoadedModel, b: LoadedModel,
                  method: str, hand_over: bool = False) -> Alignment:
    """B aligned to A by ``method`` with the command's options, showing progress
    (``hand_over``: see :func:`hands_over`)."""
    from glmc.api import align

    # (A streamed: the residual cache in files beside OUT, as little held as can be)
    spill = str(Path(args.out).resolve().parent) if getattr(args, "streamed", False) else None
    with alignment_progress(args) as callbacks:
        options = alignment_options(args, getattr(a.canonical.config, "vocab_size", None),
                                    hand_over=hand_over, device=args.device, spill=spill,
                                    **callbacks)
        return align(a, b, method=method, options=options)


def may_hand_over(args: argparse.Namespace) -> bool:
    """Whether the method and heads mode let align hand the pair over (:func:`hands_over`;
    torch-free: the memory check before loading asks)."""
    from glmc.methods import get_method

    return args.align in aligning_methods() and not get_method(args.align).data \
        and args.heads == "inner"


def hands_over(args: argparse.Namespace) -> bool:
    """Whether align hands the pair over to weight matching (``AlignOptions.hand_over``),
    which frees the models' tensors as it goes (the same transform, bit for bit; a bfloat16
    pair matched in bfloat16, :mod:`glmc.matching.held`); B aligned is then made from B's
    folder read again, part by part as it is written
    (:class:`glmc.io.moved.Moved`). So for the weight methods on heads as they are (under
    torchrun too, where each rank has read its share of the pair only: see
    :func:`load_pair`)."""
    return may_hand_over(args)


def holds_half(args: argparse.Namespace) -> bool:
    """Whether align loads a bfloat16 pair in bfloat16 (``load_model``'s ``half``; torch-free:
    the memory check asks): handed over (:func:`hands_over`), without data, so that weight
    matching alone reads the models, in bfloat16 as it would hold them anyway
    (:mod:`glmc.matching.held`; with data, activation matching's start reads them as
    models first)."""
    return hands_over(args) and getattr(args, "data", None) is None


def drop_checkpoint(args: argparse.Namespace) -> None:
    """A finished learned-matching run's checkpoint is no longer needed."""
    Path(learned_options(args, args.out).checkpoint).unlink(missing_ok=True)


def reference_logits(path: str, allow_pickle: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and the logits of the model in folder ``path`` on them (its folder's class,
    float64, one block at a time read from its files), for the certificate: computed before
    the pair is loaded, so that the float64 blocks are not held beside both models."""
    from glmc.io.folders import canonical_of, open_model
    from glmc.verify import folder_logits, random_inputs

    m = open_model(path, allow_pickle=allow_pickle)
    x = random_inputs(canonical_of(m, only=()).config)  # (the canonical config: no tensor read)
    return x, folder_logits(m)(x)


def summary(args: argparse.Namespace, al: Alignment) -> list[str]:
    """What the alignment did, in a line or two."""
    m = al.match
    kept = (f", kept iteration {m.chosen} (the lowest validation loss)"
            if m and m.chosen is not None else "")
    lines = [f"aligned {args.b} to {args.a}: {len(m.trace)} iterations, distance (relative) "
             f"{m.to_json()['init_relative']:.4f} -> {m.relative:.4f}{kept}" if m else
             f"aligned {args.b} to {args.a}"]
    if al.learned:
        lr = al.learned
        lines.append(f"learned matching: {lr.steps} steps ({STOPS[lr.stop_reason]}), best "
                     f"midpoint barrier estimate {lr.best_val - lr.baseline_val:.4f} (step "
                     f"{lr.best_step})")
    return lines


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "align",
        "Align model B to model A modulo weight symmetries (data-free weight matching) and "
        "write B aligned (the same function as B) with the transform and a report.",
        "glmc align runs/gpt-a runs/gpt-b -o runs/b-aligned --residual orthogonal")
    p.add_argument("a", help="reference model folder (Hugging Face or glmc)")
    p.add_argument("b", help="model folder to align to A")
    add_out(p, "output folder (written atomically)")
    p.add_argument("--align", metavar="METHOD", choices=aligning_methods(), default="weight",
                   help="weight: weight matching (data-free; with --data its residual map "
                   "starts from activation matching's); activation: units, heads and the "
                   "residual map from the correlations of the two models' activations on "
                   "--data (Git Re-Basin's post-activation variant; activation-prepost: glmc's "
                   "own, before and after the nonlinearity); learned: weight matching, then "
                   "learned matching on --data; weight-perm, activation-perm, learned-perm: "
                   "the same with permutations only (the names merge and barrier take)")
    p.add_argument("--data", help="training data for activation or learned matching, and weight "
                   "matching's start (name or path)")
    add_tokenizer(p)
    p.add_argument("--no-stock", action="store_true",
                   help="always write a glmc folder, even when the stock class could hold it")
    add_alignment_options(p)
    p.add_argument("--stream", choices=("auto", "always", "never"), default="auto",
                   help="a bfloat16 pair matched without --data: read A's tensors from its "
                   "files as each step needs them, holding none, and keep weight matching's "
                   "residual cache in files beside OUT (B alone in memory; slower). auto: "
                   "only where the pair held would not fit in the memory available")
    add_device(p)
    add_learned_options(p)
    add_json(p)
    add_allow_pickle(p)
    p.set_defaults(func=run, check=check_pair_options)


def run(args: argparse.Namespace) -> int:
    from glmc.distributed import process_group

    with process_group():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import torch

    from glmc.api import save_certified
    from glmc.distributed import is_main
    from glmc.io.folders import folder_stamp, phase
    from glmc.io.moved import Moved

    t0 = time.perf_counter()
    check_device(args)
    phases: dict = {}  # (seconds and peak memory of each phase, in the report)
    hand_over = hands_over(args)
    stamp = folder_stamp(args.b) if hand_over else ()
    clock = t0
    if is_main():  # (B's weights read from its files one block at a time, in float64)
        reference = reference_logits(args.b, args.allow_pickle)
        clock = phase(phases, "reference", clock)
    a, b = load_pair(args, shares=hand_over, half=holds_half(args),
                     stream=getattr(args, "streamed", False))
    clock = phase(phases, "load", clock)
    b.stock_state = None  # (only B's canonical form is matched, on every rank)
    release_memory()
    al = run_alignment(args, a, b, args.align, hand_over=hand_over)
    if not is_main():
        return 0
    report = al.report() | {"a": str(args.a), "b": str(args.b)}
    lines, transform = summary(args, al), al.transform
    # (handed over, the models are empty: B aligned is made from its folder part by part
    # as it is written, once the matching's copies are freed; else it is in memory)
    moved = Moved(Path(args.b), al.b, transform, stamp, args.allow_pickle,
                  fill_from=Path(args.a)) if hand_over else None
    aligned = None if hand_over else al.aligned.to(torch.float32)
    del al, a, b  # (released before OUT is written and read back for the certificate)
    release_memory()
    parts = None
    if moved is not None:  # (a narrower B is embedded into A's widths whole)
        skeleton = moved.skeleton()
        aligned, parts = (moved.whole(), None) if skeleton is None else (skeleton, moved)
    clock = phase(phases, "match", clock)
    # (release: the written model is dropped as it is written, before the temporary folder
    # is certified, so that it is not in memory beside its read-back copy; OUT takes its
    # name only then)
    report = save_certified(aligned, args.out, report, reference, transform=transform,
                            force=args.force, stock=not args.no_stock, release=True,
                            started=t0, phases=phases, parts=parts)
    drop_checkpoint(args)
    print_warnings(report.get("warnings", []))
    ok = report["certificate"]["equal"]
    if args.json:
        emit_json(report)
    else:
        print("\n".join(lines))
        print(f"wrote {args.out} ({report['format']}); aligned B vs B: max |Δ logits| = "
              f"{report['certificate']['max_abs_diff']:.3e} ({'ok' if ok else 'MISMATCH'})")
        print_notes(report)
    return 0 if ok else 1
