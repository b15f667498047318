"""The training loop: AdamW with warm-up and cosine decay, validation, checkpoints, resumption.

A run is a pure function of its :class:`~glmc.training.config.TrainConfig` (on CPU, with the same
thread count): the model is initialised from ``torch.manual_seed(seed)``, batches come from a
``torch.Generator`` seeded with ``seed``, and a resumed run restores every piece of state the next
step reads, so it ends with bit-identical weights.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from torch import nn
from torch.optim import AdamW
from torch.optim.lr_scheduler import LambdaLR

from glmc.data import DATASETS, Dataset, TextDataset, save_tokenizer
from glmc.errors import GlmcError
from glmc.families import arch_named
from glmc.families.base import Arch
from glmc.io.atomic import atomic_dir, atomic_path
from glmc.io.folders import TRAIN_FILE
from glmc.io.outputs import (
    BYTES_PER_PARAM,
    check_free_space,
    check_output,
    model_bytes,
    output_errors,
)
from glmc.training.checkpoint import (
    checkpoint_path,
    checkpoint_step,
    load_checkpoint,
    remove_checkpoint,
    save_checkpoint,
)
from glmc.training.config import (
    TrainConfig,
    check_fits,
    data_summary,
    load_training_data,
    model_config,
)

RECORD_FORMAT = 1

StepCallback = Callable[[int, float], None]


class TrainingStopped(KeyboardInterrupt):
    """A run stopped before its end (Ctrl-C, or ``stop_after`` in tests).

    ``step``: the step the checkpoint ``checkpoint`` holds (both None: none was written).
    """

    def __init__(self, message: str, step: int | None = None,
                 checkpoint: Path | None = None) -> None:
        super().__init__(message)
        self.step, self.checkpoint = step, checkpoint


# -- model, optimiser, schedule -----------------------------------------------------------------


def lr_factor(update: int, warmup: int, total: int) -> float:
    """Multiplier of the peak learning rate for update ``update`` (0-based).

    Linear warm-up ``1/warmup, 2/warmup, ..., 1``, then a half cosine from 1 towards 0 over the
    remaining ``total - warmup`` updates (the last update still has a small positive rate).
    """
    if update < warmup:
        return (update + 1) / warmup
    progress = (update - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> tuple[AdamW, LambdaLR]:
    """AdamW (decay on matrices, embeddings and the patch kernel; none on biases and norms)
    and its warm-up + cosine LambdaLR schedule."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    plain = [p for p in model.parameters() if p.ndim < 2]
    opt = AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay},
         {"params": plain, "weight_decay": 0.0}],
        lr=cfg.lr,
    )
    warmup, total = cfg.warmup_steps, cfg.steps
    return opt, LambdaLR(opt, lambda update: lr_factor(update, warmup, total))


# -- data ---------------------------------------------------------------------------------------


