"""The training loop: AdamW with warm-up and cosine decay, validation, checkpoints, resumption.

A run is a pure function of its :class:`~glmc.training.config.TrainConfig` (on CPU, with the same
thread count): the model is initialised from ``torch.manual_seed(seed)``, batches come from a
``torch.Generator`` seeded with ``seed``, and a resumed run restores every piece of state the next
step reads, so it ends with bit-identical weights.

Here: :func:`train` (checks, then the run) and the run's state, :class:`_Session`. Beside it:
:mod:`~glmc.training.optim` (AdamW and its schedule), :mod:`~glmc.training.batches` (the
resumable batch stream, :func:`evaluate`), :mod:`~glmc.training.checkpoint`,
:mod:`~glmc.training.record` (``glmc_train.json`` and the resume checks) and
:mod:`~glmc.training.console` (notices, the progress bar, Ctrl-C).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from glmc.data import Dataset, TextDataset, save_tokenizer
from glmc.errors import GlmcError
from glmc.families.base import Arch
from glmc.io.atomic import atomic_dir, atomic_path
from glmc.io.folders import TRAIN_FILE
from glmc.io.outputs import BYTES_PER_PARAM, check_free_space, model_bytes, output_errors
from glmc.tasks import TASKS
from glmc.threads import num_threads
from glmc.training.batches import BatchStream, evaluate
from glmc.training.checkpoint import (
    checkpoint_path,
    checkpoint_step,
    load_checkpoint,
    remove_checkpoint,
    save_checkpoint,
)
from glmc.training.config import TrainConfig, data_summary, load_training_data, model_config
from glmc.training.console import (
    HeldInterrupt,
    ProgressBar,
    SecondInterrupt,
    hf_progress_bars,
    notice,
)
from glmc.training.optim import lr_factor, make_optimizer
from glmc.training.options import check_train_output
from glmc.training.record import check_resumable, finished_record, training_record

__all__ = ["TRAIN_FILE", "TrainingStopped", "evaluate", "lr_factor", "train"]

StepCallback = Callable[[int, float], None]


class TrainingStopped(KeyboardInterrupt):
    """A run stopped before its end (Ctrl-C, or ``stop_after`` in tests).

    ``step``: the step the checkpoint ``checkpoint`` holds (both None: none was written).
    """

    def __init__(self, message: str, step: int | None = None,
                 checkpoint: Path | None = None) -> None:
        super().__init__(message)
        self.step, self.checkpoint = step, checkpoint


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
    if resume and (done := _finished_run(out, cfg)) is not None:
        return done
    if not (resume or force):
        _refuse_to_discard_checkpoint(out)
    check_train_output(out, cfg, force)
    device = _device(cfg)
    with num_threads(cfg.num_threads), _forked_rng(device):
        return _run(cfg, out, device, resume, progress, on_step, stop_after)


def _run(
    cfg: TrainConfig, out: Path, device: torch.device, resume: bool, progress: bool,
    on_step: StepCallback | None, stop_after: int | None,
) -> dict[str, Any]:
    """Load the data, start (or resume) the session, step it to the end, write ``out``."""
    ds = load_training_data(cfg)
    arch, config = model_config(cfg, ds)
    ds = TASKS[arch.task].view(config, ds)  # (masked, for a masked LM)
    check_free_space(out, _output_bytes(arch, config), out)
    summary = data_summary(ds)
    state = _checkpoint_to_resume(out, cfg, ds, summary, resume, progress)
    run = _Session(cfg, arch, config, ds, device, checkpoint_path(out), summary)
    if state is not None:
        run.restore(state)
        notice(f"resuming {out} from step {run.step}")
    with HeldInterrupt() as sig:
        try:
            _step_to_the_end(run, sig, progress, on_step, stop_after)
            record = run.finish(out)
        except SecondInterrupt:  # (at once: the last checkpoint stands)
            raise run.stopped(save=False) from None
        except KeyboardInterrupt:
            raise run.stopped() from None
    remove_checkpoint(out)
    return record


def _step_to_the_end(run: _Session, sig: HeldInterrupt, progress: bool,
                     on_step: StepCallback | None, stop_after: int | None) -> None:
    """Advance ``run`` to its last step under a progress bar; a held Ctrl-C, or ``stop_after``,
    raises KeyboardInterrupt between two steps."""
    steps = run.cfg.steps
    with ProgressBar(progress, steps, run.step, run.log) as bar, sig.held():
        while run.step < steps:
            loss = run.advance()
            bar.update(run.step, loss, run.log)
            if on_step is not None:
                on_step(run.step, loss)
            if sig.requested or (stop_after is not None and run.step >= stop_after):
                raise KeyboardInterrupt


# -- the checks before a run --------------------------------------------------------------------


def _finished_run(out: Path, cfg: TrainConfig) -> dict[str, Any] | None:
    """With no checkpoint to resume: the record of ``cfg``'s finished run in ``out`` (announced),
    if it holds one."""
    if checkpoint_path(out).is_file():
        return None
    done = finished_record(out, cfg)
    if done is not None:
        notice(f"{out} already holds this finished run; nothing to resume")
    return done


def _refuse_to_discard_checkpoint(out: Path) -> None:
    """A run started over (without --resume or --force) must not silently discard a checkpoint."""
    ckpt = checkpoint_path(out)
    if ckpt.is_file():
        step = checkpoint_step(ckpt)
        raise GlmcError(f"there is a checkpoint at step {'?' if step is None else step} at "
                        f"{ckpt}; pass --resume to continue it, or --force to start over and "
                        "discard it")


def _device(cfg: TrainConfig) -> torch.device:
    """The run's device (CUDA only where it is available)."""
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise GlmcError("--device cuda requested but CUDA is not available")
    return device


def _forked_rng(device: torch.device) -> contextlib.AbstractContextManager:
    """Fork torch's global RNGs (CPU, and ``device``'s if CUDA): an in-process caller's RNG is
    the same before and after the run."""
    return torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else [])


def _output_bytes(arch: Arch, config: Any) -> int:
    """The model folder, and a checkpoint (weights + AdamW's two moments) in flight."""
    with torch.device("meta"):
        n = sum(p.numel() for p in arch.build(config).parameters())
    return model_bytes(n) + 3 * BYTES_PER_PARAM * n


def _checkpoint_to_resume(out: Path, cfg: TrainConfig, ds: Dataset, summary: dict[str, Any],
                          resume: bool, announce: bool) -> dict[str, Any] | None:
    """With ``resume``, ``out``'s checkpoint if there is one (checked to be this run's); else
    none, and any checkpoint is removed (a run started over with --force discards it)."""
    ckpt_file = checkpoint_path(out)
    if resume and ckpt_file.is_file():
        state = load_checkpoint(ckpt_file)
        check_resumable(state, cfg, ds, summary, ckpt_file)
        return state
    if resume and announce:  # (quiet callers, like the demo's cache, resume by default)
        notice(f"no checkpoint at {ckpt_file}; starting from step 0")
    remove_checkpoint(out)
    return None