class BatchStream:
    """Training batches from ``ds.batches`` whose position can be saved and restored exactly.

    Image batches are drawn epoch by epoch from one permutation per epoch, so the generator state
    alone does not say where the stream is. The stream keeps the generator state from before the
    current epoch's first draw plus the number of batches served since; restoring replays at most
    one epoch of index arithmetic. Text batches are independent draws (an "epoch" of one batch).
    """

    def __init__(self, ds: Dataset, cfg: TrainConfig, generator: torch.Generator) -> None:
        self.ds, self.cfg, self.generator = ds, cfg, generator
        if isinstance(ds, TextDataset):
            self.per_epoch = 1
        else:
            self.per_epoch = max(1, ds.split("train")[1].numel() // cfg.batch_size)
        self.epoch_state = generator.get_state()
        self.offset = 0
        self._skip = 0
        self._it: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None

    def _iterator(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        context = self.cfg.context if isinstance(self.ds, TextDataset) else None
        return self.ds.batches("train", self.cfg.batch_size, context, self.generator)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``(x, y)`` training batch."""
        if self._it is None:
            self._it = self._iterator()
            for _ in range(self._skip):
                next(self._it)
            self._skip = 0
        if self.offset == self.per_epoch:  # the coming draw starts a new epoch
            self.offset = 0
            self.epoch_state = self.generator.get_state()
        batch = next(self._it)
        self.offset += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch_state": self.epoch_state.clone(), "offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch_state = state["epoch_state"].clone()
        self.offset = self._skip = int(state["offset"])
        self.generator.set_state(self.epoch_state)
        self._it = None


@torch.no_grad()
def evaluate(
    model: nn.Module, ds: Dataset, cfg: TrainConfig, split: str, max_batches: int | None = None
) -> dict[str, float]:
    """Mean cross-entropy and accuracy (next-token accuracy for text) over ``split``.

    Uses the ordered ``ds.eval_batches`` pass with ``cfg.batch_size`` rows per batch, stopping
    after ``max_batches`` batches (``None``: the whole split); means are per token / image.
    """
    arch = arch_named(cfg.arch)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    context = cfg.context if isinstance(ds, TextDataset) else None
    loss_sum, correct, count = 0.0, 0, 0
    for i, (x, y) in enumerate(ds.eval_batches(split, cfg.batch_size, context)):
        if max_batches is not None and i >= max_batches:
            break
        logits = arch.logits(model, x.to(device))
        flat, target = logits.reshape(-1, logits.shape[-1]).float(), y.to(device).reshape(-1)
        loss_sum += float(F.cross_entropy(flat, target, reduction="sum"))
        correct += int((flat.argmax(-1) == target).sum())
        count += target.numel()
    model.train(was_training)
    if count == 0:
        raise GlmcError(f"dataset '{ds.name}': the {split} split is empty")
    return {"loss": loss_sum / count, "accuracy": correct / count}


# -- the run ------------------------------------------------------------------------------------


def train(
    cfg: TrainConfig,
    out_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    on_step: StepCallback | None = None,
    stop_after: int | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Train ``cfg`` and write the model folder ``out_dir``; return the training record.

    ``out_dir`` receives ``config.json`` + ``model.safetensors`` (loadable with
    ``from_pretrained``), ``glmc_tokenizer.json`` for text, and ``glmc_train.json`` (the record
    returned here: config, data summary, model size, and the log of train/val losses, final test
    metrics and timings). While training, checkpoints go to ``.<name>.ckpt/`` beside
    ``out_dir``; they are removed once ``out_dir`` is complete. Ctrl-C (SIGINT) is held until
    the step under way completes; then that step is checkpointed and :class:`TrainingStopped`
    says where (a second Ctrl-C stops at once, and the last checkpoint stands).

    Args:
        cfg: the run.
        out_dir: the output model folder; an existing non-empty one needs ``force``.
        resume: continue from ``out_dir``'s checkpoint (same config required); with no
            checkpoint, return the finished run's record if ``out_dir`` holds this run, else
            start from step 0. A resume is announced on stderr.
        progress: show a rich progress bar on stderr.
        on_step: called as ``on_step(step, train_loss)`` after every step (and its checkpoint).
        stop_after: stop as Ctrl-C would, right after this step (tests).
        force: replace an existing ``out_dir``, and without ``resume`` discard a checkpoint
            (which is otherwise refused, lest a rerun silently throw it away).

    Raises:
        GlmcError: bad options, an occupied or unwritable output, unsuitable data, a
            mismatched checkpoint, or a diverged run; every check happens before the first
            step.
        TrainingStopped: the run was interrupted (see above).
    """
    cfg.validate()
    out = Path(out_dir).expanduser().absolute()  # "-o ." must still name a folder
    ckpt = checkpoint_path(out)
    if resume and not ckpt.is_file():
        done = _finished_record(out, cfg)
        if done is not None:
            _notice(f"{out} already holds this finished run; nothing to resume")
            return done
    elif ckpt.is_file() and not resume and not force:
        step = checkpoint_step(ckpt)
        raise GlmcError(f"there is a checkpoint at step {'?' if step is None else step} at "
                        f"{ckpt}; pass --resume to continue it, or --force to start over and "
                        "discard it")
    named = cfg.data.lower() in DATASETS  # (a name, not a path, even where a file has it)
    check_output(out, force=force, inputs=() if named else (cfg.data,))
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise GlmcError("--device cuda requested but CUDA is not available")
    previous = torch.get_num_threads()
    torch.set_num_threads(cfg.num_threads)
    forked = [device.index or 0] if device.type == "cuda" else []
    try:
        # fork_rng: an in-process caller's global RNG is the same before and after.
        with torch.random.fork_rng(devices=forked):
            return _run(cfg, out, device, resume, progress, on_step, stop_after)
    finally:
        torch.set_num_threads(previous)


def _run(
    cfg: TrainConfig, out: Path, device: torch.device, resume: bool, progress: bool,
    on_step: StepCallback | None, stop_after: int | None,
) -> dict[str, Any]:
    ds = load_training_data(cfg)
    arch, config = model_config(cfg, ds)
    check_free_space(out, _output_bytes(arch, config), out)
    summary = data_summary(ds)
    ckpt_file = checkpoint_path(out)
    state = None
    if resume and ckpt_file.is_file():
        state = load_checkpoint(ckpt_file)
        _check_resumable(state, cfg, ds, summary, ckpt_file)
    else:
        if resume and progress:  # (quiet callers, like the demo's cache, resume by default)
            _notice(f"no checkpoint at {ckpt_file}; starting from step 0")
        remove_checkpoint(out)  # (with --force: start over; the old run is discarded)
    run = _Session(cfg, arch, config, ds, device, ckpt_file, summary)
    if state is not None:
        run.restore(state)
        _notice(f"resuming {out} from step {run.step}")
    try:
        with _ProgressBar(progress, cfg.steps, run.step, run.log) as bar, _HeldInterrupt() as sig:
            while run.step < cfg.steps:
                value = run.advance()
                bar.update(run.step, value, run.log)
                if on_step is not None:
                    on_step(run.step, value)
                if sig.requested or (stop_after is not None and run.step >= stop_after):
                    raise KeyboardInterrupt
        record = run.finish(out)
    except KeyboardInterrupt:
        raise run.stopped() from None
    remove_checkpoint(out)
    return record


def _output_bytes(arch: Arch, config: Any) -> int:
    """The model folder, and a checkpoint (weights + AdamW's two moments) in flight."""
    with torch.device("meta"):
        n = sum(p.numel() for p in arch.build(config).parameters())
    return model_bytes(n) + 3 * BYTES_PER_PARAM * n


class _Session:
    """One run's state (model, optimiser, schedule, data stream, log) and its checkpoints."""

    def __init__(self, cfg: TrainConfig, arch: Arch, config: Any, ds: Dataset,
                 device: torch.device, ckpt_file: Path, summary: dict[str, Any]) -> None:
        self.cfg, self.arch, self.config, self.ds, self.device = cfg, arch, config, ds, device
        self.ckpt_file, self.summary = ckpt_file, summary
        torch.manual_seed(cfg.seed)
        self.model = arch.build(config).to(device)
        self.model.train()
        self.opt, self.sched = make_optimizer(self.model, cfg)
        self.stream = BatchStream(ds, cfg, torch.Generator().manual_seed(cfg.seed))
        self.log: dict[str, Any] = {
            "steps": 0, "train": [], "val": [], "test": None, "resumed_at": [],
            "wall_time_s": 0.0, "step_time_s": 0.0, "steps_per_s": None,
        }
        self.step, self.pending = 0, []
        self.saved: int | None = None  # the step the checkpoint on disk holds
        self.in_step = False  # True while the state is between two steps (inconsistent)
        self.base_wall, self.started = 0.0, time.perf_counter()

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint (see :func:`load_checkpoint`)."""
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.stream.load_state_dict(state["stream"])
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and "cuda_rng" in state:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.log, self.step = state["log"], int(state["step"])
        self.pending, self.saved = list(state["pending"]), self.step
        self.log["resumed_at"].append(self.step)
        self.base_wall, self.started = self.log["wall_time_s"], time.perf_counter()

    def checkpoint(self) -> None:
        """Write everything the next step depends on (atomically)."""
        self.log["wall_time_s"] = self.base_wall + time.perf_counter() - self.started
        payload = {
            "config": json.dumps(self.cfg.to_json()), "data": json.dumps(self.summary),
            "model_config": json.dumps(self.arch.config_to_json(self.config)),
            "log": json.dumps(self.log),
            "step": self.step, "pending": self.pending, "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
            "stream": self.stream.state_dict(), "torch_rng": torch.get_rng_state(),
        }
        if self.device.type == "cuda":
            payload["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        with output_errors(self.ckpt_file):
            save_checkpoint(self.ckpt_file, payload)
        self.saved = self.step

    def advance(self) -> float:
        """One optimiser step with its logging, validation and periodic checkpoint; returns
        the training loss."""
        cfg, log = self.cfg, self.log
        self.in_step = True
        t0 = time.perf_counter()
        x, y = self.stream.next()
        x, y = x.to(self.device), y.to(self.device)
        logits = self.arch.logits(self.model, x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        lr = self.opt.param_groups[0]["lr"]
        self.opt.step()
        self.sched.step()
        self.step += 1
        step, value = self.step, loss.item()
        log["step_time_s"] += time.perf_counter() - t0
        if not math.isfinite(value):
            raise GlmcError(f"training diverged: loss {value} at step {step} (lower --lr "
                            "or raise --warmup)")
        self.pending.append(value)
        if step % cfg.log_every == 0 or step == cfg.steps:
            log["train"].append({"step": step, "loss": sum(self.pending) / len(self.pending),
                                 "lr": lr})
            self.pending = []
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            log["val"].append({"step": step, **evaluate(self.model, self.ds, cfg, "val",
                                                        cfg.eval_batches)})
        log["steps"] = step
        self.in_step = False
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps:
            self.checkpoint()
        return value

    def finish(self, out: Path) -> dict[str, Any]:
        """Test, and write the model folder with its tokenizer and record; the record."""
        cfg, log, ds = self.cfg, self.log, self.ds
        log["test"] = evaluate(self.model, ds, cfg, "test")
        log["wall_time_s"] = self.base_wall + time.perf_counter() - self.started
        log["steps_per_s"] = self.step / log["step_time_s"] if log["step_time_s"] > 0 else None
        log["threads"], log["device"] = cfg.num_threads, str(self.device)  # of the last segment
        record = _record(cfg, self.summary, self.model, log)
        with output_errors(out), atomic_dir(out) as tmp:
            with _hf_progress_bars(False):
                self.arch.save(self.model, self.config, tmp)
            if isinstance(ds, TextDataset):
                save_tokenizer(tmp, ds.tokenizer)
            with atomic_path(tmp / TRAIN_FILE) as f:
                f.write_text(json.dumps(record, indent=2) + "\n")
        return record

    def stopped(self) -> TrainingStopped:
        """The run stops: checkpoint the last completed step (unless the interrupt came in
        the middle of one, or it is saved already) and say which step the checkpoint holds."""
        if not self.in_step and self.saved != self.step:
            self.checkpoint()
        total, file = self.cfg.steps, self.ckpt_file
        if self.saved is None:
            return TrainingStopped(f"interrupted during step {self.step + 1} of {total}; no "
                                   "checkpoint was written")
        where = (f"after step {self.step} of {total}; checkpoint at {file}"
                 if self.saved == self.step else
                 f"during step {self.step + 1} of {total}; the checkpoint at {file} holds step "
                 f"{self.saved}")
        return TrainingStopped(f"interrupted {where}", self.saved, file)


class _HeldInterrupt(contextlib.AbstractContextManager):
    """Hold a Ctrl-C (SIGINT) until the step under way completes (``requested``); a second
    one interrupts at once. Only in the main thread, and only over Python's default handler."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> _HeldInterrupt:
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


# -- helpers ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Switch transformers' tqdm bars (e.g. "Writing model shards") on or off, then restore."""
    hf_logging = transformers.utils.logging
    before = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()


_START_OVER = "pass --force without --resume to start over, discarding the checkpoint"


def _notice(msg: str) -> None:
    print(f"glmc train: {msg}", file=sys.stderr)


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    keys = [k for k in new if old.get(k) != new[k]]
    return ", ".join(f"{k}={old.get(k)!r} (requested {new[k]!r})" for k in keys)


def _check_resumable(
    state: dict[str, Any], cfg: TrainConfig, ds: Dataset, summary: dict[str, Any], where: Path
) -> None:
    """The checkpoint must be of this config and this data."""
    old = TrainConfig.from_json(state["config"], str(where)).identity()
    if old != cfg.identity():
        raise GlmcError(f"cannot resume: {where} was made with {_differences(old, cfg.identity())}"
                        f"; {_START_OVER}")
    arch = arch_named(cfg.arch)
    check_fits(arch, arch.config_from_json(state["model_config"]), ds, cfg)
    if state["data"] != summary:
        diff = [k for k in summary if state["data"].get(k) != summary[k]]
        raise GlmcError(f"cannot resume: the data '{cfg.data}' differ from those of {where} "
                        f"({', '.join(diff)} changed); {_START_OVER}")


def _finished_record(out: Path, cfg: TrainConfig) -> dict[str, Any] | None:
    """The record of a finished run in ``out`` if it is ``cfg``'s run; error if another run's."""
    path = out / TRAIN_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        old = TrainConfig.from_json(record["config"], str(path)).identity()
    except (ValueError, KeyError, TypeError) as e:
        raise GlmcError(f"{path}: not a glmc training record ({e})") from None
    if old != cfg.identity():
        raise GlmcError(f"cannot resume: {out} holds a finished run with "
                        f"{_differences(old, cfg.identity())}; choose another -o, or pass "
                        "--force without --resume to replace it")
    return record


def _record(cfg: TrainConfig, summary: dict[str, Any], model: nn.Module,
            log: dict[str, Any]) -> dict[str, Any]:
    try:
        glmc_version = metadata.version("glmc")
    except metadata.PackageNotFoundError:
        glmc_version = None
    return {
        "format": RECORD_FORMAT,
        "arch": cfg.arch,
        "data": cfg.data,
        "seed": cfg.seed,
        "data_seed": cfg.data_seed,
        "config": cfg.to_json(),
        "dataset": summary,
        "model": {"class": type(model).__name__,
                  "n_params": sum(p.numel() for p in model.parameters())},
        "log": log,
        "versions": {"glmc": glmc_version, "torch": torch.__version__,
                     "transformers": transformers.__version__},
    }


class _ProgressBar(contextlib.AbstractContextManager):
    """A rich bar on stderr with step, train loss and the last validation loss (or nothing)."""

    def __init__(self, enabled: bool, total: int, start: int, log: dict[str, Any]) -> None:
        self.progress = None
        if enabled:
            self.progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}  val {task.fields[val]}"),
                TimeElapsedColumn(), TimeRemainingColumn(),
                console=Console(stderr=True),
            )
            self.task = self.progress.add_task("train", total=total, completed=start,
                                               loss="-", val=_last_val(log))

    def __enter__(self) -> _ProgressBar:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, step: int, loss: float, log: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step, loss=f"{loss:.4f}",
                                 val=_last_val(log))


def _last_val(log: dict[str, Any]) -> str:
    return f"{log['val'][-1]['loss']:.4f}" if log["val"] else "-"