# -- the session --------------------------------------------------------------------------------


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
        self.log = _new_log()
        self.step, self.pending = 0, []  # pending: the training losses not yet logged
        self.saved: int | None = None  # the step the checkpoint on disk holds
        self.in_step = False  # True while the state is between two steps (inconsistent)
        self.base_wall, self.started = 0.0, time.perf_counter()

    # -- checkpoints

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint (see :func:`load_checkpoint`)."""
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.stream.load_state_dict(state["stream"])
        _set_rng_state(state, self.device)
        self.log, self.step = state["log"], int(state["step"])
        self.pending, self.saved = list(state["pending"]), self.step
        self.log["resumed_at"].append(self.step)
        self.base_wall, self.started = self.log["wall_time_s"], time.perf_counter()

    def checkpoint(self) -> None:
        """Write everything the next step depends on (atomically)."""
        self.log["wall_time_s"] = self._wall_time()
        state = self._state()
        with output_errors(self.ckpt_file):
            save_checkpoint(self.ckpt_file, state)
        self.saved = self.step

    def _state(self) -> dict[str, Any]:
        """What :meth:`restore` reads back: configs and log as JSON, the rest as tensors."""
        return {
            "config": json.dumps(self.cfg.to_json()), "data": json.dumps(self.summary),
            "model_config": json.dumps(self.arch.config_to_json(self.config)),
            "log": json.dumps(self.log),
            "step": self.step, "pending": self.pending, "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
            "stream": self.stream.state_dict(), **_rng_state(self.device),
        }

    def _wall_time(self) -> float:
        """Seconds of this run so far, over all its segments."""
        return self.base_wall + time.perf_counter() - self.started

    # -- a step

    def advance(self) -> float:
        """One optimiser step with its logging, validation and periodic checkpoint; returns
        the training loss."""
        self.in_step = True
        lr, loss = self._update()
        self.step += 1
        _check_finite(loss, self.step)
        self._log_step(lr, loss)
        self.in_step = False
        if _every(self.step, self.cfg.checkpoint_every) and self.step < self.cfg.steps:
            self.checkpoint()
        return loss

    def _update(self) -> tuple[float, float]:
        """One clipped AdamW update on the next batch at the scheduled rate; that rate and the
        batch's loss (the time it took goes to the log)."""
        t0 = time.perf_counter()
        loss = self._batch_loss()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        lr = self.opt.param_groups[0]["lr"]
        self.opt.step()
        self.sched.step()
        value = loss.item()
        self.log["step_time_s"] += time.perf_counter() - t0
        return lr, value

    def _batch_loss(self) -> torch.Tensor:
        """The mean cross-entropy of the model on the stream's next batch."""
        x, y = (t.to(self.device) for t in self.stream.next())
        logits = self.arch.logits(self.model, x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def _log_step(self, lr: float, loss: float) -> None:
        """Log the mean training loss every ``log_every`` steps and the validation metrics every
        ``eval_every`` steps (both at the last step)."""
        cfg, log, step = self.cfg, self.log, self.step
        last = step == cfg.steps
        self.pending.append(loss)
        if _every(step, cfg.log_every) or last:
            mean = sum(self.pending) / len(self.pending)
            log["train"].append({"step": step, "loss": mean, "lr": lr})
            self.pending = []
        if _every(step, cfg.eval_every) or last:
            log["val"].append({"step": step, **evaluate(self.model, self.ds, cfg, "val",
                                                        cfg.eval_batches)})
        log["steps"] = step

    # -- the end

    def finish(self, out: Path) -> dict[str, Any]:
        """Test, and write the model folder with its tokenizer and record; the record."""
        self._close_log()
        record = training_record(self.cfg, self.summary, self.model, self.log)
        self._write(out, record)
        return record

    def _close_log(self) -> None:
        """The log's last entries: test metrics, times, and the last segment's threads and
        device."""
        log = self.log
        log["test"] = evaluate(self.model, self.ds, self.cfg, "test")
        log["wall_time_s"] = self._wall_time()
        log["steps_per_s"] = self.step / log["step_time_s"] if log["step_time_s"] > 0 else None
        log["threads"], log["device"] = self.cfg.num_threads, str(self.device)

    def _write(self, out: Path, record: dict[str, Any]) -> None:
        """Write the model folder ``out`` (atomically): the model, the tokenizer for text, and
        ``record``."""
        with output_errors(out), atomic_dir(out) as tmp:
            with hf_progress_bars(False):
                self.arch.save(self.model, self.config, tmp)
            if isinstance(self.ds, TextDataset):
                save_tokenizer(tmp, self.ds.tokenizer)
            with atomic_path(tmp / TRAIN_FILE) as f:
                f.write_text(json.dumps(record, indent=2) + "\n")

    def stopped(self, save: bool = True) -> TrainingStopped:
        """The run stops: with ``save``, checkpoint the last completed step (unless the
        interrupt came in the middle of one, or it is saved already; a second Ctrl-C stops
        that write at once) and say which step the checkpoint holds."""
        if save and not self.in_step and self.saved != self.step:
            with contextlib.suppress(SecondInterrupt):  # (the previous checkpoint stands)
                self.checkpoint()
        file = None if self.saved is None else self.ckpt_file
        return TrainingStopped(f"interrupted {self._where_stopped()}", self.saved, file)

    def _where_stopped(self) -> str:
        """Where the run stopped, and what the checkpoint holds."""
        total, file = self.cfg.steps, self.ckpt_file
        if self.saved == self.step and not self.in_step:
            return f"after step {self.step} of {total}; checkpoint at {file}"
        where = (f"during step {self.step + 1} of {total}" if self.in_step else
                 f"after step {self.step} of {total}, before its checkpoint")
        if self.saved is None:
            return f"{where}; no checkpoint was written"
        return f"{where}; the checkpoint at {file} holds step {self.saved}"


def _new_log() -> dict[str, Any]:
    """The log of a run not yet started (what ``glmc_train.json`` records under "log")."""
    return {
        "steps": 0, "train": [], "val": [], "test": None, "resumed_at": [],
        "wall_time_s": 0.0, "step_time_s": 0.0, "steps_per_s": None,
    }


def _every(step: int, period: int) -> bool:
    """Whether ``step`` falls on a multiple of ``period`` (0: never)."""
    return period > 0 and step % period == 0


def _check_finite(loss: float, step: int) -> None:
    if not math.isfinite(loss):
        raise GlmcError(f"training diverged: loss {loss} at step {step} (lower --lr "
                        "or raise --warmup)")


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The global RNG states a step may read: torch's, and ``device``'s if it is CUDA."""
    state = {"torch_rng": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore what :func:`_rng_state` saved."""
    torch.set_rng_state(state["torch_rng"])
    if device.type == "cuda" and "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"], device)
